package main

import "syscall"

// benchAlloc returns a buffer of n bytes and a function that frees it.
// Buffers of 2 MiB and more are mapped on huge pages where the kernel
// offers them (madvise), as numpy and glibc malloc do for large arrays, so
// that the benchmark measures nexar and not the Go heap's 4 KiB pages.
func benchAlloc(n int) ([]byte, func()) {
	if n >= 2<<20 {
		b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err == nil {
			_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
			return b, func() { _ = syscall.Munmap(b) }
		}
	}
	return make([]byte, n), func() {}
}
