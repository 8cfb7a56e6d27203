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
// Made with a Lasting (NewLastingRegCache), a registration outlives its
// uses only while the Lasting vouches for its memory: Hold when it is made,
// Still before every reuse (a registration whose memory changed is dropped
// and made anew), Release when it is dropped. A registration Hold refuses
// lasts as long as it is in use. Without one (NewRegCache) every
// registration lasts until evicted or invalidated: for memory whose
// lifetime the caller controls.
//
// RegCache knows nothing of verbs: reg and dereg are supplied by the caller
// (PD.NewRegCache in an rdma build), which is what lets it be tested without
// hardware. A RegCache is safe for concurrent use.
type RegCache[V any] struct {
	mu      sync.Mutex
	lru     *simplelru.LRU[span, *regEntry[V]]
	reg     func(addr, n uintptr) (V, error)
	dereg   func(V) error
	lasting Lasting // nil: every registration lasts unchecked
	closed  bool
	deregEr error // first deregistration error, reported by Close
	stats   RegStats
}

type regEntry[V any] struct {
	key     span
	val     V
	refs    int
	evicted bool
	held    Held // the Lasting's hold; nil for one use (or without a Lasting)
	once    bool // made for its uses only: dropped when the last ends
}

// Lasting decides whether registrations outlive their uses (Pages for host
// memory on Linux). Hold is called with the range of each new registration:
// ok false makes it last one use only. Implementations are safe for
// concurrent use.
type Lasting interface {
	Hold(addr, n uintptr) (h Held, ok bool)
}

// Held is a registration's hold on its memory. Still reports whether the
// memory still holds the pages it held when registered; Release gives the
// hold up (idempotent).
type Held interface {
	Still() bool
	Release()
}

// RegStats counts what a RegCache did: registrations made, uses served by
// an existing one, and registrations dropped because their memory changed.
type RegStats struct {
	Registered, Reused, Stale int64
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
		switch {
		case h.e.refs > 0:
		case h.e.evicted:
			h.c.deregLocked(h.e)
		case h.e.once:
			h.c.lru.Remove(h.e.key) // deregisters it
		}
	})
}

// NewRegCache returns a cache of at most size registrations made by reg and
// undone by dereg.
func NewRegCache[V any](size int, reg func(addr, n uintptr) (V, error), dereg func(V) error) (*RegCache[V], error) {
	return newRegCache(size, reg, dereg, nil)
}

// NewLastingRegCache is NewRegCache whose registrations outlive their uses
// as l allows.
func NewLastingRegCache[V any](size int, reg func(addr, n uintptr) (V, error), dereg func(V) error, l Lasting) (*RegCache[V], error) {
	if l == nil {
		return nil, errors.New("hw/rdma: NewLastingRegCache without a Lasting")
	}
	return newRegCache(size, reg, dereg, l)
}

