package collective

import (
	"math/bits"
	"sync"
	"unsafe"
)

// Slabs carves the large pooled buffers of one owner (a communicator: its
// ScratchPool and its early-arrival pool) from a few slabs, each handed
// whole to the data path's memory registration when it is made. On RDMA a
// buffer the NIC reads or writes must be registered, and a registration
// kept across calls costs a slot of the device's cache and pinned pages
// for each buffer: a loop of in-place allreduces would register the
// scratch its calls stage the peer's half in and, apart, the pooled buffer
// a message that comes before its receive lands in. Carved from one slab,
// both find the slab's registration covering them (hw/rdma.RegCache serves
// a sub-range from a registration that covers it), so they share one.
//
// A slab is a Go heap allocation, not a mapping: a piece handed to the
// transport and never given back (an early arrival dropped when its
// communicator failed) keeps its slab alive through the GC instead of
// pointing at unmapped memory. A slab whose pieces all came back is
// dropped at once, its registration with it (forget), so that the idle
// memory is still the pieces the pools keep within their own bounds; only
// the unlent rest of a slab some piece is out of is beyond them (Free).
//
// Buffers are carved by halving (a buddy allocator): the pools ask for
// powers of two, and a piece given back merges with its free buddy, so a
// slab does not fragment into sizes nobody asks for. Only sizes from
// SlabMinBytes to SlabMaxBytes are carved: smaller ones are never
// registered (RDMA sends them through its slots, below its WriteMin), and
// larger ones are registered whole on their own by the calls that use them
// (Preparer) and are mapped on 2 MiB pages (ScratchPool).
//
// A Slabs is safe for concurrent use; its lock is held while prepare and
// forget run (so that Close cannot forget a slab a carve is preparing)
// and is a leaf otherwise: they must not call back into it. A nil *Slabs
// carves nothing.
type Slabs struct {
	prepare func([]byte) // registers a new slab whole (transport.Registrar.Prepare)
	forget  func([]byte) // drops a slab's registrations before it goes (transport.Registrar.Forget)

	mu     sync.Mutex
	slabs  []*slab
	closed bool
}

const (
	// SlabBytes is the size of one slab: room for a staged half of a 2 MiB
	// allreduce and the early arrivals of its peer's chunks.
	SlabBytes    = 4 << 20
	slabClass    = 22       // log2 SlabBytes
	SlabMinBytes = 64 << 10 // RDMA's default WriteMin: smaller buffers are never registered
	slabMinClass = 16
	SlabMaxBytes = 1 << 20 // below hugeClass: larger scratch is mapped on huge pages
	slabMaxClass = 20
)

// slab is one carved allocation; guarded by Slabs.mu.
type slab struct {
	mem  []byte
	base uintptr                  // address of mem[0]: finds the slab of a piece
	free [slabClass + 1][]uintptr // offsets of free blocks by class (log2 size)
	lent int                      // bytes of pieces out
}

// NewSlabs returns a Slabs whose slabs are registered whole by prepare
// when made (and again when carved from, in case the data path began to
// register after the slab was made; prepare must then find the
// registration it made and do nothing), and whose registrations forget
// drops when a slab is let go. Neither may be nil.
func NewSlabs(prepare, forget func([]byte)) *Slabs {
	return &Slabs{prepare: prepare, forget: forget}
}

// Carves reports whether s carves buffers of n bytes.
func (s *Slabs) Carves(n int) bool {
	return s != nil && n >= SlabMinBytes && n <= SlabMaxBytes
}

// Get returns a piece of n bytes, a power of two that s Carves, with
// undefined contents and capacity n; nil when s does not carve that size
// or is closed. Give it back with Put once nothing uses it.
func (s *Slabs) Get(n int) []byte {
	if !s.Carves(n) || n&(n-1) != 0 {
		return nil
	}
	c := bits.Len(uint(n)) - 1
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	for _, sl := range s.slabs {
		if off, ok := sl.carve(c); ok {
			s.prepare(sl.mem) // a cache hit once registered: pieces are carved rarely
			return sl.mem[off : off+uintptr(n) : off+uintptr(n)]
		}
	}
	sl := newSlab()
	s.slabs = append(s.slabs, sl)
	s.prepare(sl.mem)
	off, _ := sl.carve(c)
	return sl.mem[off : off+uintptr(n) : off+uintptr(n)]
}

// Put gives back b, which came from Get, and reports whether it did (false
// for a buffer s did not carve, which the caller releases as before; true
// also after Close, when the piece is left to the GC). A slab whose
// pieces have all come back is forgotten and dropped.
func (s *Slabs) Put(b []byte) bool {
	if !s.Carves(cap(b)) {
		return false
	}
	a := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sl := range s.slabs {
		if a < sl.base || a >= sl.base+SlabBytes {
			continue
		}
		sl.giveBack(a-sl.base, bits.Len(uint(cap(b)))-1)
		if sl.lent == 0 {
			s.forget(sl.mem)
			s.slabs[i] = s.slabs[len(s.slabs)-1]
			s.slabs[len(s.slabs)-1] = nil
			s.slabs = s.slabs[:len(s.slabs)-1]
		}
		return true
	}
	return s.closed // after Close the slabs are gone: the piece was one of theirs, or the GC takes it anyway
}

// Held returns the bytes of the slabs s holds (the pieces lent and the
// unlent rest).
func (s *Slabs) Held() int64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.slabs)) * SlabBytes
}

// Free returns the bytes of s's slabs that no piece holds: the memory
// beyond the pools' bounds on their idle pieces.
func (s *Slabs) Free() int64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, sl := range s.slabs {
		n += int64(SlabBytes - sl.lent)
	}
	return n
}

// Close forgets every slab's registration (one a piece is being read or
// written through goes when that operation ends: hw/rdma.RegCache's
// Invalidate) and lets the slabs go: pieces still out keep theirs alive
// until the GC sees them unused, unregistered; Get carves nothing more.
// Idempotent.
func (s *Slabs) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	for _, sl := range s.slabs {
		s.forget(sl.mem)
	}
	s.slabs = nil
}

func newSlab() *slab {
	sl := &slab{mem: make([]byte, SlabBytes)}
	sl.base = uintptr(unsafe.Pointer(unsafe.SliceData(sl.mem)))
	sl.free[slabClass] = []uintptr{0}
	return sl
}

// carve takes a free block of class c, halving a larger one if need be.
func (sl *slab) carve(c int) (uintptr, bool) {
	k := c
	for k <= slabClass && len(sl.free[k]) == 0 {
		k++
	}
	if k > slabClass {
		return 0, false
	}
	off := sl.free[k][len(sl.free[k])-1]
	sl.free[k] = sl.free[k][:len(sl.free[k])-1]
	for k > c { // keep the upper halves free
		k--
		sl.free[k] = append(sl.free[k], off+1<<k)
	}
	sl.lent += 1 << c
	return off, true
}

// giveBack frees the block of class c at off, merging it with its buddy
// while the buddy is free.
func (sl *slab) giveBack(off uintptr, c int) {
	sl.lent -= 1 << c
	for c < slabClass {
		buddy := off ^ 1<<c
		i := indexOf(sl.free[c], buddy)
		if i < 0 {
			break
		}
		last := len(sl.free[c]) - 1
		sl.free[c][i] = sl.free[c][last]
		sl.free[c] = sl.free[c][:last]
		off &^= 1 << c
		c++
	}
	sl.free[c] = append(sl.free[c], off)
}

func indexOf(s []uintptr, v uintptr) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
