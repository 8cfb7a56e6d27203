package rdma

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"
)

// madvCold is MADV_COLD (Linux 5.4), absent from package syscall.
const madvCold = 20

// Pages keeps registrations of host memory valid across uses where it can
// prove, before each reuse, that the range still holds the pages the NIC
// pinned (a Lasting for RegCache).
//
// Why a proof is needed: a registration pins the physical pages behind its
// addresses. When the application frees the memory (munmap) and a new
// allocation lands at the same address, or the allocator gives the pages
// back in place (MADV_DONTNEED, MADV_FREE: glibc's trimming, the Go
// scavenger), the addresses get new pages and a kept registration would
// make the NIC read and write the old ones. Open MPI, UCX and libfabric see
// those events through memory hooks (patched munmap/madvise, userfaultfd);
// a library loaded into someone else's process, in Go, cannot patch them.
// So Pages makes them visible instead:
//
//   - it locks the range (mlock): the kernel then refuses to drop its pages
//     in place (madvise DONTNEED, FREE and REMOVE fail with EINVAL on a
//     locked mapping), so the only way the pages can leave is the mapping
//     leaving (munmap, mremap, mmap MAP_FIXED over it), which unlocks them;
//   - before each reuse it checks that every mapping over the range is
//     still locked (madvise(MADV_COLD), which fails with EINVAL on a locked
//     mapping and is a harmless hint on any other) and is the mapping it
//     registered (per /proc/self/maps: permissions, and for file, memfd and
//     shm mappings the device, inode and offset).
//
// A range some other code had locked already is not kept (a fresh mapping
// it locks would pass the check), nor is one whose lock fails
// (RLIMIT_MEMLOCK), nor any when the kernel does not behave as the check
// needs (tested once, by NewPages): those registrations last one use, as
// before. What the check cannot see: an application that unlocks memory it
// did not lock (munlock, munlockall) and then drops its pages in place.
//
// Pages counts the locks it took per page range, so overlapping
// registrations share them. Safe for concurrent use.
type Pages struct {
	mu     sync.Mutex
	segs   []pageSeg // sorted, disjoint: the ranges this Pages locked, with their holders
	usable error     // non-nil: keeps nothing, and why
	page   uintptr
	// query, where the kernel has PROCMAP_QUERY (Linux 6.11), is
	// /proc/self/maps held open to ask it for the mapping at an address:
	// one ioctl per mapping instead of reading the file (about 55 µs in a
	// small Go process, more with more mappings). Set once, by NewPages.
	query *os.File
}

type pageSeg struct {
	lo, hi uintptr
	n      int
}

// NewPages returns a Pages for this process, after checking that the
// kernel refuses to advise a locked mapping (else it keeps nothing).
func NewPages() *Pages {
	p := &Pages{page: uintptr(os.Getpagesize())}
	p.usable = selfTest(int(p.page))
	if p.usable == nil {
		p.query = queryTest(int(p.page))
	}
	return p
}

// procmapQuery is struct procmap_query of <linux/fs.h> (Linux 6.11).
type procmapQuery struct {
	size, queryFlags, queryAddr, vmaStart, vmaEnd, vmaFlags, vmaPageSize, vmaOffset, inode uint64
	devMajor, devMinor, vmaNameSize, buildIDSize                                           uint32
	vmaNameAddr, buildIDAddr                                                               uint64
}

const (
	procmapQueryIoctl = 0xc0686611 // _IOWR('f', 17, struct procmap_query)
	procmapReadable   = 1
	procmapWritable   = 2
	procmapExecutable = 4
	procmapShared     = 8
)

