package collective

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Scratch buffers for the schedules' temporaries (receive staging, partial
// results). Allocating them per call costs more than the data they hold at
// large sizes: fresh pages are zeroed and faulted in, and the garbage drives
// the GC. A ScratchPool keeps buffers per power-of-two size class for the
// next calls, within a bound on idle bytes; nothing is package-level: a
// Link hands its pool to the schedules (ScratchLink), core keeps one per
// communicator.
//
// Buffers of hugeClass and up are mapped outside the Go heap, on 2 MiB
// pages where the kernel offers them (madvise(MADV_HUGEPAGE), as numpy and
// glibc do for large arrays): copying and reducing tens of megabytes over
// 4 KiB pages costs up to twice as much in TLB misses, and the kernel pins
// the pages of a cross-memory copy one by one. A pool unmaps those it does
// not keep.

const (
	minScratchClass = 9  // 512 B: smaller buffers are cheap to allocate
	maxScratchClass = 34 // 16 GiB
	hugeClass       = 21 // 2 MiB
)

// ScratchPool holds scratch buffers for one owner (a communicator). Its
// methods are safe for concurrent use; a nil pool pools nothing.
type ScratchPool struct {
	idleMax int64        // bound on idle bytes kept; fixed at NewScratchPool
	inUse   atomic.Int64 // capacity of buffers handed out and not returned
	idleB   atomic.Int64 // capacity of idle buffers kept

	mu     sync.Mutex
	idle   [maxScratchClass + 1][][]byte
	closed bool
}

// NewScratchPool returns a pool that keeps at most idleBytes of idle
// buffers (0 or less: none; a buffer is released when its call ends).
func NewScratchPool(idleBytes int64) *ScratchPool {
	return &ScratchPool{idleMax: max(idleBytes, 0)}
}

// ScratchLink is an optional Link extension: the pool its schedules take
// scratch buffers from. A Link without it allocates per call.
type ScratchLink interface {
	Scratch() *ScratchPool
}

func scratchOf(l Link) *ScratchPool {
	if s, ok := l.(ScratchLink); ok {
		return s.Scratch()
	}
	return nil
}

// Held returns the bytes of scratch the pool holds: in use by running
// calls and kept idle.
func (p *ScratchPool) Held() int64 {
	if p == nil {
		return 0
	}
	return p.inUse.Load() + p.idleB.Load()
}

// Idle returns the bytes of idle scratch the pool keeps.
func (p *ScratchPool) Idle() int64 {
	if p == nil {
		return 0
	}
	return p.idleB.Load()
}

// Get returns a buffer of n bytes with undefined contents; give it back
// with Put when no goroutine uses it any more.
func (p *ScratchPool) Get(n int) []byte {
	c := scratchClass(n)
	if c < 0 || p == nil {
		return make([]byte, n)
	}
	p.mu.Lock()
	if k := len(p.idle[c]); k > 0 {
		b := p.idle[c][k-1]
		p.idle[c][k-1] = nil
		p.idle[c] = p.idle[c][:k-1]
		p.idleB.Add(-int64(cap(b)))
		p.inUse.Add(int64(cap(b)))
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	var b []byte
	if c >= hugeClass {
		b = mapHuge(1 << c)
	}
	if b == nil {
		b = make([]byte, 1<<c)
	}
	p.inUse.Add(int64(cap(b)))
	return b[:n]
}

// Put returns b, which came from Get, to the pool: kept idle while the
// pool's bound allows, else released.
func (p *ScratchPool) Put(b []byte) {
	c := scratchClass(cap(b))
	if p == nil || c < 0 || cap(b) != 1<<c {
		return
	}
	b = b[:cap(b)]
	p.inUse.Add(-int64(cap(b)))
	p.mu.Lock()
	if !p.closed && p.idleB.Load()+int64(cap(b)) <= p.idleMax {
		p.idle[c] = append(p.idle[c], b)
		p.idleB.Add(int64(cap(b)))
		b = nil
	}
	p.mu.Unlock()
	if b != nil {
		release(b)
	}
}

// Close releases the idle buffers; buffers put back afterwards are
// released at once.
func (p *ScratchPool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	var drop [][]byte
	for c := range p.idle {
		drop = append(drop, p.idle[c]...)
		p.idle[c] = nil
	}
	p.idleB.Store(0)
	p.closed = true
	p.mu.Unlock()
	for _, b := range drop {
		release(b)
	}
}

// release unmaps b if mapHuge made it; the GC takes heap buffers.
func release(b []byte) {
	if cap(b) >= 1<<hugeClass && isMapped(b) {
		unmapHuge(b)
	}
}

// scratchClass is the pool index for n bytes, or -1 for sizes not pooled.
func scratchClass(n int) int {
	if n <= 1<<minScratchClass {
		return -1
	}
	c := bits.Len(uint(n - 1))
	if c > maxScratchClass {
		return -1
	}
	return c
}
