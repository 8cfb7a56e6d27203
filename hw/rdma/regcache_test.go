package rdma

import (
	"errors"
	"sync"
	"testing"
)

// fakeMR records a registration made by fakeRegistrar.
type fakeMR struct {
	id      int
	addr, n uintptr
}

type fakeRegistrar struct {
	mu    sync.Mutex
	next  int
	live  map[int]fakeMR
	fail  bool
	calls int
}

func newFake() *fakeRegistrar { return &fakeRegistrar{live: map[int]fakeMR{}} }

func (f *fakeRegistrar) reg(addr, n uintptr) (fakeMR, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail {
		return fakeMR{}, errors.New("fake: ibv_reg_mr failed")
	}
	f.next++
	m := fakeMR{f.next, addr, n}
	f.live[m.id] = m
	return m, nil
}

func (f *fakeRegistrar) dereg(m fakeMR) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[m.id]; !ok {
		return errors.New("fake: double deregistration")
	}
	delete(f.live, m.id)
	return nil
}

func (f *fakeRegistrar) nlive() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

func TestRegCacheLookup(t *testing.T) {
	tests := []struct {
		name      string
		first     [2]uintptr
		second    [2]uintptr
		wantReuse bool
	}{
		{"same range", [2]uintptr{0x1000, 4096}, [2]uintptr{0x1000, 4096}, true},
		{"inside", [2]uintptr{0x1000, 4096}, [2]uintptr{0x1100, 100}, true},
		{"tail inside", [2]uintptr{0x1000, 4096}, [2]uintptr{0x1f00, 0x100}, true},
		{"past end", [2]uintptr{0x1000, 4096}, [2]uintptr{0x1f00, 0x101}, false},
		{"before start", [2]uintptr{0x1000, 4096}, [2]uintptr{0xfff, 2}, false},
		{"disjoint", [2]uintptr{0x1000, 4096}, [2]uintptr{0x9000, 8}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			c, err := NewRegCache(4, f.reg, f.dereg)
			if err != nil {
				t.Fatal(err)
			}
			h1, err := c.Acquire(tt.first[0], tt.first[1])
			if err != nil {
				t.Fatal(err)
			}
			h2, err := c.Acquire(tt.second[0], tt.second[1])
			if err != nil {
				t.Fatal(err)
			}
			if got := h1.Value().id == h2.Value().id; got != tt.wantReuse {
				t.Errorf("reused = %v, want %v", got, tt.wantReuse)
			}
			if v := h2.Value(); !(span{v.addr, v.n}).contains(tt.second[0], tt.second[1]) {
				t.Errorf("registration %#x+%d does not cover %#x+%d", v.addr, v.n, tt.second[0], tt.second[1])
			}
			h1.Release()
			h2.Release()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if n := f.nlive(); n != 0 {
				t.Errorf("%d registrations leaked after Close", n)
			}
		})
	}
}