// queryTest opens /proc/self/maps for PROCMAP_QUERY where the kernel
// answers it as the file reads (checked on a mapping of its own); nil
// otherwise, and reading the file it is.
func queryTest(page int) *os.File {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil
	}
	b, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		f.Close()
		return nil
	}
	defer syscall.Munmap(b)
	// A read-only middle page: three mappings, not merged with neighbours.
	if syscall.Mprotect(b[page:2*page], syscall.PROT_READ) != nil {
		f.Close()
		return nil
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	want, ok1, err1 := readVMAs(lo, lo+uintptr(3*page))
	got, ok2, err2 := queryVMAs(f, lo, lo+uintptr(3*page))
	if err1 != nil || err2 != nil || !ok1 || !ok2 || len(want) != 3 || len(got) != 3 {
		f.Close()
		return nil
	}
	for i := range want {
		w, g := want[i], got[i]
		if w.lo != g.lo || w.hi != g.hi || w.perm != g.perm || w.off != g.off || w.inode != g.inode {
			f.Close()
			return nil
		}
	}
	return f
}

// queryVMAs is readVMAs by PROCMAP_QUERY on f (the names of mappings are
// not asked: their device, inode and offset tell them apart).
func queryVMAs(f *os.File, lo, hi uintptr) ([]vma, bool, error) {
	var out []vma
	for at := lo; at < hi; {
		q := procmapQuery{queryAddr: uint64(at)}
		q.size = uint64(unsafe.Sizeof(q))
		_, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), procmapQueryIoctl, uintptr(unsafe.Pointer(&q)))
		switch {
		case e == syscall.ENOENT:
			return nil, false, nil // a hole
		case e != 0:
			return nil, false, e
		}
		perm := []byte("---p")
		if q.vmaFlags&procmapReadable != 0 {
			perm[0] = 'r'
		}
		if q.vmaFlags&procmapWritable != 0 {
			perm[1] = 'w'
		}
		if q.vmaFlags&procmapExecutable != 0 {
			perm[2] = 'x'
		}
		if q.vmaFlags&procmapShared != 0 {
			perm[3] = 's'
		}
		v := vma{lo: at, hi: min(uintptr(q.vmaEnd), hi), perm: string(perm), off: q.vmaOffset,
			dev: fmt.Sprintf("%02x:%02x", q.devMajor, q.devMinor), inode: strconv.FormatUint(q.inode, 10)}
		if v.file() {
			v.off += uint64(at - uintptr(q.vmaStart))
		}
		out = append(out, v)
		at = v.hi
	}
	return out, true, nil
}

// vmas reads the mappings over [lo, hi), clipped to it; ok is false when
// some of the range is not mapped.
func (p *Pages) vmas(lo, hi uintptr) ([]vma, bool, error) {
	if p.query != nil {
		return queryVMAs(p.query, lo, hi)
	}
	return readVMAs(lo, hi)
}

// Usable is nil when p keeps registrations, else why it does not.
func (p *Pages) Usable() error { return p.usable }

func selfTest(page int) error {
	b, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("hw/rdma: lasting registrations: %w", err)
	}
	defer syscall.Munmap(b)
	if err := syscall.Madvise(b[:page], madvCold); err != nil {
		return fmt.Errorf("hw/rdma: lasting registrations: madvise(MADV_COLD) of unlocked memory: %w", err)
	}
	if err := syscall.Mlock(b[:page]); err != nil {
		return fmt.Errorf("hw/rdma: lasting registrations: mlock: %w", err)
	}
	if err := syscall.Madvise(b[:page], madvCold); err != syscall.EINVAL {
		return fmt.Errorf("hw/rdma: lasting registrations: madvise(MADV_COLD) of locked memory gave %v, not EINVAL", err)
	}
	if err := syscall.Madvise(b[page:], madvCold); err != nil {
		return fmt.Errorf("hw/rdma: lasting registrations: madvise(MADV_COLD) beside locked memory: %w", err)
	}
	return nil
}

// vma is one line of /proc/self/maps, clipped to the range asked for.
type vma struct {
	lo, hi     uintptr
	perm       string
	off        uint64 // file offset at lo (file mappings)
	dev, inode string
	path       string
}

