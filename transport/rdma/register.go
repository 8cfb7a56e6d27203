//go:build cgo

package rdma

import (
	"fmt"
	"runtime"
	"unsafe"

	hw "github.com/nexar-go/nexar/hw/rdma"
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

// register makes b reachable by the NIC for one operation. Host memory
// goes through the registration cache, whose registrations outlive the
// operation where hw/rdma's Pages can vouch for them before each reuse (the
// memory locked, its mappings unchanged: docs/bulk-path.md, "Registrations
// that last"); keep is false for a buffer that is not used again (a
// temporary), whose registration ends with the operation. Device memory
// goes through the GPU path (gpu.go).
func (d *Device) register(b []byte, recv, keep bool) (*region, error) {
	if r, ok, err := d.gpu.register(b, recv); ok || err != nil {
		return r, err
	}
	return d.registerHost(b, keep)
}

func (d *Device) registerHost(b []byte, keep bool) (*region, error) {
	var pin runtime.Pinner
	pin.Pin(&b[0]) // a no-op for memory outside the Go heap
	a, n := uintptr(unsafe.Pointer(&b[0])), uintptr(len(b))
	acquire := d.reg.Acquire
	if !keep {
		acquire = d.reg.AcquireOnce
	}
	h, err := acquire(a, n)
	if err != nil {
		pin.Unpin()
		return nil, fmt.Errorf("registering %d bytes at %#x: %w", n, a, err)
	}
	mr := h.Value()
	return &region{addr: uint64(a), lkey: mr.LKey, rkey: mr.RKey, finish: func() error { return nil },
		release: func() {
			h.Release()
			pin.Unpin()
		}}, nil
}

// Prepare registers host buffer b whole, to last, where registrations
// last (Pages vouches for them), so that the pieces of it a call then
// sends and receives share that registration instead of each making its
// own (bulk.RDMA). A buffer below WriteMin (its pieces go through the
// slots, never registered) and device memory are left alone; a failure
// is only logged: each piece then registers for itself. Safe for
// concurrent use.
func (d *Device) Prepare(b []byte) {
	if len(b) < d.opt.WriteMin || d.gpu.isDevice(b) || hw.ProcessPages().Usable() != nil {
		return
	}
	a, n := uintptr(unsafe.Pointer(&b[0])), uintptr(len(b))
	if _, err := d.reg.Keep(a, n); err != nil {
		d.log.Debug("nexar: rdma: registering a buffer whole", "dev", d.desc, "bytes", n, "err", err)
	}
}

// Forget drops the registrations of host buffer b's range, whose memory
// is about to be given back (a slab of core's pools let go): a kept
// registration would otherwise pin and lock its pages until evicted. One
// in use by an operation goes when that operation ends (RegCache's
// Invalidate). Safe for concurrent use.
func (d *Device) Forget(b []byte) {
	if len(b) == 0 || d.gpu.isDevice(b) {
		return
	}
	d.reg.Invalidate(uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
}

// RegStats says what the device's registration cache of host memory did:
// registrations made, uses served by one made before, and registrations
// dropped because their memory had changed. Safe for concurrent use.
func (d *Device) RegStats() hw.RegStats { return d.reg.Stats() }

// Registrations says, for `nexar info`, how long registrations of host
// buffers last on this machine: across operations (docs/bulk-path.md,
// "Registrations that last"), or one operation and why. Safe for
// concurrent use.
func (d *Device) Registrations() string {
	if err := hw.ProcessPages().Usable(); err != nil {
		return "host buffers registered per operation (" + err.Error() + ")"
	}
	return "host buffers' registrations kept across operations while their pages stay locked and mapped"
}
