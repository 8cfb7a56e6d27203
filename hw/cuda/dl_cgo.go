//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>

// Declared here so that no CUDA header is needed. The layout is that of
// CUDA 11+ (type, device, devicePointer, hostPointer); the padding guards
// against additions in later versions.
typedef struct {
	int type;
	int device;
	void *devicePointer;
	void *hostPointer;
	char reserved[64];
} nx_cuda_ptr_attr;

typedef int (*nx_int_fn)(int *);
typedef int (*nx_setdev_fn)(int);
typedef int (*nx_malloc_fn)(void **, size_t);
typedef int (*nx_hostalloc_fn)(void **, size_t, unsigned int);
typedef int (*nx_free_fn)(void *);
typedef int (*nx_memcpy_fn)(void *, const void *, size_t, int);
typedef int (*nx_memcpy_async_fn)(void *, const void *, size_t, int, void *);
typedef int (*nx_attr_fn)(nx_cuda_ptr_attr *, const void *);
typedef const char *(*nx_errstr_fn)(int);
typedef int (*nx_create_fn)(void **, unsigned int);
typedef int (*nx_handle_fn)(void *);
typedef int (*nx_record_fn)(void *, void *);
typedef int (*nx_wait_fn)(void *, void *, unsigned int);
typedef int (*nx_void_fn)(void);

static int nx_int(void *f, int *n) { return ((nx_int_fn)f)(n); }
static int nx_setdev(void *f, int d) { return ((nx_setdev_fn)f)(d); }
static int nx_malloc(void *f, uintptr_t *p, size_t n) {
	void *q = NULL;
	int rc = ((nx_malloc_fn)f)(&q, n);
	*p = (uintptr_t)q;
	return rc;
}
static int nx_hostalloc(void *f, void **p, size_t n, unsigned int flags) {
	return ((nx_hostalloc_fn)f)(p, n, flags);
}
static int nx_free(void *f, uintptr_t p) { return ((nx_free_fn)f)((void *)p); }
static int nx_memcpy(void *f, uintptr_t dst, uintptr_t src, size_t n, int kind) {
	return ((nx_memcpy_fn)f)((void *)dst, (const void *)src, n, kind);
}
static int nx_memcpy_async(void *f, uintptr_t dst, uintptr_t src, size_t n, int kind, uintptr_t s) {
	return ((nx_memcpy_async_fn)f)((void *)dst, (const void *)src, n, kind, (void *)s);
}
static int nx_attr(void *f, uintptr_t p, int *type, int *dev) {
	nx_cuda_ptr_attr a = {0};
	int rc = ((nx_attr_fn)f)(&a, (const void *)p);
	*type = a.type;
	*dev = a.device;
	return rc;
}
static const char *nx_errstr(void *f, int code) { return ((nx_errstr_fn)f)(code); }
static int nx_create(void *f, uintptr_t *h, unsigned int flags) {
	void *q = NULL;
	int rc = ((nx_create_fn)f)(&q, flags);
	*h = (uintptr_t)q;
	return rc;
}
static int nx_handle(void *f, uintptr_t h) { return ((nx_handle_fn)f)((void *)h); }
static int nx_record(void *f, uintptr_t ev, uintptr_t s) { return ((nx_record_fn)f)((void *)ev, (void *)s); }
static int nx_wait(void *f, uintptr_t s, uintptr_t ev) { return ((nx_wait_fn)f)((void *)s, (void *)ev, 0); }
static int nx_void(void *f) { return ((nx_void_fn)f)(); }

