//go:build !cgo

package nccl

import (
	"fmt"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/hw/cuda"
)

var errNoCgo = fmt.Errorf("%w (built without cgo)", ErrNoLibrary)

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
func (c *Comm) AllReduce(send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op, stream uintptr) error {
	return errNoCgo
}

// Close fails: a build without cgo cannot dlopen.
func (c *Comm) Close() error { return errNoCgo }
