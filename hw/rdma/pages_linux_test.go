package rdma

import (
	"fmt"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func mapAnon(t *testing.T, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

// remapAt maps fresh memory (anonymous, or a new memfd when shared) over
// [a, a+n), as an allocator handing the address to a new allocation does.
func remapAt(t *testing.T, a uintptr, n int, shared bool) {
	t.Helper()
	fd, flags := -1, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS
	if shared {
		var err error
		if fd, err = memfd(n); err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		flags = syscall.MAP_SHARED
	}
	if _, _, e := syscall.Syscall(syscall.SYS_MUNMAP, a, uintptr(n), 0); e != 0 {
		t.Fatal(e)
	}
	p, _, e := syscall.Syscall6(syscall.SYS_MMAP, a, uintptr(n), syscall.PROT_READ|syscall.PROT_WRITE, uintptr(flags|syscall.MAP_FIXED), uintptr(fd), 0)
	if e != 0 || p != a {
		t.Fatalf("mmap at %#x: %#x %v", a, p, e)
	}
}

func memfd(n int) (int, error) {
	fd, err := unix.MemfdCreate("nexar-test", 0)
	if err != nil {
		return -1, err
	}
	if err := syscall.Ftruncate(fd, int64(n)); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

func mapShared(t *testing.T, n int) []byte {
	t.Helper()
	fd, err := memfd(n)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	b, err := syscall.Mmap(fd, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func isLocked(b []byte) bool { return syscall.Madvise(b, madvCold) == syscall.EINVAL }

// TestPages: a held range keeps its pages (the kernel refuses to drop them
// in place) and stays valid while it is untouched; memory unmapped and
// mapped anew at the same address, anonymous or shared, is found changed;
// memory locked by someone else is not held; overlapping holds share their
// pages' lock.
func TestPages(t *testing.T) {
	// Both sources of the mappings: PROCMAP_QUERY where the kernel has it,
	// and reading /proc/self/maps.
	for _, query := range []bool{true, false} {
		t.Run(fmt.Sprintf("query=%v", query), func(t *testing.T) {
			p := NewPages()
			if err := p.Usable(); err != nil {
				t.Fatalf("Pages unusable on this kernel: %v", err)
			}
			if query && p.query == nil {
				t.Skip("no PROCMAP_QUERY on this kernel")
			}
			if !query {
				p.query = nil
			}
			testPages(t, p)
		})
	}
}

func testPages(t *testing.T, p *Pages) {
	pg := int(p.page)
	for _, shared := range []bool{false, true} {
		b := mapAnon(t, 4*pg)
		if shared {
			b = mapShared(t, 4*pg)
		}
		a := uintptr(unsafe.Pointer(&b[0]))
		h, ok := p.Hold(a+16, uintptr(2*pg))
		if !ok {
			t.Fatalf("shared %v: not held", shared)
		}
		if !h.Still() || !isLocked(b[:3*pg]) || isLocked(b[3*pg:]) {
			t.Fatalf("shared %v: just held: still %v, locked %v %v", shared, h.Still(), isLocked(b[:3*pg]), isLocked(b[3*pg:]))
		}
		if err := syscall.Madvise(b[:pg], syscall.MADV_DONTNEED); err != syscall.EINVAL {
			t.Errorf("shared %v: MADV_DONTNEED of held pages: %v, want EINVAL", shared, err)
		}
		b[pg] = 7
		if !h.Still() {
			t.Errorf("shared %v: a write made the hold stale", shared)
		}
		remapAt(t, a+uintptr(pg), pg, shared) // the middle page only
		if h.Still() {
			t.Errorf("shared %v: memory mapped anew at the same address passed the check", shared)
		}
		h.Release()
		h.Release()
		if isLocked(b[:pg]) {
			t.Errorf("shared %v: pages locked after the release", shared)
		}
	}

	b := mapAnon(t, 4*pg)
	a := uintptr(unsafe.Pointer(&b[0]))
	if err := syscall.Mlock(b[pg : 2*pg]); err != nil {
		t.Fatal(err)
	}
	if h, ok := p.Hold(a, uintptr(3*pg)); ok {
		h.Release()
		t.Error("memory locked by someone else was held")
	}
	syscall.Munlock(b[pg : 2*pg])

	h1, ok1 := p.Hold(a, uintptr(2*pg))
	h2, ok2 := p.Hold(a+uintptr(pg), uintptr(2*pg))
	if !ok1 || !ok2 || !h1.Still() || !h2.Still() {
		t.Fatalf("overlapping holds: %v %v", ok1, ok2)
	}
	h1.Release()
	if !h2.Still() || isLocked(b[:pg]) || !isLocked(b[pg:3*pg]) {
		t.Errorf("after releasing the first of two overlapping holds: still %v, first page locked %v, the second's %v", h2.Still(), isLocked(b[:pg]), isLocked(b[pg:3*pg]))
	}
	h2.Release()
	if isLocked(b[:4*pg]) {
		t.Error("pages locked after both releases")
	}
	if len(p.segs) != 0 {
		t.Errorf("lock counts left: %+v", p.segs)
	}
}

// TestPagesNotWritable: read-only memory is not held (the NIC writes
// registered memory).
func TestPagesNotWritable(t *testing.T) {
	p := NewPages()
	b, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	if h, ok := p.Hold(uintptr(unsafe.Pointer(&b[0])), 8); ok {
		h.Release()
		t.Error("read-only memory was held")
	}
}

// TestRegCacheWithPages: a kept registration whose memory was mapped anew
// is dropped when a registration overlapping it is made, so that the new
// one's pages are all locked and it is reused after (else the stale one's
// count would stand for pages nobody locked, and every use of the new one
// would register it again).
func TestRegCacheWithPages(t *testing.T) {
	p := NewPages()
	f := newFake()
	c, err := NewLastingRegCache(8, f.reg, f.dereg, p)
	if err != nil {
		t.Fatal(err)
	}
	pg := int(p.page)
	b := mapAnon(t, 4*pg)
	a := uintptr(unsafe.Pointer(&b[0]))
	use := func(addr uintptr, n int) {
		t.Helper()
		h, err := c.Acquire(addr, uintptr(n))
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	use(a, 2*pg)
	use(a, 2*pg)
	remapAt(t, a, 2*pg, false)
	use(a+uintptr(pg), 2*pg)
	use(a+uintptr(pg), 2*pg)
	use(a+uintptr(pg), 2*pg)
	if s := c.Stats(); s.Registered != 2 || s.Stale != 1 || s.Reused != 3 {
		t.Errorf("%+v: want the stale registration dropped and the new one made once, then reused", s)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(p.segs) != 0 || isLocked(b) {
		t.Errorf("after Close: lock counts %+v, pages locked %v", p.segs, isLocked(b))
	}
}

// BenchmarkPagesStill: the check before each reuse of a kept registration
// (reading /proc/self/maps up to the buffer, one madvise per mapping).
func BenchmarkPagesStill(b *testing.B) {
	p := NewPages()
	m, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer syscall.Munmap(m)
	h, ok := p.Hold(uintptr(unsafe.Pointer(&m[0])), 1<<20)
	if !ok {
		b.Fatal("not held")
	}
	defer h.Release()
	for b.Loop() {
		if !h.Still() {
			b.Fatal("stale")
		}
	}
}