// nx_loaded returns the handle of name if the process has it loaded
// already, without loading it.
static void *nx_loaded(const char *name) { return dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Runtime is one loaded CUDA runtime library: its entry points, resolved
// once. Safe for concurrent use (the CUDA runtime is thread-safe).
type Runtime struct {
	path string
	h    unsafe.Pointer // the dlopen handle
	drv  driverSyms     // driver entry points found on first use (dmabuf_cgo.go)
	f    struct {
		count, setDevice, getDevice, malloc, free, memcpy, attr, errstr, lastErr unsafe.Pointer
		hostAlloc, freeHost, memcpyAsync                                         unsafe.Pointer
		streamCreate, streamDestroy, streamSync, streamWait                      unsafe.Pointer
		eventCreate, eventDestroy, eventRecord, eventQuery, eventSync            unsafe.Pointer
	}
}

var (
	loadOnce sync.Once
	lib      *Runtime
	loadErr  error
)

func dlerror() string {
	if e := C.dlerror(); e != nil {
		return C.GoString(e)
	}
	return "unknown dlopen error"
}

// load opens the process-wide default runtime (Default), once.
func load() (*Runtime, error) {
	loadOnce.Do(func() {
		names := libNames
		var last string
		for _, n := range names {
			cn := C.CString(n)
			h := C.dlopen(cn, C.RTLD_NOW|C.RTLD_GLOBAL)
			C.free(unsafe.Pointer(cn))
			if h != nil {
				lib, loadErr = bind(h, n)
				return
			}
			last = dlerror()
		}
		loadErr = fmt.Errorf("%w (tried %s; name it with NEXAR_CUDART (core.Config.CUDARuntime); last error: %s)", ErrNoLibrary, strings.Join(names, ", "), last)
	})
	return lib, loadErr
}

// Default returns the process-wide runtime: the first of libcudart.so,
// .so.13, .so.12, .so.11.0 that loads. Loaded once. A runtime the
// configuration names (NEXAR_CUDART, core.Config.CUDARuntime) is loaded
// with Open or InProcess by whoever holds the configuration (capi).
func Default() (*Runtime, error) { return load() }

// Open loads the CUDA runtime (or a stand-in with the same entry points) at
// path. Opening the same path twice gives the same library (dlopen counts
// references); the Runtime holds it for the life of the process.
func Open(path string) (*Runtime, error) {
	cn := C.CString(path)
	// Local: its symbols must not interpose on another CUDA runtime the
	// process has loaded globally.
	h := C.dlopen(cn, C.RTLD_NOW|C.RTLD_LOCAL)
	C.free(unsafe.Pointer(cn))
	if h == nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrNoLibrary, path, dlerror())
	}
	return bind(h, path)
}

// InProcess returns the runtime the process uses already, without loading
// one: the library at override if it is not empty (loaded if need be: the
// operator named it, e.g. through NEXAR_CUDART), else whichever of the usual
// names the process has loaded (a CUDA program, or torch with CUDA, loads it
// at start). It returns nil and no error when the process has no CUDA
// runtime: then no pointer it holds can be device memory.
func InProcess(override string) (*Runtime, error) {
	if override != "" {
		return Open(override)
	}
	for _, n := range libNames {
		cn := C.CString(n)
		h := C.nx_loaded(cn)
		C.free(unsafe.Pointer(cn))
		if h != nil {
			return bind(h, n) // keeps the reference nx_loaded took
		}
	}
	return nil, nil
}

func bind(h unsafe.Pointer, path string) (*Runtime, error) {
	l := &Runtime{path: path, h: h}
	for _, s := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"cudaGetDeviceCount", &l.f.count}, {"cudaSetDevice", &l.f.setDevice}, {"cudaGetDevice", &l.f.getDevice},
		{"cudaMalloc", &l.f.malloc}, {"cudaFree", &l.f.free},
		{"cudaMemcpy", &l.f.memcpy}, {"cudaPointerGetAttributes", &l.f.attr},
		{"cudaGetErrorString", &l.f.errstr}, {"cudaGetLastError", &l.f.lastErr},
		{"cudaHostAlloc", &l.f.hostAlloc}, {"cudaFreeHost", &l.f.freeHost},
		{"cudaMemcpyAsync", &l.f.memcpyAsync},
		{"cudaStreamCreateWithFlags", &l.f.streamCreate}, {"cudaStreamDestroy", &l.f.streamDestroy},
		{"cudaStreamSynchronize", &l.f.streamSync}, {"cudaStreamWaitEvent", &l.f.streamWait},
		{"cudaEventCreateWithFlags", &l.f.eventCreate}, {"cudaEventDestroy", &l.f.eventDestroy},
		{"cudaEventRecord", &l.f.eventRecord}, {"cudaEventQuery", &l.f.eventQuery},
		{"cudaEventSynchronize", &l.f.eventSync},
	} {
		cs := C.CString(s.name)
		*s.dst = C.dlsym(h, cs)
		C.free(unsafe.Pointer(cs))
		if *s.dst == nil {
			return nil, fmt.Errorf("hw/cuda: %s lacks %s: %s", path, s.name, dlerror())
		}
	}
	return l, nil
}

func (l *Runtime) check(fn string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &Error{Func: fn, Code: int(rc), Msg: C.GoString(C.nx_errstr(l.f.errstr, rc))}
}

// Path is the name the library was loaded under.
func (l *Runtime) Path() string { return l.path }