func TestRegCacheBoundAndInUse(t *testing.T) {
	f := newFake()
	c, err := NewRegCache(2, f.reg, f.dereg)
	if err != nil {
		t.Fatal(err)
	}
	held, err := c.Acquire(0x10000, 64) // stays in use across its eviction
	if err != nil {
		t.Fatal(err)
	}
	for i := uintptr(1); i <= 5; i++ {
		h, err := c.Acquire(0x10000+i*0x1000, 64)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	if c.Len() != 2 {
		t.Errorf("Len = %d, want 2", c.Len())
	}
	// Two cached plus the evicted one still held.
	if n := f.nlive(); n != 3 {
		t.Errorf("live registrations = %d, want 3", n)
	}
	held.Release()
	held.Release() // idempotent
	if n := f.nlive(); n != 2 {
		t.Errorf("live registrations after release = %d, want 2", n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := f.nlive(); n != 0 {
		t.Errorf("%d registrations leaked", n)
	}
}

func TestRegCacheInvalidate(t *testing.T) {
	f := newFake()
	c, _ := NewRegCache(8, f.reg, f.dereg)
	for _, a := range []uintptr{0x1000, 0x3000, 0x5000} {
		h, err := c.Acquire(a, 0x1000)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	c.Invalidate(0x2800, 0x1000) // overlaps only 0x3000
	if c.Len() != 2 || f.nlive() != 2 {
		t.Fatalf("after Invalidate: Len %d live %d, want 2 2", c.Len(), f.nlive())
	}
	calls := f.calls
	h, _ := c.Acquire(0x3000, 8)
	if f.calls != calls+1 {
		t.Error("invalidated range was served from the cache")
	}
	h.Release()
	_ = c.Close()
}

func TestRegCacheErrors(t *testing.T) {
	f := newFake()
	if _, err := NewRegCache(0, f.reg, f.dereg); err == nil {
		t.Error("size 0 accepted")
	}
	c, _ := NewRegCache(2, f.reg, f.dereg)
	if _, err := c.Acquire(0x1000, 0); err == nil {
		t.Error("empty range accepted")
	}
	if _, err := c.Acquire(^uintptr(0)-1, 8); err == nil {
		t.Error("overflowing range accepted")
	}
	f.fail = true
	if _, err := c.Acquire(0x1000, 8); err == nil {
		t.Error("registration failure not reported")
	}
	if c.Len() != 0 {
		t.Error("failed registration was cached")
	}
	_ = c.Close()
	if _, err := c.Acquire(0x1000, 8); err == nil {
		t.Error("Acquire after Close succeeded")
	}
}

func TestRegCacheConcurrent(t *testing.T) {
	f := newFake()
	c, _ := NewRegCache(4, f.reg, f.dereg)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				h, err := c.Acquire(uintptr(0x1000*((g+i)%7+1)), 128)
				if err != nil {
					t.Error(err)
					return
				}
				h.Release()
			}
		}(g)
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := f.nlive(); n != 0 {
		t.Errorf("%d registrations leaked", n)
	}
}

// fakeLasting holds every range whose address is not in refuse, and calls
// a hold stale once its range is in changed.
type fakeLasting struct {
	mu       sync.Mutex
	refuse   map[uintptr]bool
	changed  map[uintptr]bool
	held     int // holds not released
	checked  int
	released int
}

type fakeHeld struct {
	l    *fakeLasting
	addr uintptr
	once sync.Once
}

func (l *fakeLasting) Hold(addr, n uintptr) (Held, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse[addr] {
		return nil, false
	}
	l.held++
	return &fakeHeld{l: l, addr: addr}, true
}

func (h *fakeHeld) Still() bool {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	h.l.checked++
	return !h.l.changed[h.addr]
}

func (h *fakeHeld) Release() {
	h.once.Do(func() {
		h.l.mu.Lock()
		defer h.l.mu.Unlock()
		h.l.held--
		h.l.released++
	})
}

// TestRegCacheLasting: a registration its Lasting holds serves every later
// use of its range, checked each time; one whose memory changed is dropped
// (deregistered, its hold released) and made anew; one the Lasting
// refuses, or one acquired for a single use, ends with its use.
func TestRegCacheLasting(t *testing.T) {
	f := newFake()
	l := &fakeLasting{refuse: map[uintptr]bool{0x9000: true}, changed: map[uintptr]bool{}}
	c, err := NewLastingRegCache(8, f.reg, f.dereg, l)
	if err != nil {
		t.Fatal(err)
	}
	use := func(a uintptr, once bool) {
		t.Helper()
		acq := c.Acquire
		if once {
			acq = c.AcquireOnce
		}
		h, err := acq(a, 0x1000)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	for range 1000 {
		use(0x1000, false)
	}
	if s := c.Stats(); s.Registered != 1 || s.Reused != 999 || f.calls != 1 || l.checked != 999 {
		t.Fatalf("1000 uses of one buffer: %+v, %d ibv_reg_mr, %d checks; want 1 registration, 999 checked reuses", s, f.calls, l.checked)
	}
	l.changed[0x1000] = true // freed and mapped anew
	use(0x1000, false)
	if s := c.Stats(); s.Registered != 2 || s.Stale != 1 || f.nlive() != 1 || l.held != 1 || l.released != 1 {
		t.Fatalf("after the memory changed: %+v, %d live, %d held, %d released; want a fresh registration, the stale one gone", s, f.nlive(), l.held, l.released)
	}
	delete(l.changed, 0x1000)
	// Refused by the Lasting, or not to be kept: registered per use.
	for _, tc := range []struct {
		a    uintptr
		once bool
	}{{0x9000, false}, {0x5000, true}} {
		before := f.calls
		use(tc.a, tc.once)
		use(tc.a, tc.once)
		if f.calls != before+2 || f.nlive() != 1 {
			t.Errorf("%#x (once %v): %d registrations for 2 uses, %d live; want 2 and only the kept one live", tc.a, tc.once, f.calls-before, f.nlive())
		}
	}
	// An entry in use is shared without a check.
	h1, _ := c.Acquire(0x9000, 0x1000)
	h2, _ := c.Acquire(0x9000, 0x800)
	if f.nlive() != 2 {
		t.Errorf("a registration in use was not shared: %d live", f.nlive())
	}
	h1.Release()
	h2.Release()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if f.nlive() != 0 || l.held != 0 {
		t.Errorf("after Close: %d registrations, %d holds left", f.nlive(), l.held)
	}
}

// TestRegCacheLastingRetry: a registration that fails (the pinned-memory
// limit) is tried again once the idle kept ones are given back.
func TestRegCacheLastingRetry(t *testing.T) {
	f := newFake()
	l := &fakeLasting{changed: map[uintptr]bool{}}
	c, _ := NewLastingRegCache(8, f.reg, f.dereg, l)
	h, _ := c.Acquire(0x1000, 8)
	h.Release()
	regs := 0
	c.reg = func(addr, n uintptr) (fakeMR, error) {
		if regs++; f.nlive() > 0 {
			return fakeMR{}, errors.New("fake: ENOMEM")
		}
		return f.reg(addr, n)
	}
	h, err := c.Acquire(0x5000, 8)
	if err != nil || regs != 2 || f.nlive() != 1 {
		t.Fatalf("Acquire over the limit: %v after %d tries, %d live", err, regs, f.nlive())
	}
	h.Release()
	_ = c.Close()
}

// TestRegCacheKeep: a buffer kept whole serves every piece of it acquired
// later, with one registration; idle registrations of its pieces made
// before are given back; a range the Lasting refuses is not registered at
// all; a kept buffer whose memory changed is registered anew.
func TestRegCacheKeep(t *testing.T) {
	f := newFake()
	l := &fakeLasting{refuse: map[uintptr]bool{0x90000: true}, changed: map[uintptr]bool{}}
	c, err := NewLastingRegCache(8, f.reg, f.dereg, l)
	if err != nil {
		t.Fatal(err)
	}
	const buf, half = 0x10000, 0x2000
	use := func(a, n uintptr) {
		t.Helper()
		h, err := c.Acquire(a, n)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	use(buf+half, half) // a piece registered before the buffer is kept
	if kept, err := c.Keep(buf, 2*half); !kept || err != nil {
		t.Fatalf("Keep: %v, %v", kept, err)
	}
	if f.calls != 2 || f.nlive() != 1 {
		t.Fatalf("after Keep: %d registrations made, %d live; want 2 made and the piece's given back", f.calls, f.nlive())
	}
	for range 1000 {
		if kept, err := c.Keep(buf, 2*half); !kept || err != nil {
			t.Fatalf("Keep again: %v, %v", kept, err)
		}
		use(buf, half)
		use(buf+half, half)
		use(buf+100, 8)
	}
	if f.calls != 2 {
		t.Errorf("1000 calls of Keep and 3 pieces each made %d registrations, want none after the first Keep", f.calls-2)
	}
	// Refused: nothing registered, and pieces register per use.
	if kept, err := c.Keep(0x90000, 2*half); kept || err != nil || f.calls != 2 {
		t.Errorf("Keep of a refused range: %v, %v, %d registrations made; want false, nil, none", kept, err, f.calls-2)
	}
	// The memory changed: the stale registration goes, a new one is made.
	l.changed[buf] = true
	if kept, err := c.Keep(buf, 2*half); !kept || err != nil {
		t.Fatalf("Keep after the memory changed: %v, %v", kept, err)
	}
	if s := c.Stats(); s.Stale != 1 || f.calls != 3 || f.nlive() != 1 {
		t.Errorf("after the memory changed: %+v, %d made, %d live; want 1 stale, a third made, 1 live", s, f.calls, f.nlive())
	}
	if _, err := c.Keep(buf, 0); err == nil {
		t.Error("Keep of an empty range: no error")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if f.nlive() != 0 || l.held != 0 {
		t.Errorf("after Close: %d registrations, %d holds left", f.nlive(), l.held)
	}
	if _, err := c.Keep(buf, half); err == nil {
		t.Error("Keep after Close: no error")
	}
}

// TestRegCacheKeepInvalidate: a kept whole range serves its pieces, and
// Invalidate of it (its memory given back: core's slabs, Forget) drops
// it, at once when idle, else when the piece's use ends, and gives up its
// hold either way.
func TestRegCacheKeepInvalidate(t *testing.T) {
	f := newFake()
	l := &fakeLasting{refuse: map[uintptr]bool{}, changed: map[uintptr]bool{}}
	c, err := NewLastingRegCache(8, f.reg, f.dereg, l)
	if err != nil {
		t.Fatal(err)
	}
	const slab, piece = 0x400000, 0x40000
	for _, inUse := range []bool{false, true} {
		calls := f.calls
		if kept, err := c.Keep(slab, 16*piece); !kept || err != nil {
			t.Fatalf("Keep: %v, %v", kept, err)
		}
		h, err := c.Acquire(slab+3*piece, piece)
		if err != nil {
			t.Fatal(err)
		}
		if f.calls != calls+1 {
			t.Fatalf("a piece of a kept range made %d registrations of its own", f.calls-calls-1)
		}
		if !inUse {
			h.Release()
		}
		c.Invalidate(slab, 16*piece)
		if want := map[bool]int{false: 0, true: 1}[inUse]; f.nlive() != want || l.held != want {
			t.Fatalf("in use %v: after Invalidate %d registrations live, %d holds; want %d", inUse, f.nlive(), l.held, want)
		}
		h.Release()
		if f.nlive() != 0 || l.held != 0 || c.Len() != 0 {
			t.Fatalf("in use %v: after the last use %d live, %d holds, %d cached", inUse, f.nlive(), l.held, c.Len())
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
