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
	minScratchClass = 9  // 512 B: smaller buffers come from the tiny slots
	maxScratchClass = 34 // 16 GiB
	hugeClass       = 21 // 2 MiB
)

// ScratchPool holds scratch buffers for one owner (a communicator). Its
// methods are safe for concurrent use; a nil pool pools nothing.
type ScratchPool struct {
	idleMax int64        // bound on idle bytes kept; fixed at NewScratchPool
	inUse   atomic.Int64 // capacity of buffers handed out and not returned
	idleB   atomic.Int64 // capacity of idle buffers kept

	// tiny keeps idle buffers of tinyScratch bytes, for every request of
	// that size or less (an 8-byte allreduce's temporary), without a lock:
	// a slot is taken and given back with one atomic swap each.
	tiny       [tinySlots]atomic.Pointer[[tinyScratch]byte]
	tinyOn     bool        // idleMax leaves room for every tiny slot
	tinyClosed atomic.Bool // Close has begun: tiny buffers are not kept

	// slabs carves the buffers of the sizes it Carves, so that they share
	// its slabs' registrations with the owner's other pools (Slabs); nil:
	// every buffer is its own allocation. Fixed at NewScratchPoolFrom.
	slabs *Slabs

	mu     sync.Mutex
	idle   [maxScratchClass + 1][][]byte
	closed bool
}

const (
	tinyScratch = 1 << minScratchClass
	tinySlots   = 4
)

// NewScratchPool returns a pool that keeps at most idleBytes of idle
// buffers (0 or less: none; a buffer is released when its call ends).
func NewScratchPool(idleBytes int64) *ScratchPool {
	p := &ScratchPool{idleMax: max(idleBytes, 0)}
	p.tinyOn = p.idleMax >= tinySlots*tinyScratch
	return p
}

// NewScratchPoolFrom is NewScratchPool whose buffers of the sizes slabs
// Carves are carved from slabs (nil: none). Close does not close slabs:
// their owner does, after it.
func NewScratchPoolFrom(idleBytes int64, slabs *Slabs) *ScratchPool {
	p := NewScratchPool(idleBytes)
	p.slabs = slabs
	return p
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
	if p != nil && n <= tinyScratch && p.tinyOn {
		return p.getTiny(n)
	}
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
	} else if p.slabs.Carves(1 << c) {
		b = p.slabs.Get(1 << c) // nil once the slabs are closed
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
	if p != nil && cap(b) == tinyScratch && p.tinyOn {
		p.putTiny((*[tinyScratch]byte)(b[:tinyScratch]))
		return
	}
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
		p.release(b)
	}
}

// getTiny returns an idle tiny buffer, or a new one.
func (p *ScratchPool) getTiny(n int) []byte {
	for i := range p.tiny {
		if b := p.tiny[i].Swap(nil); b != nil {
			p.idleB.Add(-tinyScratch)
			p.inUse.Add(tinyScratch)
			return b[:n]
		}
	}
	p.inUse.Add(tinyScratch)
	return new([tinyScratch]byte)[:n]
}

// putTiny keeps b in a free tiny slot (none: the GC takes it). A buffer
// put back after Close is dropped by that Close's or the next sweep.
func (p *ScratchPool) putTiny(b *[tinyScratch]byte) {
	p.inUse.Add(-tinyScratch)
	for i := range p.tiny {
		if p.tiny[i].CompareAndSwap(nil, b) {
			p.idleB.Add(tinyScratch)
			if p.tinyClosed.Load() {
				p.dropTiny()
			}
			return
		}
	}
}

// dropTiny empties the tiny slots.
func (p *ScratchPool) dropTiny() {
	for i := range p.tiny {
		if p.tiny[i].Swap(nil) != nil {
			p.idleB.Add(-tinyScratch)
		}
	}
}

// Close releases the idle buffers; buffers put back afterwards are
// released at once.
func (p *ScratchPool) Close() {
	if p == nil {
		return
	}
	p.tinyClosed.Store(true)
	p.dropTiny()
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
		p.release(b)
	}
}

// release gives b back to the slabs it was carved from, or unmaps it if
// mapHuge made it; the GC takes other heap buffers.
func (p *ScratchPool) release(b []byte) {
	switch {
	case p.slabs.Carves(cap(b)):
		p.slabs.Put(b)
	case cap(b) >= 1<<hugeClass && isMapped(b):
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