// DeviceCount returns the number of visible devices (an error wrapping
// ErrNoDevice without a driver or GPU).
func (l *Runtime) DeviceCount() (int, error) {
	var n C.int
	if err := l.check("cudaGetDeviceCount", C.nx_int(l.f.count, &n)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	return int(n), nil
}

// SetDevice makes dev the calling OS thread's current device (callers lock
// the goroutine to its thread around work that depends on it).
func (l *Runtime) SetDevice(dev int) error {
	return l.check("cudaSetDevice", C.nx_setdev(l.f.setDevice, C.int(dev)))
}

// GetDevice returns the calling OS thread's current device.
func (l *Runtime) GetDevice() (int, error) {
	var d C.int
	if err := l.check("cudaGetDevice", C.nx_int(l.f.getDevice, &d)); err != nil {
		return -1, err
	}
	return int(d), nil
}

// Malloc allocates n bytes of device memory.
func (l *Runtime) Malloc(n int) (DevicePtr, error) {
	var p C.uintptr_t
	if err := l.check("cudaMalloc", C.nx_malloc(l.f.malloc, &p, C.size_t(n))); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// Free releases memory from Malloc.
func (l *Runtime) Free(p DevicePtr) error {
	return l.check("cudaFree", C.nx_free(l.f.free, C.uintptr_t(p)))
}

// MallocHost allocates n bytes of page-locked host memory (cudaHostAlloc,
// portable): outside the Go heap, valid until FreeHost.
func (l *Runtime) MallocHost(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("hw/cuda: MallocHost(%d): size must be positive", n)
	}
	var p unsafe.Pointer
	if err := l.check("cudaHostAlloc", C.nx_hostalloc(l.f.hostAlloc, &p, C.size_t(n), 1 /* cudaHostAllocPortable */)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// FreeHost releases memory from MallocHost.
func (l *Runtime) FreeHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return l.check("cudaFreeHost", C.nx_free(l.f.freeHost, C.uintptr_t(uintptr(unsafe.Pointer(&b[0])))))
}

// CopyToDevice copies src into device memory at dst (synchronously).
func (l *Runtime) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := l.check("cudaMemcpy", C.nx_memcpy(l.f.memcpy, C.uintptr_t(dst),
		C.uintptr_t(uintptr(unsafe.Pointer(&src[0]))), C.size_t(len(src)), C.int(MemcpyHostToDevice)))
	// Passed as an integer, src is not kept alive by the call: without
	// this the collector may free it while the runtime copies from it.
	runtime.KeepAlive(src)
	return err
}

// CopyFromDevice copies device memory at src into dst (synchronously).
func (l *Runtime) CopyFromDevice(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	err := l.check("cudaMemcpy", C.nx_memcpy(l.f.memcpy, C.uintptr_t(uintptr(unsafe.Pointer(&dst[0]))),
		C.uintptr_t(src), C.size_t(len(dst)), C.int(MemcpyDeviceToHost)))
	runtime.KeepAlive(dst) // as in CopyToDevice
	return err
}

// Memcpy copies n bytes between any two addresses CUDA knows (direction
// inferred through unified addressing), synchronously.
func (l *Runtime) Memcpy(dst, src DevicePtr, n int) error {
	return l.check("cudaMemcpy", C.nx_memcpy(l.f.memcpy, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(MemcpyDefault)))
}

// MemcpyAsync enqueues a copy of n bytes on stream s. Host memory on either
// side must be page-locked for the copy to be asynchronous, and must stay
// valid until the copy completes (an event recorded after it says when).
func (l *Runtime) MemcpyAsync(dst, src uintptr, n int, kind MemcpyKind, s Stream) error {
	if n == 0 {
		return nil
	}
	return l.check("cudaMemcpyAsync", C.nx_memcpy_async(l.f.memcpyAsync, C.uintptr_t(dst), C.uintptr_t(src),
		C.size_t(n), C.int(kind), C.uintptr_t(s)))
}

// PointerType says where p lives and on which device. A plain host address
// is Unregistered with no error.
func (l *Runtime) PointerType(p uintptr) (MemoryType, int, error) {
	var typ, dev C.int
	rc := C.nx_attr(l.f.attr, C.uintptr_t(p), &typ, &dev)
	if rc == 1 { // cudaErrorInvalidValue: pre-11 runtimes say this for host memory
		C.nx_void(l.f.lastErr) // clears the sticky last error
		return Unregistered, -1, nil
	}
	if err := l.check("cudaPointerGetAttributes", rc); err != nil {
		return Unregistered, -1, err
	}
	return MemoryType(typ), int(dev), nil
}

// StreamCreate makes a stream that does not synchronize with the legacy
// default stream (cudaStreamNonBlocking): nexar's own work is ordered by
// events only.
func (l *Runtime) StreamCreate() (Stream, error) {
	var h C.uintptr_t
	if err := l.check("cudaStreamCreateWithFlags", C.nx_create(l.f.streamCreate, &h, 1 /* cudaStreamNonBlocking */)); err != nil {
		return 0, err
	}
	return Stream(h), nil
}

// StreamDestroy releases s (its pending work still completes).
func (l *Runtime) StreamDestroy(s Stream) error {
	return l.check("cudaStreamDestroy", C.nx_handle(l.f.streamDestroy, C.uintptr_t(s)))
}

// StreamSynchronize blocks until all work enqueued on s has completed.
func (l *Runtime) StreamSynchronize(s Stream) error {
	return l.check("cudaStreamSynchronize", C.nx_handle(l.f.streamSync, C.uintptr_t(s)))
}

// StreamWaitEvent makes work enqueued on s after this call wait for the
// latest record of ev made before this call.
func (l *Runtime) StreamWaitEvent(s Stream, ev Event) error {
	return l.check("cudaStreamWaitEvent", C.nx_wait(l.f.streamWait, C.uintptr_t(s), C.uintptr_t(ev)))
}

// EventCreate makes an event without timing (cudaEventDisableTiming: the
// cheap kind, for ordering only).
func (l *Runtime) EventCreate() (Event, error) {
	var h C.uintptr_t
	if err := l.check("cudaEventCreateWithFlags", C.nx_create(l.f.eventCreate, &h, 2 /* cudaEventDisableTiming */)); err != nil {
		return 0, err
	}
	return Event(h), nil
}

// EventDestroy releases ev.
func (l *Runtime) EventDestroy(ev Event) error {
	return l.check("cudaEventDestroy", C.nx_handle(l.f.eventDestroy, C.uintptr_t(ev)))
}

// EventRecord records ev at the current end of stream s.
func (l *Runtime) EventRecord(ev Event, s Stream) error {
	return l.check("cudaEventRecord", C.nx_record(l.f.eventRecord, C.uintptr_t(ev), C.uintptr_t(s)))
}

// EventQuery reports whether the work before ev's latest record has
// completed (cudaErrorNotReady is false, not an error).
func (l *Runtime) EventQuery(ev Event) (bool, error) {
	rc := C.nx_handle(l.f.eventQuery, C.uintptr_t(ev))
	if rc == errNotReady {
		return false, nil
	}
	return rc == 0, l.check("cudaEventQuery", rc)
}

// EventSynchronize blocks until ev's latest record has completed.
func (l *Runtime) EventSynchronize(ev Event) error {
	return l.check("cudaEventSynchronize", C.nx_handle(l.f.eventSync, C.uintptr_t(ev)))
}

// The package-level functions use the Default runtime.

// LibraryPath is the name libcudart was loaded under, or an error.
func LibraryPath() (string, error) {
	l, err := load()
	if err != nil {
		return "", err
	}
	return l.path, nil
}

// DeviceCount returns the number of visible CUDA devices. Without a driver
// or GPU it returns an error wrapping ErrNoDevice.
func DeviceCount() (int, error) {
	l, err := load()
	if err != nil {
		return 0, err
	}
	return l.DeviceCount()
}

// Available returns nil when libcudart loads and sees at least one device,
// and otherwise says exactly why not.
func Available() error {
	n, err := DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w (cudaGetDeviceCount returned 0)", ErrNoDevice)
	}
	return nil
}

