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

// getScratch returns a buffer of n bytes with undefined contents; give it
// back with putScratch when no goroutine uses it any more.
func getScratch(n int) []byte {
	c := scratchClass(n)
	if c < 0 {
		return make([]byte, n)
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
	scratchPools[c].Put(&b)
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
