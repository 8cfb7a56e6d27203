//go:build !cgo

package rdma

import (
	"errors"

	hw "github.com/nexar-go/nexar/hw/rdma"
)

var errNoCgo = errors.New("transport/rdma: unavailable: built without cgo")

// Device cannot be opened without cgo; no value of it exists.
type Device struct{}

// Open fails: a build without cgo cannot load libibverbs.
func Open(Options) (*Device, error) { return nil, errNoCgo }

// Describe is empty: no device.
func (d *Device) Describe() string { return "" }

// Listen fails: no device.
func (d *Device) Listen(int) (Channel, []byte, error) { return nil, nil, errNoCgo }

// Dial fails: no device.
func (d *Device) Dial(int, []byte) (Channel, []byte, error) { return nil, nil, errNoCgo }

// GPU reports false, false: no device.
func (d *Device) GPU() (moves, direct bool) { return false, false }

// Prepare does nothing: no device.
func (d *Device) Prepare([]byte) {}

// Forget does nothing without cgo.
func (d *Device) Forget([]byte) {}

// Close does nothing: no device.
func (d *Device) Close() error { return nil }

// RegStats is zero: no device.
func (d *Device) RegStats() hw.RegStats { return hw.RegStats{} }

// Registrations says that a build without cgo registers nothing.
func (d *Device) Registrations() string { return "no registrations: built without cgo" }
