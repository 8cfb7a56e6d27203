//go:build cgo

package rdma

import (
	"fmt"
	"runtime"
	"unsafe"
)

// region is a buffer as the NIC reaches it: registered, or (device memory
// without GPUDirect) a registered host buffer staged to and from it.
type region struct {
	addr    uint64
	lkey    uint32
	rkey    uint32
	finish  func() error // after a receive: copy a staged buffer to the device
	release func()
}

// register makes b reachable by the NIC for the length of one operation.
// Host memory is registered through the registration cache and the
// registration dropped afterwards: a buffer's pages may be freed and
// reused once the operation returns (the Go heap, a caller's allocator),
// and a registration kept across that would pin the old pages, so the
// NIC would read and write memory the process no longer has at that
// address. Device memory goes through the GPU path (gpu.go).
func (d *Device) register(b []byte, recv bool) (*region, error) {
	if r, ok, err := d.gpu.register(b, recv); ok || err != nil {
		return r, err
	}
	return d.registerHost(b)
}

func (d *Device) registerHost(b []byte) (*region, error) {
	var pin runtime.Pinner
	pin.Pin(&b[0]) // a no-op for memory outside the Go heap
	a, n := uintptr(unsafe.Pointer(&b[0])), uintptr(len(b))
	h, err := d.reg.Acquire(a, n)
	if err != nil {
		pin.Unpin()
		return nil, fmt.Errorf("registering %d bytes at %#x: %w", n, a, err)
	}
	mr := h.Value()
	return &region{addr: uint64(a), lkey: mr.LKey, rkey: mr.RKey, finish: func() error { return nil },
		release: func() {
			h.Release()
			d.reg.Invalidate(a, n)
			pin.Unpin()
		}}, nil
}
