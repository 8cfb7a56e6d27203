package hugepage

import "syscall"

// Map returns n bytes of zeroed anonymous memory advised for huge pages, or
// nil when the mapping fails (the caller falls back to the heap).
func Map(n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // advice only: 4 KiB pages otherwise
	return b
}

// Unmap releases a buffer Map returned.
func Unmap(b []byte) { _ = syscall.Munmap(b) }
