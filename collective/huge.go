package collective

import (
	"sync"
	"unsafe"

	"github.com/nexar-go/nexar/internal/hugepage"
)

// mapped records the buffers mapHuge made (by address), so that ScratchPool.Put
// tells them from heap buffers of the same class (the fallback).
var mapped sync.Map

// mapHuge maps n bytes advised for huge pages, or returns nil.
func mapHuge(n int) []byte {
	b := hugepage.Map(n)
	if b != nil {
		mapped.Store(unsafe.SliceData(b), struct{}{})
	}
	return b
}

func isMapped(b []byte) bool {
	_, ok := mapped.Load(unsafe.SliceData(b))
	return ok
}

func unmapHuge(b []byte) {
	mapped.Delete(unsafe.SliceData(b))
	hugepage.Unmap(b)
}
