package rdma

import "errors"

// GPUMemory is what the channel needs of a GPU runtime: which buffers are
// device memory, a dma-buf for a device range, and copies for the staged
// path. CUDA (below) adapts hw/cuda. Implementations are safe for
// concurrent use.
type GPUMemory interface {
	// IsDevice reports whether addr is device memory.
	IsDevice(addr uintptr) bool
	// DmaBuf exports [addr, addr+n) (page aligned) as a dma-buf: the fd
	// and the range's offset in it. ErrGPUNotSupported when the driver or
	// kernel cannot.
	DmaBuf(addr, n uintptr) (fd int, offset uint64, err error)
	CopyToHost(dst []byte, src uintptr) error
	CopyToDevice(dst uintptr, src []byte) error
}

// ErrGPUNotSupported is what a GPUMemory's DmaBuf returns (wrapped) where
// the driver has no dma-buf export.
var ErrGPUNotSupported = errors.New("transport/rdma: not supported by the GPU driver")

// How a device buffer reached the NIC.
const (
	WayDmaBuf = "dma-buf"
	WayPeer   = "peer memory"
	WayStaged = "staged"
)