func newRegCache[V any](size int, reg func(addr, n uintptr) (V, error), dereg func(V) error, l Lasting) (*RegCache[V], error) {
	if size < 1 {
		return nil, fmt.Errorf("hw/rdma: registration cache size %d < 1", size)
	}
	c := &RegCache[V]{reg: reg, dereg: dereg, lasting: l}
	l2, err := simplelru.NewLRU[span, *regEntry[V]](size, func(_ span, e *regEntry[V]) {
		e.evicted = true
		if e.refs == 0 {
			c.deregLocked(e)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("hw/rdma: %w", err)
	}
	c.lru = l2
	return c, nil
}

// deregLocked undoes the registration (an entry evicted with no use left),
// then gives up its hold: the pages stay locked until the NIC lets go.
func (c *RegCache[V]) deregLocked(e *regEntry[V]) {
	if err := c.dereg(e.val); err != nil && c.deregEr == nil {
		c.deregEr = err
	}
	if e.held != nil {
		e.held.Release()
	}
}

// usableLocked reports whether e may serve another use: with a Lasting,
// an idle entry's memory must still be what was registered (an entry in
// use is: its user keeps the memory). A stale one is dropped.
func (c *RegCache[V]) usableLocked(e *regEntry[V]) bool {
	if c.lasting == nil || e.refs > 0 || e.held == nil || e.held.Still() {
		return true
	}
	c.stats.Stale++
	c.lru.Remove(e.key) // deregisters it
	return false
}

// Acquire returns a registration covering [addr, addr+n), registering the
// range if no cached one covers it.
func (c *RegCache[V]) Acquire(addr, n uintptr) (*Handle[V], error) {
	return c.acquire(addr, n, true)
}

// AcquireOnce is Acquire for memory that is not used again (a temporary
// buffer): a registration it makes lasts while it is in use only.
func (c *RegCache[V]) AcquireOnce(addr, n uintptr) (*Handle[V], error) {
	return c.acquire(addr, n, false)
}

func (c *RegCache[V]) acquire(addr, n uintptr, keep bool) (*Handle[V], error) {
	if err := checkRange(addr, n); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("hw/rdma: registration cache is closed")
	}
	if e := c.coveringLocked(addr, n); e != nil {
		e.refs++
		c.stats.Reused++
		return &Handle[V]{c: c, e: e}, nil
	}
	v, err := c.regLocked(addr, n)
	if err != nil {
		return nil, err
	}
	e := &regEntry[V]{key: span{addr, n}, val: v, refs: 1}
	if c.lasting != nil && keep {
		e.held, _ = c.lasting.Hold(addr, n)
	}
	e.once = c.lasting != nil && e.held == nil || c.lasting == nil && !keep
	c.lru.Add(e.key, e)
	return &Handle[V]{c: c, e: e}, nil
}

// Keep registers [addr, addr+n) to outlive its uses, unless a cached
// registration covers it already: a whole buffer whose pieces an
// operation will Acquire, so that they share one registration (as
// ncclCommRegister does for a user buffer) where each would make its own.
// With a Lasting, the range is held first and nothing is registered when
// the hold is refused (the pieces then register per use, as they would
// have). It reports whether a kept registration covers the range.
func (c *RegCache[V]) Keep(addr, n uintptr) (bool, error) {
	if err := checkRange(addr, n); err != nil {
		return false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, errors.New("hw/rdma: registration cache is closed")
	}
	if e := c.coveringLocked(addr, n); e != nil {
		return !e.once, nil
	}
	var held Held
	if c.lasting != nil {
		var ok bool
		if held, ok = c.lasting.Hold(addr, n); !ok {
			return false, nil
		}
	}
	v, err := c.regLocked(addr, n)
	if err != nil {
		if held != nil {
			held.Release()
		}
		return false, err
	}
	e := &regEntry[V]{key: span{addr, n}, val: v, held: held}
	// Idle registrations of pieces of the range serve nothing the new one
	// does not: give them back (ones in use go when evicted).
	for _, k := range c.lru.Keys() {
		if p, ok := c.lru.Peek(k); ok && p.refs == 0 && e.key.contains(k.addr, k.n) {
			c.lru.Remove(k)
		}
	}
	c.lru.Add(e.key, e)
	return true, nil
}

func checkRange(addr, n uintptr) error {
	if n == 0 {
		return errors.New("hw/rdma: cannot register an empty range")
	}
	if addr+n < addr {
		return fmt.Errorf("hw/rdma: range %#x+%d overflows", addr, n)
	}
	return nil
}

// coveringLocked returns a usable cached registration covering
// [addr, addr+n), marked recently used, or nil; first, kept registrations
// that overlap the range without covering it and whose memory changed are
// dropped: their holds count pages a new hold shares, which are not what
// they counted any more.
func (c *RegCache[V]) coveringLocked(addr, n uintptr) *regEntry[V] {
	if e, ok := c.lru.Get(span{addr, n}); ok && c.usableLocked(e) {
		return e
	}
	// The cache is small (a few hundred entries), so a scan for a covering
	// range costs less than the syscall it saves.
	for _, k := range c.lru.Keys() {
		if k.contains(addr, n) {
			e, _ := c.lru.Get(k) // marks it recently used
			if c.usableLocked(e) {
				return e
			}
		}
	}
	if c.lasting != nil {
		for _, k := range c.lru.Keys() {
			if e, ok := c.lru.Peek(k); ok && k.overlaps(addr, n) {
				c.usableLocked(e)
			}
		}
	}
	return nil
}

// regLocked registers [addr, addr+n) and counts it.
func (c *RegCache[V]) regLocked(addr, n uintptr) (V, error) {
	v, err := c.reg(addr, n)
	if err != nil && c.lasting != nil && c.purgeIdleLocked() {
		// Kept registrations count against the pinned-memory limit
		// (RLIMIT_MEMLOCK): give the idle ones back and try once more.
		v, err = c.reg(addr, n)
	}
	if err == nil {
		c.stats.Registered++
	}
	return v, err
}

// purgeIdleLocked drops every registration not in use; it reports whether
// there was one.
func (c *RegCache[V]) purgeIdleLocked() bool {
	idle := false
	for _, k := range c.lru.Keys() {
		if e, ok := c.lru.Peek(k); ok && e.refs == 0 {
			c.lru.Remove(k)
			idle = true
		}
	}
	return idle
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

// Stats returns what the cache did so far.
func (c *RegCache[V]) Stats() RegStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
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
