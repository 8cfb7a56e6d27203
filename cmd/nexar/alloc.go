package main

import "github.com/nexar-go/nexar/internal/hugepage"

// benchAlloc returns a buffer of n bytes and a function that frees it.
// Buffers of 2 MiB and more are mapped on huge pages where the kernel
// offers them, as numpy and glibc malloc do for large arrays, so that the
// benchmark measures nexar and not the Go heap's 4 KiB pages.
func benchAlloc(n int) ([]byte, func()) {
	if n >= 2<<20 {
		if b := hugepage.Map(n); b != nil {
			return b, func() { hugepage.Unmap(b) }
		}
	}
	return make([]byte, n), func() {}
}
