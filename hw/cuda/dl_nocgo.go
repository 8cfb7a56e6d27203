//go:build !cgo

package cuda

import "fmt"

var errNoCgo = fmt.Errorf("%w (built without cgo)", ErrNoLibrary)

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