func (v vma) file() bool { return v.inode != "0" }

// same reports whether v and w are the same mapping where they overlap.
func (v vma) same(w vma) bool {
	if v.perm != w.perm || v.dev != w.dev || v.inode != w.inode || v.path != w.path {
		return false
	}
	// A file mapping maps address a to offset off+(a-lo); a new mapping of
	// the same file elsewhere in it differs. (Anonymous lines say 0.)
	return !v.file() || v.off-uint64(v.lo) == w.off-uint64(w.lo)
}

// readVMAs reads the mappings over [lo, hi) from /proc/self/maps, clipped
// to it; ok is false when some of the range is not mapped.
func readVMAs(lo, hi uintptr) ([]vma, bool, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	var out []vma
	at := lo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() && at < hi {
		v, err := parseMaps(sc.Bytes())
		if err != nil {
			return nil, false, err
		}
		if v.hi <= at {
			continue
		}
		if v.lo > at {
			return nil, false, nil // a hole
		}
		if v.file() {
			v.off += uint64(at - v.lo)
		}
		v.lo, v.hi = at, min(v.hi, hi)
		out = append(out, v)
		at = v.hi
	}
	if err := sc.Err(); err != nil {
		return nil, false, err
	}
	return out, at >= hi, nil
}

// parseMaps parses "lo-hi perm off dev inode [path]".
func parseMaps(line []byte) (vma, error) {
	var v vma
	fields := bytes.Fields(line)
	if len(fields) < 5 {
		return v, fmt.Errorf("hw/rdma: /proc/self/maps line %q", line)
	}
	a, b, ok := bytes.Cut(fields[0], []byte("-"))
	lo, err1 := strconv.ParseUint(string(a), 16, 64)
	hi, err2 := strconv.ParseUint(string(b), 16, 64)
	off, err3 := strconv.ParseUint(string(fields[2]), 16, 64)
	if !ok || errors.Join(err1, err2, err3) != nil {
		return v, fmt.Errorf("hw/rdma: /proc/self/maps line %q", line)
	}
	v.lo, v.hi, v.off = uintptr(lo), uintptr(hi), off
	v.perm, v.dev, v.inode = string(fields[1]), string(fields[3]), string(fields[4])
	if len(fields) > 5 {
		v.path = string(bytes.Join(fields[5:], []byte(" ")))
	}
	return v, nil
}

// locked reports whether every mapping in vs is locked.
func locked(vs []vma) bool {
	for _, v := range vs {
		if memcall(syscall.SYS_MADVISE, v.lo, v.hi-v.lo, madvCold) != syscall.EINVAL {
			return false
		}
	}
	return true
}

// memcall makes a memory system call on an address range (madvise with
// advice, mlock, munlock) on raw addresses: the memory is the
// application's, never Go's to slice.
func memcall(trap, addr, n, arg uintptr) error {
	if _, _, e := syscall.Syscall(trap, addr, n, arg); e != 0 {
		return e
	}
	return nil
}

// Hold locks the pages of [addr, addr+n) for a registration that is to
// outlive its use and records their mappings; ok is false when it cannot
// be kept (see Pages).
func (p *Pages) Hold(addr, n uintptr) (Held, bool) {
	if p == nil || p.usable != nil || n == 0 {
		return nil, false
	}
	lo, hi := addr&^(p.page-1), (addr+n+p.page-1)&^(p.page-1)
	p.mu.Lock()
	defer p.mu.Unlock()
	vs, ok, err := p.vmas(lo, hi)
	if err != nil || !ok {
		return nil, false
	}
	for _, v := range vs {
		if v.perm[0] != 'r' || v.perm[1] != 'w' {
			return nil, false
		}
	}
	// The pages no holder of p has locked must not be locked by anyone
	// else: a fresh mapping there would pass the check.
	fresh := p.uncountedLocked(lo, hi)
	for _, r := range fresh {
		for _, v := range vs {
			if a, b := max(v.lo, r.lo), min(v.hi, r.hi); a < b && memcall(syscall.SYS_MADVISE, a, b-a, madvCold) != nil {
				return nil, false
			}
		}
	}
	for i, r := range fresh {
		if err := memcall(syscall.SYS_MLOCK, r.lo, r.hi-r.lo, 0); err != nil {
			for _, d := range fresh[:i] {
				memcall(syscall.SYS_MUNLOCK, d.lo, d.hi-d.lo, 0)
			}
			return nil, false
		}
	}
	p.countLocked(lo, hi, 1)
	return &heldPages{p: p, lo: lo, hi: hi, vs: vs}, true
}

