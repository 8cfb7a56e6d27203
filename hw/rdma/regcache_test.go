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
