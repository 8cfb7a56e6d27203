//go:build cgo

package main

import (
	"testing"
	"unsafe"
)

// BenchmarkBufHost is what a host buffer pays in a.buf and a.run with no
// CUDA runtime in the process (the common case): the device check is one
// atomic load.
func BenchmarkBufHost(b *testing.B) {
	var x [8]byte
	p := unsafe.Pointer(&x[0])
	for b.Loop() {
		a := args{fn: "bench"}
		a.allowDevice(false, nil)
		s := a.buf("sendbuf", p, 8)
		r := a.buf("recvbuf", p, 8)
		if a.callWithBuffers(func() error { return nil }) != resSuccess || len(s)+len(r) != 16 {
			b.Fatal("unexpected")
		}
	}
}