type heldPages struct {
	p      *Pages
	lo, hi uintptr
	vs     []vma
	once   sync.Once
}

// Still reports whether the range still holds the pages it held at Hold.
func (h *heldPages) Still() bool {
	vs, ok, err := h.p.vmas(h.lo, h.hi)
	if err != nil || !ok || !locked(vs) {
		return false
	}
	for _, v := range vs {
		for _, w := range h.vs {
			if v.lo < w.hi && w.lo < v.hi && !v.same(w) {
				return false
			}
		}
	}
	return true
}

// Release gives up the hold: page ranges no other holder of its Pages
// needs are unlocked.
func (h *heldPages) Release() {
	h.once.Do(func() {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		for _, r := range h.p.countLocked(h.lo, h.hi, -1) {
			// ENOMEM where the memory is gone: nothing to unlock.
			memcall(syscall.SYS_MUNLOCK, r.lo, r.hi-r.lo, 0)
		}
	})
}

// uncountedLocked returns the parts of [lo, hi) that no holder counts.
func (p *Pages) uncountedLocked(lo, hi uintptr) []pageSeg {
	var out []pageSeg
	at := lo
	for _, s := range p.segs {
		if s.hi <= at || s.lo >= hi {
			continue
		}
		if s.lo > at {
			out = append(out, pageSeg{lo: at, hi: s.lo})
		}
		at = s.hi
	}
	if at < hi {
		out = append(out, pageSeg{lo: at, hi: hi})
	}
	return out
}

// countLocked adds d holders to [lo, hi) and returns the parts whose count
// fell to 0.
func (p *Pages) countLocked(lo, hi uintptr, d int) []pageSeg {
	// Split at lo and hi, fill the gaps, then adjust and drop the zeros.
	var segs []pageSeg
	at := lo
	for _, s := range p.segs {
		if s.hi <= lo || s.lo >= hi {
			segs = append(segs, s)
			continue
		}
		if s.lo < lo {
			segs = append(segs, pageSeg{s.lo, lo, s.n})
			s.lo = lo
		}
		if s.lo > at {
			segs = append(segs, pageSeg{at, s.lo, 0})
		}
		tail := s.hi > hi
		end := min(s.hi, hi)
		segs = append(segs, pageSeg{s.lo, end, s.n})
		if tail {
			segs = append(segs, pageSeg{hi, s.hi, s.n})
		}
		at = end
	}
	if at < hi {
		segs = append(segs, pageSeg{at, hi, 0})
	}
	sortSegs(segs)
	var out []pageSeg
	keep := segs[:0]
	for _, s := range segs {
		if s.lo >= lo && s.hi <= hi {
			s.n += d
		}
		if s.n <= 0 {
			if s.lo >= lo && s.hi <= hi {
				out = append(out, s)
			}
			continue
		}
		if k := len(keep); k > 0 && keep[k-1].hi == s.lo && keep[k-1].n == s.n {
			keep[k-1].hi = s.hi
			continue
		}
		keep = append(keep, s)
	}
	p.segs = keep
	return out
}

func sortSegs(s []pageSeg) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].lo < s[j-1].lo; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
