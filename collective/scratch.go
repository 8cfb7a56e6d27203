package collective

import (
	"math/bits"
	"sync"
)

// Scratch buffers for the schedules' temporaries (receive staging, partial
// results). Allocating them per call costs more than the data they hold at
// large sizes: fresh pages are zeroed and faulted in, and the garbage drives
// the GC. Buffers are pooled per power-of-two size class; a sync.Pool lets
// the GC reclaim idle ones, so the pool holds at most what recent calls
// used at once (in practice the largest message plus a little).

const (
	minScratchClass = 9  // 512 B: smaller buffers are cheap to allocate
	maxScratchClass = 34 // 16 GiB
)

var scratchPools [maxScratchClass + 1]sync.Pool

// Buffers of hugeClass and up are mapped outside the Go heap, on 2 MiB
// pages where the kernel offers them (madvise(MADV_HUGEPAGE), as numpy and
// glibc do for large arrays): copying and reducing tens of megabytes over
// 4 KiB pages costs up to twice as much in TLB misses, and the kernel pins
// the pages of a cross-memory copy one by one. They cannot go in a
// sync.Pool (nothing would unmap what it drops), so each class keeps at
// most hugeIdle idle buffers and unmaps the rest.
const (
	hugeClass = 21 // 2 MiB
	hugeIdle  = 2
)

var hugeFree struct {
	sync.Mutex
	idle [maxScratchClass + 1][][]byte
}

// getScratch returns a buffer of n bytes with undefined contents; give it
// back with putScratch when no goroutine uses it any more.
func getScratch(n int) []byte {
	c := scratchClass(n)
	if c < 0 {
		return make([]byte, n)
	}
	if c >= hugeClass {
		hugeFree.Lock()
		if k := len(hugeFree.idle[c]); k > 0 {
			b := hugeFree.idle[c][k-1]
			hugeFree.idle[c] = hugeFree.idle[c][:k-1]
			hugeFree.Unlock()
			return b[:n]
		}
		hugeFree.Unlock()
		if b := mapHuge(1 << c); b != nil {
			return b[:n]
		}
		return make([]byte, n, 1<<c)
	}
	if p, ok := scratchPools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<c)
}

// putScratch returns b, which came from getScratch, to its pool.
func putScratch(b []byte) {
	c := scratchClass(cap(b))
	if c < 0 || cap(b) != 1<<c {
		return
	}
	b = b[:cap(b)]
	if c >= hugeClass && isMapped(b) {
		hugeFree.Lock()
		if len(hugeFree.idle[c]) < hugeIdle {
			hugeFree.idle[c] = append(hugeFree.idle[c], b)
			b = nil
		}
		hugeFree.Unlock()
		if b != nil {
			unmapHuge(b)
		}
		return
	}
	bb := b // a fresh variable: taking b's own address would move b to the heap on every call
	scratchPools[c].Put(&bb)
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

// Scratch returns a pooled buffer of n bytes with undefined contents, for
// callers outside this package that stage data for a schedule (core's
// bucketed allreduce); give it back with ReleaseScratch.
func Scratch(n int) []byte { return getScratch(n) }

// ReleaseScratch returns a buffer from Scratch once nothing uses it.
func ReleaseScratch(b []byte) { putScratch(b) }
