package collective

import "testing"

func TestScratchPoolIdleBound(t *testing.T) {
	p := NewScratchPool(3 << 10) // room for one 2 KiB buffer and one 1 KiB
	a, b, c := p.Get(2000), p.Get(2000), p.Get(1000)
	if len(a) != 2000 || cap(a) != 2048 || len(c) != 1000 {
		t.Fatalf("sizes: %d/%d, %d", len(a), cap(a), len(c))
	}
	if got := p.Held(); got != 2048+2048+1024 {
		t.Fatalf("held %d while in use", got)
	}
	p.Put(a)
	p.Put(b) // over the bound: released
	p.Put(c)
	if p.Idle() != 3<<10 || p.Held() != 3<<10 {
		t.Fatalf("idle %d, held %d; want 3 KiB each", p.Idle(), p.Held())
	}
	if d := p.Get(1500); &d[:1][0] != &a[:1][0] {
		t.Fatal("an idle buffer of the class was not reused")
	}
	p.Close()
	if p.Held() != 2048 || p.Idle() != 0 {
		t.Fatalf("after Close: held %d, idle %d", p.Held(), p.Idle())
	}
	none := NewScratchPool(0)
	none.Put(none.Get(4096))
	if none.Held() != 0 {
		t.Fatalf("a pool that keeps nothing holds %d", none.Held())
	}
	var nilPool *ScratchPool
	if b := nilPool.Get(10); len(b) != 10 || nilPool.Held() != 0 {
		t.Fatal("nil pool")
	}
}

// TestScratchPoolTiny: requests of at most 512 bytes reuse the pool's tiny
// buffers (an 8-byte allreduce allocates none), are counted like the
// others, and are kept only where the idle bound leaves room for them.
func TestScratchPoolTiny(t *testing.T) {
	p := NewScratchPool(1 << 20)
	a := p.Get(8)
	if len(a) != 8 || cap(a) != tinyScratch || p.Held() != tinyScratch {
		t.Fatalf("tiny get: len %d cap %d, held %d", len(a), cap(a), p.Held())
	}
	p.Put(a)
	if p.Idle() != tinyScratch {
		t.Fatalf("idle %d after a tiny put; want %d", p.Idle(), tinyScratch)
	}
	if got := testing.AllocsPerRun(100, func() { p.Put(p.Get(8)) }); got != 0 {
		t.Errorf("tiny get and put: %.0f allocations; want 0", got)
	}
	bufs := make([][]byte, tinySlots+2)
	for i := range bufs {
		bufs[i] = p.Get(500)
	}
	for _, b := range bufs {
		p.Put(b)
	}
	if p.Idle() != tinySlots*tinyScratch || p.Held() != tinySlots*tinyScratch {
		t.Fatalf("idle %d, held %d; want the %d slots' bytes", p.Idle(), p.Held(), tinySlots)
	}
	p.Close()
	p.Put(p.Get(8)) // after Close: not kept
	if p.Idle() != 0 || p.Held() != 0 {
		t.Fatalf("after Close: idle %d, held %d", p.Idle(), p.Held())
	}
	small := NewScratchPool(tinyScratch) // no room for every slot: none kept
	small.Put(small.Get(8))
	if small.Held() != 0 {
		t.Fatalf("a pool with no room for the tiny slots holds %d", small.Held())
	}
}
