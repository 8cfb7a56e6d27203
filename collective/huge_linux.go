package collective

import (
	"sync"
	"syscall"
	"unsafe"
)

// mapped records the buffers mapHuge made (by address), so that putScratch
// tells them from heap buffers of the same class (the fallback).
var mapped sync.Map

// mapHuge maps n bytes of anonymous memory advised for huge pages, or
// returns nil.
func mapHuge(n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // advice only: 4 KiB pages otherwise
	mapped.Store(unsafe.SliceData(b), struct{}{})
	return b
}

func isMapped(b []byte) bool {
	_, ok := mapped.Load(unsafe.SliceData(b))
	return ok
}

func unmapHuge(b []byte) {
	mapped.Delete(unsafe.SliceData(b))
	_ = syscall.Munmap(b)
}
