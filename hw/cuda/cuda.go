// Package cuda is nexar's device layer: a device runtime reached through
// the adapter table of the C ABI (include/nexar.h, nexar_device_adapter_t),
// of which the CUDA runtime, loaded at run time with dlopen so that nexar
// builds and runs with no CUDA installed, is one implementation.
//
// Only what a collective library needs is in the table: the device count,
// device and page-locked host memory, synchronous and stream-ordered
// copies, streams and events, a pointer query to tell device pointers from
// host ones (hw/cuda/stage builds staging on these), and optionally a
// dma-buf export. No CUDA header is needed to build: the few function
// types are declared here. The CUDA runtime is looked up as the configured
// path (capi: NEXAR_CUDART), then libcudart.so, libcudart.so.13, .12 and
// .11.0 on the dynamic linker's path, then among the objects the process
// has loaded (FindLoaded: torch's bundled runtime, a renamed one); the
// CUDA driver (libcuda.so.1) can classify pointers where no runtime is
// reachable (Driver).
//
// A Runtime is one device runtime (Default: the process-wide CUDA runtime,
// loaded once on first use; Open: a given path; InProcess: the one the
// process has loaded already, if any; FromAdapter and LoadAdapter: a table
// another GPU runtime supplies). The package-level functions use Default.
// Device pointers are carried as DevicePtr (a uintptr), never as Go
// pointers. All functions are safe for concurrent use (the CUDA runtime is
// thread-safe, and an adapter's table must be).
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

// Error is a device runtime's error code with its message. Func is the
// CUDA function for a CUDA runtime, else the adapter's name and entry.
type Error struct {
	Func    string
	Code    int
	Msg     string
	Runtime string // "cuda", or the adapter's name
}

func (e *Error) Error() string {
	if e.Runtime == "" || e.Runtime == "cuda" {
		return fmt.Sprintf("hw/cuda: %s: %s (cudaError %d)", e.Func, e.Msg, e.Code)
	}
	return fmt.Sprintf("hw/cuda: %s: %s (%s error %d)", e.Func, e.Msg, e.Runtime, e.Code)
}
