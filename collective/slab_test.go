package collective

import (
	"sync"
	"testing"
	"unsafe"
)

// slabRecorder stands for the data path's registration: it records the
// slabs prepared and forgotten, by address, and counts the forget calls
// (a slab made after one was forgotten may get its address again).
type slabRecorder struct {
	mu        sync.Mutex
	prepared  map[uintptr]int // prepare calls per slab
	forgotten map[uintptr]int
	forgets   int
}

func newSlabRecorder() *slabRecorder {
	return &slabRecorder{prepared: map[uintptr]int{}, forgotten: map[uintptr]int{}}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (r *slabRecorder) slabs() *Slabs {
	return NewSlabs(func(b []byte) {
		if len(b) != SlabBytes {
			panic("prepared a piece, not a slab")
		}
		r.mu.Lock()
		r.prepared[addr(b)]++
		r.mu.Unlock()
	}, func(b []byte) {
		r.mu.Lock()
		r.forgotten[addr(b)]++
		r.forgets++
		r.mu.Unlock()
	})
}

// TestSlabsCarve: pieces of the sizes carved come from one slab, do not
// overlap, merge back when given back, and the slab goes (forgotten) once
// every piece is back; other sizes are not carved.
func TestSlabsCarve(t *testing.T) {
	r := newSlabRecorder()
	s := r.slabs()
	sizes := []int{256 << 10, 64 << 10, 1 << 20, 128 << 10, 256 << 10, 1 << 20, 64 << 10}
	var got [][]byte
	for _, n := range sizes {
		b := s.Get(n)
		if len(b) != n || cap(b) != n {
			t.Fatalf("Get(%d): len %d cap %d", n, len(b), cap(b))
		}
		got = append(got, b)
	}
	if len(r.prepared) != 1 || s.Held() != SlabBytes {
		t.Fatalf("%d slabs prepared, %d bytes held; want one slab", len(r.prepared), s.Held())
	}
	var base uintptr
	for a := range r.prepared {
		base = a
	}
	lent := 0
	for i, b := range got {
		a := addr(b)
		if a < base || a+uintptr(len(b)) > base+SlabBytes || (a-base)%uintptr(len(b)) != 0 {
			t.Fatalf("piece %d (%d bytes) at slab offset %d: outside the slab or misaligned", i, len(b), a-base)
		}
		for j, c := range got[:i] {
			if a < addr(c)+uintptr(len(c)) && addr(c) < a+uintptr(len(b)) {
				t.Fatalf("pieces %d and %d overlap", j, i)
			}
		}
		lent += len(b)
	}
	if f := s.Free(); f != int64(SlabBytes-lent) {
		t.Fatalf("free %d, want %d", f, SlabBytes-lent)
	}
	for _, n := range []int{32 << 10, 2 << 20, 3 << 16} { // too small, too large, not a power of two
		if s.Get(n) != nil {
			t.Errorf("%d bytes carved", n)
		}
	}
	if s.Put(make([]byte, 64<<10)) {
		t.Error("Put took a buffer it did not carve")
	}
	// Every piece goes back, and the slab with the last one.
	for i, b := range got {
		if !s.Put(b) {
			t.Fatalf("Put of piece %d refused", i)
		}
		if i < len(got)-1 && r.forgets != 0 {
			t.Fatalf("slab forgotten with %d pieces out", len(got)-1-i)
		}
	}
	if r.forgotten[base] != 1 || s.Held() != 0 || s.Free() != 0 {
		t.Fatalf("after every piece came back: forgotten %v, held %d, free %d", r.forgotten, s.Held(), s.Free())
	}
	// Merged back whole: a 1 MiB piece four times fills one new slab.
	var ms [][]byte
	for range 4 {
		ms = append(ms, s.Get(1<<20))
	}
	if s.Held() != SlabBytes || s.Free() != 0 {
		t.Fatalf("four 1 MiB pieces: held %d, free %d; want one full slab", s.Held(), s.Free())
	}
	extra := s.Get(64 << 10) // a second slab
	if s.Held() != 2*SlabBytes {
		t.Fatalf("held %d, want two slabs", s.Held())
	}
	s.Close()
	if r.forgets != 3 {
		t.Fatalf("after Close, %d slabs forgotten, want 3", r.forgets)
	}
	if s.Get(64<<10) != nil || s.Held() != 0 {
		t.Fatal("a closed Slabs carved")
	}
	for _, b := range append(ms, extra) {
		if !s.Put(b) {
			t.Fatal("a piece given back after Close was refused")
		}
	}
	if r.forgets != 3 {
		t.Fatal("a piece given back after Close forgot a slab again")
	}
	var none *Slabs
	if none.Get(64<<10) != nil || none.Put(make([]byte, 64<<10)) || none.Held() != 0 {
		t.Fatal("nil Slabs")
	}
	none.Close()
}

// TestScratchPoolSlabs: a pool on slabs carves the sizes they carve, counts
// them as before (Held, Idle, the idle bound), and gives back the ones it
// does not keep, so that the slab goes when the last one does.
func TestScratchPoolSlabs(t *testing.T) {
	r := newSlabRecorder()
	s := r.slabs()
	p := NewScratchPoolFrom(300<<10, s) // room for one 256 KiB buffer idle
	a, b, small := p.Get(200<<10), p.Get(256<<10), p.Get(1000)
	if p.Held() != 512<<10+1024 || s.Held() != SlabBytes || len(r.prepared) != 1 {
		t.Fatalf("held %d, slabs %d, %d prepared", p.Held(), s.Held(), len(r.prepared))
	}
	if f := s.Free(); f != SlabBytes-512<<10 {
		t.Fatalf("slab free %d: the 1000-byte buffer was carved?", f)
	}
	p.Put(a)
	p.Put(b) // over the bound: back to the slab
	p.Put(small)
	if p.Idle() != 256<<10+1024 || s.Free() != SlabBytes-256<<10 || r.forgets != 0 {
		t.Fatalf("idle %d, slab free %d, forgotten %d", p.Idle(), s.Free(), r.forgets)
	}
	if c := p.Get(256 << 10); addr(c) != addr(a) {
		t.Fatal("the idle piece was not reused")
	} else {
		p.Put(c)
	}
	p.Close()
	if p.Held() != 0 || s.Held() != 0 || r.forgets != 1 {
		t.Fatalf("after Close: held %d, slabs %d, forgotten %d", p.Held(), s.Held(), r.forgets)
	}
	s.Close()
}

// TestSlabsConcurrent: pieces taken and given back from many goroutines
// never overlap while out (run with -race).
func TestSlabsConcurrent(t *testing.T) {
	s := newSlabRecorder().slabs()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				n := 64 << 10 << ((g + i) % 5)
				b := s.Get(n)
				ends := []int{0, n / 2, n - 1}
				for _, k := range ends {
					b[k] = byte(g)
				}
				for _, k := range ends {
					if b[k] != byte(g) {
						t.Errorf("goroutine %d: piece written by another", g)
						return
					}
				}
				s.Put(b)
			}
		}()
	}
	wg.Wait()
	if s.Held() != 0 {
		t.Fatalf("%d bytes of slabs held with every piece back", s.Held())
	}
	s.Close()
}
