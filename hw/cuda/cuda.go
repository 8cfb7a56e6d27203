// Package cuda is nexar's optional binding to the CUDA runtime, loaded at run
// time with dlopen so that nexar builds and runs with no CUDA installed.
//
// Only what a collective library needs is bound: the device count, device
// and page-locked host memory, synchronous and stream-ordered copies,
// streams and events, and cudaPointerGetAttributes to tell device pointers
// from host ones (hw/cuda/stage builds staging on these). No CUDA header is needed to build: the few
// function types are declared here. The library is looked up as
// the configured path (capi: NEXAR_CUDART), then libcudart.so, libcudart.so.13, .12 and .11.0 on the
// dynamic linker's path.
//
// A Runtime is one loaded library (Default: the process-wide one, loaded
// once on first use; Open: a given path; InProcess: the one the process has
// loaded already, if any). The package-level functions use Default.
// Device pointers are carried as DevicePtr (a uintptr), never as Go
// pointers. All functions are safe for concurrent use (the CUDA runtime is
// thread-safe).
package cuda

import (
	"errors"
	"fmt"
)

// DevicePtr is an address in the CUDA unified address space.
type DevicePtr uintptr

// MemoryType is what cudaPointerGetAttributes says an address is.
type MemoryType int

// Values of cudaMemoryType (CUDA 11 and later).
const (
	Unregistered MemoryType = 0 // plain host memory, unknown to CUDA
	Host         MemoryType = 1 // page-locked host memory
	Device       MemoryType = 2
	Managed      MemoryType = 3
)

func (m MemoryType) String() string {
	switch m {
	case Unregistered:
		return "unregistered"
	case Host:
		return "host"
	case Device:
		return "device"
	case Managed:
		return "managed"
	}
	return fmt.Sprintf("memorytype(%d)", int(m))
}

// OnDevice reports whether memory of this type must be reached through CUDA
// (copies or NCCL) rather than read directly by the host.
func (m MemoryType) OnDevice() bool { return m == Device }

// ErrNoLibrary is returned (wrapped) when libcudart cannot be loaded.
var ErrNoLibrary = errors.New("hw/cuda: libcudart.so not found")

// ErrNoDevice is returned (wrapped) when the runtime loads but sees no GPU.
var ErrNoDevice = errors.New("hw/cuda: no CUDA device")

// libNames is Default's dlopen search order.
var libNames = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}

// MemcpyKind is cudaMemcpyKind: the direction of a copy.
type MemcpyKind int

// Values of cudaMemcpyKind.
const (
	MemcpyHostToHost     MemcpyKind = 0
	MemcpyHostToDevice   MemcpyKind = 1
	MemcpyDeviceToHost   MemcpyKind = 2
	MemcpyDeviceToDevice MemcpyKind = 3
	MemcpyDefault        MemcpyKind = 4 // unified addressing infers the direction
)

// Stream is a cudaStream_t, carried opaquely. Zero is the legacy default
// stream.
type Stream uintptr

// Event is a cudaEvent_t, carried opaquely.
type Event uintptr

// errNotReady is cudaErrorNotReady: an event or stream with work pending.
const errNotReady = 600

// Error is a CUDA runtime error code with its message.
type Error struct {
	Func string
	Code int
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("hw/cuda: %s: %s (cudaError %d)", e.Func, e.Msg, e.Code)
}
