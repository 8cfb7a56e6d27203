package rdma

import (
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// span is the address range [addr, addr+n) of one registration.
type span struct{ addr, n uintptr }

func (s span) contains(addr, n uintptr) bool {
	return addr >= s.addr && addr+n <= s.addr+s.n
}

func (s span) overlaps(addr, n uintptr) bool {
	return addr < s.addr+s.n && s.addr < addr+n
}

// RegCache caches memory registrations by address range, so that a buffer
// used by many operations is registered (ibv_reg_mr, which pins pages and is
// slow) once. A lookup is served by any cached registration that covers the
// requested range. At most Size registrations are kept; the least recently
// used one is released when the bound is exceeded, but only once no Handle
// for it is outstanding.
//
// RegCache knows nothing of verbs: reg and dereg are supplied by the caller
// (PD.NewRegCache in an rdma build), which is what lets it be tested without
// hardware. A RegCache is safe for concurrent use.
type RegCache[V any] struct {
	mu      sync.Mutex
	lru     *simplelru.LRU[span, *regEntry[V]]
	reg     func(addr, n uintptr) (V, error)
	dereg   func(V) error
	closed  bool
	deregEr error // first deregistration error, reported by Close
}

type regEntry[V any] struct {
	key     span
	val     V
	refs    int
	evicted bool
}

// Handle is one use of a cached registration. Release it when the operation
// that uses the memory has completed.
type Handle[V any] struct {
	c    *RegCache[V]
	e    *regEntry[V]
	once sync.Once
}

// Value is the registration (for verbs, the *MR with its lkey/rkey).
func (h *Handle[V]) Value() V { return h.e.val }

// Release ends this use. It is idempotent.
func (h *Handle[V]) Release() {
	h.once.Do(func() {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		h.e.refs--
		if h.e.refs == 0 && h.e.evicted {
			h.c.deregLocked(h.e)
		}
	})
}

// NewRegCache returns a cache of at most size registrations made by reg and
// undone by dereg.
func NewRegCache[V any](size int, reg func(addr, n uintptr) (V, error), dereg func(V) error) (*RegCache[V], error) {
	if size < 1 {
		return nil, fmt.Errorf("hw/rdma: registration cache size %d < 1", size)
	}
	c := &RegCache[V]{reg: reg, dereg: dereg}
	l, err := simplelru.NewLRU[span, *regEntry[V]](size, func(_ span, e *regEntry[V]) {
		e.evicted = true
		if e.refs == 0 {
			c.deregLocked(e)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("hw/rdma: %w", err)
	}
	c.lru = l
	return c, nil
}

func (c *RegCache[V]) deregLocked(e *regEntry[V]) {
	if err := c.dereg(e.val); err != nil && c.deregEr == nil {
		c.deregEr = err
	}
}

// Acquire returns a registration covering [addr, addr+n), registering the
// range if no cached one covers it.
func (c *RegCache[V]) Acquire(addr, n uintptr) (*Handle[V], error) {
	if n == 0 {
		return nil, errors.New("hw/rdma: cannot register an empty range")
	}
	if addr+n < addr {
		return nil, fmt.Errorf("hw/rdma: range %#x+%d overflows", addr, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("hw/rdma: registration cache is closed")
	}
	if e, ok := c.lru.Get(span{addr, n}); ok {
		e.refs++
		return &Handle[V]{c: c, e: e}, nil
	}
	// The cache is small (a few hundred entries), so a scan for a covering
	// range costs less than the syscall it saves.
	for _, k := range c.lru.Keys() {
		if k.contains(addr, n) {
			e, _ := c.lru.Get(k) // marks it recently used
			e.refs++
			return &Handle[V]{c: c, e: e}, nil
		}
	}
	v, err := c.reg(addr, n)
	if err != nil {
		return nil, err
	}
	e := &regEntry[V]{key: span{addr, n}, val: v, refs: 1}
	c.lru.Add(e.key, e)
	return &Handle[V]{c: c, e: e}, nil
}

// Invalidate drops every cached registration overlapping [addr, addr+n);
// call it before freeing or remapping that memory. Registrations still in
// use are released when their last Handle is.
func (c *RegCache[V]) Invalidate(addr, n uintptr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.lru.Keys() {
		if k.overlaps(addr, n) {
			c.lru.Remove(k) // runs the eviction callback
		}
	}
}

// Len is the number of cached registrations.
func (c *RegCache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Close releases every registration not in use (the rest go when their
// Handles are released) and returns the first deregistration error seen.
func (c *RegCache[V]) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.lru.Purge()
	return c.deregEr
}
