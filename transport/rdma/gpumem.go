package rdma

import (
	"errors"

	"github.com/nexar-go/nexar/transport"
)

// GPUMemory is what the channel needs of a GPU runtime
// (transport.GPUMemory); CUDA adapts hw/cuda.
type GPUMemory = transport.GPUMemory

// ErrGPUNotSupported is what a GPUMemory's DmaBuf returns (wrapped) where
// the driver has no dma-buf export.
var ErrGPUNotSupported = errors.New("transport/rdma: not supported by the GPU driver")

// How a device buffer reached the NIC.
const (
	WayDmaBuf = "dma-buf"
	WayPeer   = "peer memory"
	WayStaged = "staged"
)