// Malloc allocates n bytes of device memory.
func Malloc(n int) (DevicePtr, error) {
	l, err := load()
	if err != nil {
		return 0, err
	}
	return l.Malloc(n)
}

// Free releases memory from Malloc.
func Free(p DevicePtr) error {
	l, err := load()
	if err != nil {
		return err
	}
	return l.Free(p)
}

// CopyToDevice copies src into device memory at dst (synchronously).
func CopyToDevice(dst DevicePtr, src []byte) error {
	l, err := load()
	if err != nil {
		return err
	}
	return l.CopyToDevice(dst, src)
}

// CopyFromDevice copies device memory at src into dst (synchronously).
func CopyFromDevice(dst []byte, src DevicePtr) error {
	l, err := load()
	if err != nil {
		return err
	}
	return l.CopyFromDevice(dst, src)
}

// Memcpy copies n bytes between any two addresses CUDA knows.
func Memcpy(dst, src DevicePtr, n int) error {
	l, err := load()
	if err != nil {
		return err
	}
	return l.Memcpy(dst, src, n)
}

// PointerType says where p lives and on which device.
func PointerType(p uintptr) (MemoryType, int, error) {
	l, err := load()
	if err != nil {
		return Unregistered, -1, err
	}
	return l.PointerType(p)
}

// IsDevicePointer reports whether p is device memory. It is false whenever
// CUDA is unavailable, so callers can use it unconditionally.
func IsDevicePointer(p uintptr) bool {
	t, _, err := PointerType(p)
	return err == nil && t.OnDevice()
}
