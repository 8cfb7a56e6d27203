package stage

import "unsafe"

// sliceData is the address of b's first byte (pinned memory outside the Go
// heap, so the address stays valid).
func sliceData(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
