//go:build !cgo

package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

var errNoCgo = fmt.Errorf("%w (built without cgo)", ErrNoLibrary)

// Runtime cannot be loaded without cgo; no value of it exists, and no
// constructor returns one. Its methods are the cgo build's, so that the
// packages above it build either way; each fails as the constructors do.
type Runtime struct{}

// Path is empty: no library was loaded.
func (l *Runtime) Path() string { return "" }

// Name is empty: no runtime was loaded.
func (l *Runtime) Name() string { return "" }

// IsCUDA is false: no runtime was loaded.
func (l *Runtime) IsCUDA() bool { return false }

// DeviceCount fails: a build without cgo cannot call C.
func (l *Runtime) DeviceCount() (int, error) { return 0, errNoCgo }

// SetDevice fails: a build without cgo cannot call C.
func (l *Runtime) SetDevice(dev int) error { return errNoCgo }

// GetDevice fails: a build without cgo cannot call C.
func (l *Runtime) GetDevice() (int, error) { return -1, errNoCgo }

// Malloc fails: a build without cgo cannot call C.
func (l *Runtime) Malloc(n int) (DevicePtr, error) { return 0, errNoCgo }

// Free fails: a build without cgo cannot call C.
func (l *Runtime) Free(p DevicePtr) error { return errNoCgo }

// MallocHost fails: a build without cgo cannot call C.
func (l *Runtime) MallocHost(n int) ([]byte, error) { return nil, errNoCgo }

// FreeHost fails: a build without cgo cannot call C.
func (l *Runtime) FreeHost(b []byte) error { return errNoCgo }

// CopyToDevice fails: a build without cgo cannot call C.
func (l *Runtime) CopyToDevice(dst DevicePtr, src []byte) error { return errNoCgo }

// CopyFromDevice fails: a build without cgo cannot call C.
func (l *Runtime) CopyFromDevice(dst []byte, src DevicePtr) error { return errNoCgo }

// Memcpy fails: a build without cgo cannot call C.
func (l *Runtime) Memcpy(dst, src DevicePtr, n int) error { return errNoCgo }

// MemcpyAsync fails: a build without cgo cannot call C.
func (l *Runtime) MemcpyAsync(dst, src uintptr, n int, kind MemcpyKind, s Stream) error {
	return errNoCgo
}

// PointerType reports every address as unregistered host memory.
func (l *Runtime) PointerType(p uintptr) (MemoryType, int, error) { return Unregistered, -1, errNoCgo }

// StreamCreate fails: a build without cgo cannot call C.
func (l *Runtime) StreamCreate() (Stream, error) { return 0, errNoCgo }

// StreamDestroy fails: a build without cgo cannot call C.
func (l *Runtime) StreamDestroy(s Stream) error { return errNoCgo }

// StreamSynchronize fails: a build without cgo cannot call C.
func (l *Runtime) StreamSynchronize(s Stream) error { return errNoCgo }

// StreamWaitEvent fails: a build without cgo cannot call C.
func (l *Runtime) StreamWaitEvent(s Stream, ev Event) error { return errNoCgo }

// EventCreate fails: a build without cgo cannot call C.
func (l *Runtime) EventCreate() (Event, error) { return 0, errNoCgo }

// EventDestroy fails: a build without cgo cannot call C.
func (l *Runtime) EventDestroy(ev Event) error { return errNoCgo }

// EventRecord fails: a build without cgo cannot call C.
func (l *Runtime) EventRecord(ev Event, s Stream) error { return errNoCgo }

// EventQuery fails: a build without cgo cannot call C.
func (l *Runtime) EventQuery(ev Event) (bool, error) { return false, errNoCgo }

// Default fails: a build without cgo cannot dlopen.
func Default() (*Runtime, error) { return nil, errNoCgo }

// Open fails: a build without cgo cannot dlopen.
func Open(path string) (*Runtime, error) { return nil, errNoCgo }

// InProcess reports no runtime: without cgo none can be reached.
func InProcess(override string) (*Runtime, error) { return nil, nil }

// FindLoaded reports no runtime: without cgo none can be reached.
func FindLoaded() (*Runtime, error) { return nil, nil }

// AdapterError is a table that FromAdapter refuses.
type AdapterError struct{ Msg string }

func (e *AdapterError) Error() string { return "hw/cuda: device adapter: " + e.Msg }

// FromAdapter fails: a build without cgo cannot call C.
func FromAdapter(table unsafe.Pointer) (*Runtime, error) { return nil, errNoCgo }

// LoadAdapter fails: a build without cgo cannot dlopen.
func LoadAdapter(path, fill string) (*Runtime, error) { return nil, errNoCgo }

// Driver is the CUDA driver's pointer query; none without cgo.
type Driver struct{}

// LoadedDriver reports no driver without cgo.
func LoadedDriver() *Driver { return nil }

// PointerType cannot be answered without cgo.
func (d *Driver) PointerType(p uintptr) (MemoryType, int, error) { return Unregistered, -1, errNoCgo }

// Readable reports true: without cgo the probe is not built.
func Readable(p uintptr) bool { return true }

// LibraryPath fails: a build without cgo cannot dlopen.
func LibraryPath() (string, error) { return "", errNoCgo }

// DeviceCount fails: a build without cgo cannot dlopen.
func DeviceCount() (int, error) { return 0, errNoCgo }

// Available says why CUDA cannot be used.
func Available() error { return errNoCgo }

// Malloc fails: a build without cgo cannot dlopen.
func Malloc(n int) (DevicePtr, error) { return 0, errNoCgo }

// Free fails: a build without cgo cannot dlopen.
func Free(p DevicePtr) error { return errNoCgo }

// CopyToDevice fails: a build without cgo cannot dlopen.
func CopyToDevice(dst DevicePtr, src []byte) error { return errNoCgo }

// CopyFromDevice fails: a build without cgo cannot dlopen.
func CopyFromDevice(dst []byte, src DevicePtr) error { return errNoCgo }

// Memcpy fails: a build without cgo cannot dlopen.
func Memcpy(dst, src DevicePtr, n int) error { return errNoCgo }

// PointerType reports every address as Unregistered host memory.
func PointerType(p uintptr) (MemoryType, int, error) { return Unregistered, -1, errNoCgo }

// IsDevicePointer is always false without cgo.
func IsDevicePointer(p uintptr) bool { return false }

// ErrNotSupported is what DmaBuf returns where the driver cannot export.
var ErrNotSupported = errors.New("hw/cuda: not supported by the device driver")

// DmaBuf fails: a build without cgo cannot reach the driver.
func (l *Runtime) DmaBuf(p DevicePtr, n int) (int, error) { return -1, errNoCgo }

// DmaBufAt fails: a build without cgo cannot reach the driver.
func (l *Runtime) DmaBufAt(p DevicePtr, n int) (int, uint64, error) { return -1, 0, errNoCgo }
