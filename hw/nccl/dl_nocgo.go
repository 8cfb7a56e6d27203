//go:build !cgo

package nccl

import (
	"fmt"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/internal/dtype"
)

var errNoCgo = fmt.Errorf("%w (built without cgo)", ErrNoLibrary)

// Library cannot be loaded without cgo; no value of it exists.
type Library struct{}

// Default fails: a build without cgo cannot dlopen.
func Default() (*Library, error) { return nil, errNoCgo }

// Open fails: a build without cgo cannot dlopen.
func Open(path string) (*Library, error) { return nil, errNoCgo }

// Path is empty: no library is loaded.
func (l *Library) Path() string { return "" }

// Version fails: a build without cgo cannot dlopen.
func (l *Library) Version() (int, error) { return 0, errNoCgo }

// NewUniqueID fails: a build without cgo cannot dlopen.
func (l *Library) NewUniqueID() (UniqueID, error) { return UniqueID{}, errNoCgo }

// NewComm fails: a build without cgo cannot dlopen.
func (l *Library) NewComm(id UniqueID, n, rank int) (*Comm, error) { return nil, errNoCgo }

// Group fails: a build without cgo cannot dlopen.
func (l *Library) Group(fn func() error) error { return errNoCgo }

// LibraryVersion fails: a build without cgo cannot dlopen.
func LibraryVersion() (int, error) { return 0, errNoCgo }

// Available says why NCCL cannot be used.
func Available() error { return errNoCgo }

// NewUniqueID fails: a build without cgo cannot dlopen.
func NewUniqueID() (UniqueID, error) { return UniqueID{}, errNoCgo }

// Comm is an NCCL communicator; none can exist in a build without cgo.
type Comm struct{}

// NewComm fails: a build without cgo cannot dlopen.
func NewComm(id UniqueID, n, rank int) (*Comm, error) { return nil, errNoCgo }

// AllReduce fails: a build without cgo cannot dlopen.
func (c *Comm) AllReduce(send, recv cuda.DevicePtr, count int, dt dtype.DType, op dtype.Op, stream cuda.Stream) error {
	return errNoCgo
}

// Reduce fails: a build without cgo cannot dlopen.
func (c *Comm) Reduce(send, recv cuda.DevicePtr, count int, dt dtype.DType, op dtype.Op, root int, stream cuda.Stream) error {
	return errNoCgo
}

// Broadcast fails: a build without cgo cannot dlopen.
func (c *Comm) Broadcast(send, recv cuda.DevicePtr, count int, dt dtype.DType, root int, stream cuda.Stream) error {
	return errNoCgo
}

// AllGather fails: a build without cgo cannot dlopen.
func (c *Comm) AllGather(send, recv cuda.DevicePtr, sendcount int, dt dtype.DType, stream cuda.Stream) error {
	return errNoCgo
}

// ReduceScatter fails: a build without cgo cannot dlopen.
func (c *Comm) ReduceScatter(send, recv cuda.DevicePtr, recvcount int, dt dtype.DType, op dtype.Op, stream cuda.Stream) error {
	return errNoCgo
}

// AsyncError fails: a build without cgo cannot dlopen.
func (c *Comm) AsyncError() error { return errNoCgo }

// Abort fails: a build without cgo cannot dlopen.
func (c *Comm) Abort() error { return errNoCgo }

// Close fails: a build without cgo cannot dlopen.
func (c *Comm) Close() error { return errNoCgo }

// HasP2P is false without cgo.
func (l *Library) HasP2P() bool { return false }

// Send fails: a build without cgo cannot reach NCCL.
func (c *Comm) Send(buf cuda.DevicePtr, count int, dt dtype.DType, peer int, stream cuda.Stream) error {
	return errNoCgo
}

// Recv fails: a build without cgo cannot reach NCCL.
func (c *Comm) Recv(buf cuda.DevicePtr, count int, dt dtype.DType, peer int, stream cuda.Stream) error {
	return errNoCgo
}
