//go:build cgo

package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "nexar.h"

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

// nx_cudart is a CUDA runtime's entry points: the ctx of the adapter table
// that a loaded libcudart becomes (nx_cudart_table).
typedef struct {
	void *h;
	void *count, *setDevice, *getDevice, *malloc, *free, *memcpy, *attr, *errstr, *lastErr;
	void *hostAlloc, *freeHost, *memcpyAsync;
	void *streamCreate, *streamDestroy, *streamSync, *streamWait;
	void *eventCreate, *eventDestroy, *eventRecord, *eventQuery;
	void *rangeHandle; // cuMemGetHandleForAddressRange, looked up on first use
	int rangeLooked;
} nx_cudart;

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
// cuMemGetHandleForAddressRange (CUDA driver API, 11.7+): handle is an
// int* for CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (1).
typedef int (*nx_range_handle_fn)(void *, unsigned long long, size_t, int, unsigned long long);

#define NX_CUDA_NOT_READY 600     // cudaErrorNotReady
#define NX_CUDA_INVALID_VALUE 1   // cudaErrorInvalidValue
#define NX_CU_NOT_SUPPORTED 801   // CUDA_ERROR_NOT_SUPPORTED

// The CUDA runtime's side of the adapter table: each entry calls the
// runtime's own function.
static int nxc_pointer_query(void *ctx, const void *p, int *kind, int *dev) {
	nx_cudart *c = ctx;
	nx_cuda_ptr_attr a;
	memset(&a, 0, sizeof a);
	int rc = ((nx_attr_fn)c->attr)(&a, p);
	if (rc == NX_CUDA_INVALID_VALUE) { // pre-11 runtimes say this of host memory
		((nx_void_fn)c->lastErr)(); // clears the sticky last error
		*kind = NEXAR_MEMORY_UNREGISTERED;
		*dev = -1;
		return 0;
	}
	*kind = a.type;
	*dev = a.device;
	return rc;
}
static int nxc_device_count(void *ctx, int *n) { return ((nx_int_fn)((nx_cudart *)ctx)->count)(n); }
static int nxc_get_device(void *ctx, int *d) { return ((nx_int_fn)((nx_cudart *)ctx)->getDevice)(d); }
static int nxc_set_device(void *ctx, int d) { return ((nx_setdev_fn)((nx_cudart *)ctx)->setDevice)(d); }
static int nxc_host_alloc(void *ctx, void **p, size_t n) {
	return ((nx_hostalloc_fn)((nx_cudart *)ctx)->hostAlloc)(p, n, 1); // cudaHostAllocPortable
}
static int nxc_host_free(void *ctx, void *p) { return ((nx_free_fn)((nx_cudart *)ctx)->freeHost)(p); }
static int nxc_device_alloc(void *ctx, void **p, size_t n) { return ((nx_malloc_fn)((nx_cudart *)ctx)->malloc)(p, n); }
static int nxc_device_free(void *ctx, void *p) { return ((nx_free_fn)((nx_cudart *)ctx)->free)(p); }
static int nxc_copy(void *ctx, void *dst, const void *src, size_t n, int kind) {
	return ((nx_memcpy_fn)((nx_cudart *)ctx)->memcpy)(dst, src, n, kind);
}
static int nxc_copy_async(void *ctx, void *dst, const void *src, size_t n, int kind, void *s) {
	return ((nx_memcpy_async_fn)((nx_cudart *)ctx)->memcpyAsync)(dst, src, n, kind, s);
}
static int nxc_stream_create(void *ctx, void **s) {
	return ((nx_create_fn)((nx_cudart *)ctx)->streamCreate)(s, 1); // cudaStreamNonBlocking
}
static int nxc_stream_destroy(void *ctx, void *s) { return ((nx_handle_fn)((nx_cudart *)ctx)->streamDestroy)(s); }
static int nxc_stream_sync(void *ctx, void *s) { return ((nx_handle_fn)((nx_cudart *)ctx)->streamSync)(s); }
static int nxc_stream_wait(void *ctx, void *s, void *ev) { return ((nx_wait_fn)((nx_cudart *)ctx)->streamWait)(s, ev, 0); }
static int nxc_event_create(void *ctx, void **ev) {
	return ((nx_create_fn)((nx_cudart *)ctx)->eventCreate)(ev, 2); // cudaEventDisableTiming
}
static int nxc_event_destroy(void *ctx, void *ev) { return ((nx_handle_fn)((nx_cudart *)ctx)->eventDestroy)(ev); }
static int nxc_event_record(void *ctx, void *ev, void *s) { return ((nx_record_fn)((nx_cudart *)ctx)->eventRecord)(ev, s); }
static int nxc_event_query(void *ctx, void *ev, int *done) {
	int rc = ((nx_handle_fn)((nx_cudart *)ctx)->eventQuery)(ev);
	*done = rc == 0;
	return rc == NX_CUDA_NOT_READY ? 0 : rc;
}
static const char *nxc_error_string(void *ctx, int code) { return ((nx_errstr_fn)((nx_cudart *)ctx)->errstr)(code); }

// nx_driver_sym finds a CUDA driver entry point: in the runtime library
// first (a stand-in runtime may carry it), then in libcuda.so.1.
static void *nx_driver_sym(void *runtime, const char *name) {
	void *f = dlsym(runtime, name);
	if (f) return f;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	return h ? dlsym(h, name) : NULL;
}

static int nxc_dmabuf(void *ctx, const void *p, size_t n, int *fd, uint64_t *off) {
	nx_cudart *c = ctx;
	// Looked up once; two threads that race both find the same symbol.
	if (!__atomic_load_n(&c->rangeLooked, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&c->rangeHandle, nx_driver_sym(c->h, "cuMemGetHandleForAddressRange"), __ATOMIC_RELEASE);
		__atomic_store_n(&c->rangeLooked, 1, __ATOMIC_RELEASE);
	}
	void *f = __atomic_load_n(&c->rangeHandle, __ATOMIC_ACQUIRE);
	if (f == NULL) return NEXAR_DEVICE_NOT_SUPPORTED;
	*fd = -1;
	*off = 0;
	int rc = ((nx_range_handle_fn)f)(fd, (unsigned long long)(uintptr_t)p, n, 1, 0);
	return rc == NX_CU_NOT_SUPPORTED ? NEXAR_DEVICE_NOT_SUPPORTED : rc;
}

// nx_cudart_table fills a version 1 table over c.
static void nx_cudart_table(nx_cudart *c, nexar_device_adapter_t *a) {
	memset(a, 0, sizeof *a);
	a->size = sizeof *a;
	a->version = NEXAR_DEVICE_ADAPTER_VERSION;
	a->name = "cuda";
	a->ctx = c;
	a->pointer_query = nxc_pointer_query;
	a->device_count = nxc_device_count;
	a->get_device = nxc_get_device;
	a->set_device = nxc_set_device;
	a->host_alloc = nxc_host_alloc;
	a->host_free = nxc_host_free;
	a->device_alloc = nxc_device_alloc;
	a->device_free = nxc_device_free;
	a->copy = nxc_copy;
	a->copy_async = nxc_copy_async;
	a->stream_create = nxc_stream_create;
	a->stream_destroy = nxc_stream_destroy;
	a->stream_synchronize = nxc_stream_sync;
	a->stream_wait_event = nxc_stream_wait;
	a->event_create = nxc_event_create;
	a->event_destroy = nxc_event_destroy;
	a->event_record = nxc_event_record;
	a->event_query = nxc_event_query;
	a->error_string = nxc_error_string;
	a->dmabuf_export = nxc_dmabuf;
}

// Calls through a table (cgo cannot call a function pointer itself).
typedef const nexar_device_adapter_t nx_tab;
static int nx_t_query(nx_tab *a, uintptr_t p, int *k, int *d) { return a->pointer_query(a->ctx, (const void *)p, k, d); }
static int nx_t_count(nx_tab *a, int *n) { return a->device_count(a->ctx, n); }
static int nx_t_getdev(nx_tab *a, int *d) { return a->get_device(a->ctx, d); }
static int nx_t_setdev(nx_tab *a, int d) { return a->set_device(a->ctx, d); }
static int nx_t_halloc(nx_tab *a, void **p, size_t n) { return a->host_alloc(a->ctx, p, n); }
static int nx_t_hfree(nx_tab *a, uintptr_t p) { return a->host_free(a->ctx, (void *)p); }
static int nx_t_dalloc(nx_tab *a, uintptr_t *p, size_t n) {
	void *q = NULL;
	int rc = a->device_alloc(a->ctx, &q, n);
	*p = (uintptr_t)q;
	return rc;
}
static int nx_t_dfree(nx_tab *a, uintptr_t p) { return a->device_free(a->ctx, (void *)p); }
static int nx_t_copy(nx_tab *a, uintptr_t dst, uintptr_t src, size_t n, int kind) {
	return a->copy(a->ctx, (void *)dst, (const void *)src, n, kind);
}
static int nx_t_copy_async(nx_tab *a, uintptr_t dst, uintptr_t src, size_t n, int kind, uintptr_t s) {
	return a->copy_async(a->ctx, (void *)dst, (const void *)src, n, kind, (void *)s);
}
static int nx_t_screate(nx_tab *a, uintptr_t *h) {
	void *q = NULL;
	int rc = a->stream_create(a->ctx, &q);
	*h = (uintptr_t)q;
	return rc;
}
static int nx_t_sdestroy(nx_tab *a, uintptr_t s) { return a->stream_destroy(a->ctx, (void *)s); }
static int nx_t_ssync(nx_tab *a, uintptr_t s) { return a->stream_synchronize(a->ctx, (void *)s); }
static int nx_t_swait(nx_tab *a, uintptr_t s, uintptr_t ev) { return a->stream_wait_event(a->ctx, (void *)s, (void *)ev); }
static int nx_t_ecreate(nx_tab *a, uintptr_t *h) {
	void *q = NULL;
	int rc = a->event_create(a->ctx, &q);
	*h = (uintptr_t)q;
	return rc;
}
static int nx_t_edestroy(nx_tab *a, uintptr_t ev) { return a->event_destroy(a->ctx, (void *)ev); }
static int nx_t_erecord(nx_tab *a, uintptr_t ev, uintptr_t s) { return a->event_record(a->ctx, (void *)ev, (void *)s); }
static int nx_t_equery(nx_tab *a, uintptr_t ev, int *done) { return a->event_query(a->ctx, (void *)ev, done); }
static const char *nx_t_errstr(nx_tab *a, int code) { return a->error_string ? a->error_string(a->ctx, code) : NULL; }
static int nx_t_dmabuf(nx_tab *a, uintptr_t p, size_t n, int *fd, uint64_t *off) {
	if (a->dmabuf_export == NULL) return NEXAR_DEVICE_NOT_SUPPORTED;
	return a->dmabuf_export(a->ctx, (const void *)p, n, fd, off);
}

// nx_adapter_from calls fill, a runtime's int fill(nexar_device_adapter_t*).
static int nx_adapter_from(void *fill, nexar_device_adapter_t *a) {
	return ((int (*)(nexar_device_adapter_t *))fill)(a);
}

// nx_loaded returns the handle of name if the process has it loaded
// already, without loading it.
static void *nx_loaded(const char *name) { return dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL); }
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

func closeFD(fd int) { syscall.Close(fd) }

// Runtime is one device runtime, reached through its adapter table
// (include/nexar.h, nexar_device_adapter_t): the CUDA runtime loaded with
// dlopen (Default, Open, InProcess), whose entry points fill a table, or a
// table a GPU runtime supplies (FromAdapter, LoadAdapter). Every call goes
// through the table. Safe for concurrent use (the table's contract).
type Runtime struct {
	name  string         // the library path, or the adapter's name
	cudrt bool           // a CUDA runtime: errors name the CUDA function
	h     unsafe.Pointer // the dlopen handle, nil for an installed table
	t     *C.nx_tab      // immutable C memory, never freed: a Runtime lives as long as the process
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
// at start), else a CUDA runtime among the objects the process has loaded
// under another name (Find). It returns nil and no error when the process
// has no CUDA runtime it can reach.
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
	return FindLoaded()
}

// cudartSyms are the CUDA runtime's entry points a Runtime binds, by their
// place in nx_cudart.
var cudartSyms = []string{
	"cudaGetDeviceCount", "cudaSetDevice", "cudaGetDevice", "cudaMalloc", "cudaFree",
	"cudaMemcpy", "cudaPointerGetAttributes", "cudaGetErrorString", "cudaGetLastError",
	"cudaHostAlloc", "cudaFreeHost", "cudaMemcpyAsync",
	"cudaStreamCreateWithFlags", "cudaStreamDestroy", "cudaStreamSynchronize", "cudaStreamWaitEvent",
	"cudaEventCreateWithFlags", "cudaEventDestroy", "cudaEventRecord", "cudaEventQuery",
}

func bind(h unsafe.Pointer, path string) (*Runtime, error) {
	c := (*C.nx_cudart)(C.calloc(1, C.sizeof_nx_cudart))
	c.h = h
	slots := []*unsafe.Pointer{
		&c.count, &c.setDevice, &c.getDevice, &c.malloc, &c.free,
		&c.memcpy, &c.attr, &c.errstr, &c.lastErr,
		&c.hostAlloc, &c.freeHost, &c.memcpyAsync,
		&c.streamCreate, &c.streamDestroy, &c.streamSync, &c.streamWait,
		&c.eventCreate, &c.eventDestroy, &c.eventRecord, &c.eventQuery,
	}
	for i, name := range cudartSyms {
		cs := C.CString(name)
		*slots[i] = C.dlsym(h, cs)
		C.free(unsafe.Pointer(cs))
		if *slots[i] == nil {
			err := fmt.Errorf("hw/cuda: %s lacks %s: %s", path, name, dlerror())
			C.free(unsafe.Pointer(c))
			return nil, err
		}
	}
	t := (*C.nexar_device_adapter_t)(C.calloc(1, C.sizeof_nexar_device_adapter_t))
	C.nx_cudart_table(c, t)
	return &Runtime{name: path, cudrt: true, h: h, t: (*C.nx_tab)(t)}, nil
}

// adapterV1Size is the size of a version 1 table: through error_string,
// the last required entry.
var adapterV1Size = int(unsafe.Offsetof(C.nexar_device_adapter_t{}.error_string) + unsafe.Sizeof(C.nexar_device_adapter_t{}.error_string))

// AdapterError is a table that FromAdapter refuses.
type AdapterError struct{ Msg string }

func (e *AdapterError) Error() string { return "hw/cuda: device adapter: " + e.Msg }

// FromAdapter returns the runtime whose table is at table (a
// nexar_device_adapter_t*, read once: the table is copied; its ctx and
// functions must stay valid for the life of the process). It checks the
// size, version and required entries (an *AdapterError names the fault).
func FromAdapter(table unsafe.Pointer) (*Runtime, error) {
	if table == nil {
		return nil, &AdapterError{"the table is NULL"}
	}
	in := (*C.nexar_device_adapter_t)(table)
	size := int(in.size)
	if size < adapterV1Size {
		return nil, &AdapterError{fmt.Sprintf("size %d is smaller than version 1's table (%d bytes): set size to sizeof(nexar_device_adapter_t)", size, adapterV1Size)}
	}
	if v := int(in.version); v < 1 || v > int(C.NEXAR_DEVICE_ADAPTER_VERSION) {
		return nil, &AdapterError{fmt.Sprintf("version %d: this libnexar knows versions 1 to %d", v, int(C.NEXAR_DEVICE_ADAPTER_VERSION))}
	}
	t := (*C.nexar_device_adapter_t)(C.calloc(1, C.sizeof_nexar_device_adapter_t))
	// A table from an older header is shorter: what it lacks stays NULL
	// (optional). One from a later header of the same version is read as
	// far as this library knows.
	C.memcpy(unsafe.Pointer(t), table, C.size_t(min(size, int(C.sizeof_nexar_device_adapter_t))))
	t.size = C.sizeof_nexar_device_adapter_t
	for _, e := range []struct {
		name string
		nil  bool
	}{
		{"pointer_query", t.pointer_query == nil}, {"device_count", t.device_count == nil},
		{"get_device", t.get_device == nil}, {"set_device", t.set_device == nil},
		{"host_alloc", t.host_alloc == nil}, {"host_free", t.host_free == nil},
		{"device_alloc", t.device_alloc == nil}, {"device_free", t.device_free == nil},
		{"copy", t.copy == nil}, {"copy_async", t.copy_async == nil},
		{"stream_create", t.stream_create == nil}, {"stream_destroy", t.stream_destroy == nil},
		{"stream_synchronize", t.stream_synchronize == nil}, {"stream_wait_event", t.stream_wait_event == nil},
		{"event_create", t.event_create == nil}, {"event_destroy", t.event_destroy == nil},
		{"event_record", t.event_record == nil}, {"event_query", t.event_query == nil},
		{"error_string", t.error_string == nil},
	} {
		if e.nil {
			C.free(unsafe.Pointer(t))
			return nil, &AdapterError{fmt.Sprintf("%s is NULL: every entry up to error_string is required", e.name)}
		}
	}
	name := "device adapter"
	if t.name != nil {
		name = C.GoString(t.name)
		// The name is kept in C memory of its own: the caller's may go.
		t.name = C.CString(name)
	}
	return &Runtime{name: name, t: (*C.nx_tab)(t)}, nil
}

// LoadAdapter loads the library at path and fills a table with its
// function fill, an int fill(nexar_device_adapter_t*) returning 0 on
// success (how a runtime's adapter library, or a test's fake, hands its
// table to Go programs), then returns FromAdapter of it. The library is
// loaded locally and kept for the life of the process.
func LoadAdapter(path, fill string) (*Runtime, error) {
	cn := C.CString(path)
	h := C.dlopen(cn, C.RTLD_NOW|C.RTLD_LOCAL)
	C.free(unsafe.Pointer(cn))
	if h == nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrNoLibrary, path, dlerror())
	}
	cs := C.CString(fill)
	f := C.dlsym(h, cs)
	C.free(unsafe.Pointer(cs))
	if f == nil {
		return nil, fmt.Errorf("hw/cuda: %s lacks %s: %s", path, fill, dlerror())
	}
	var t C.nexar_device_adapter_t
	if rc := C.nx_adapter_from(f, &t); rc != 0 {
		return nil, fmt.Errorf("hw/cuda: %s: %s() returned %d", path, fill, int(rc))
	}
	return FromAdapter(unsafe.Pointer(&t))
}

// cudaNames are the CUDA functions behind the adapter's entries, which a
// CUDA runtime's errors name.
var cudaNames = map[string]string{
	"pointer_query": "cudaPointerGetAttributes", "device_count": "cudaGetDeviceCount",
	"get_device": "cudaGetDevice", "set_device": "cudaSetDevice",
	"host_alloc": "cudaHostAlloc", "host_free": "cudaFreeHost",
	"device_alloc": "cudaMalloc", "device_free": "cudaFree",
	"copy": "cudaMemcpy", "copy_async": "cudaMemcpyAsync",
	"stream_create": "cudaStreamCreateWithFlags", "stream_destroy": "cudaStreamDestroy",
	"stream_synchronize": "cudaStreamSynchronize", "stream_wait_event": "cudaStreamWaitEvent",
	"event_create": "cudaEventCreateWithFlags", "event_destroy": "cudaEventDestroy",
	"event_record": "cudaEventRecord", "event_query": "cudaEventQuery",
	"dmabuf_export": "cuMemGetHandleForAddressRange",
}

func (l *Runtime) check(entry string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	e := &Error{Func: l.name + " " + entry, Code: int(rc), Runtime: l.Name()}
	if l.cudrt {
		e.Func = cudaNames[entry]
	}
	if s := C.nx_t_errstr(l.t, rc); s != nil {
		e.Msg = C.GoString(s)
	} else {
		e.Msg = "unknown error"
	}
	return e
}

// Path is the name the library was loaded under, or an installed
// adapter's name.
func (l *Runtime) Path() string { return l.name }

// Name is the runtime's kind: "cuda" for a CUDA runtime, else the
// adapter's name.
func (l *Runtime) Name() string {
	if l.cudrt {
		return "cuda"
	}
	return l.name
}

// IsCUDA reports whether this is a CUDA runtime (not another adapter):
// NCCL and the CUDA driver's extras go with it only.
func (l *Runtime) IsCUDA() bool { return l.cudrt }

// DeviceCount returns the number of visible devices (an error wrapping
// ErrNoDevice without a driver or GPU).
func (l *Runtime) DeviceCount() (int, error) {
	var n C.int
	if err := l.check("device_count", C.nx_t_count(l.t, &n)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	return int(n), nil
}

// SetDevice makes dev the calling OS thread's current device (callers lock
// the goroutine to its thread around work that depends on it).
func (l *Runtime) SetDevice(dev int) error {
	return l.check("set_device", C.nx_t_setdev(l.t, C.int(dev)))
}

// GetDevice returns the calling OS thread's current device.
func (l *Runtime) GetDevice() (int, error) {
	var d C.int
	if err := l.check("get_device", C.nx_t_getdev(l.t, &d)); err != nil {
		return -1, err
	}
	return int(d), nil
}

// Malloc allocates n bytes of device memory.
func (l *Runtime) Malloc(n int) (DevicePtr, error) {
	var p C.uintptr_t
	if err := l.check("device_alloc", C.nx_t_dalloc(l.t, &p, C.size_t(n))); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// Free releases memory from Malloc.
func (l *Runtime) Free(p DevicePtr) error {
	return l.check("device_free", C.nx_t_dfree(l.t, C.uintptr_t(p)))
}

// MallocHost allocates n bytes of page-locked host memory (cudaHostAlloc,
// portable): outside the Go heap, valid until FreeHost.
func (l *Runtime) MallocHost(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("hw/cuda: MallocHost(%d): size must be positive", n)
	}
	var p unsafe.Pointer
	if err := l.check("host_alloc", C.nx_t_halloc(l.t, &p, C.size_t(n))); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// FreeHost releases memory from MallocHost.
func (l *Runtime) FreeHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return l.check("host_free", C.nx_t_hfree(l.t, C.uintptr_t(uintptr(unsafe.Pointer(&b[0])))))
}

// CopyToDevice copies src into device memory at dst (synchronously).
func (l *Runtime) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := l.check("copy", C.nx_t_copy(l.t, C.uintptr_t(dst),
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
	err := l.check("copy", C.nx_t_copy(l.t, C.uintptr_t(uintptr(unsafe.Pointer(&dst[0]))),
		C.uintptr_t(src), C.size_t(len(dst)), C.int(MemcpyDeviceToHost)))
	runtime.KeepAlive(dst) // as in CopyToDevice
	return err
}

// Memcpy copies n bytes between any two addresses the runtime knows
// (direction inferred through unified addressing), synchronously.
func (l *Runtime) Memcpy(dst, src DevicePtr, n int) error {
	return l.check("copy", C.nx_t_copy(l.t, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(MemcpyDefault)))
}

// MemcpyAsync enqueues a copy of n bytes on stream s. Host memory on either
// side must be page-locked for the copy to be asynchronous, and must stay
// valid until the copy completes (an event recorded after it says when).
func (l *Runtime) MemcpyAsync(dst, src uintptr, n int, kind MemcpyKind, s Stream) error {
	if n == 0 {
		return nil
	}
	return l.check("copy_async", C.nx_t_copy_async(l.t, C.uintptr_t(dst), C.uintptr_t(src),
		C.size_t(n), C.int(kind), C.uintptr_t(s)))
}

// PointerType says where p lives and on which device. A plain host address
// is Unregistered with no error.
func (l *Runtime) PointerType(p uintptr) (MemoryType, int, error) {
	var typ, dev C.int
	if err := l.check("pointer_query", C.nx_t_query(l.t, C.uintptr_t(p), &typ, &dev)); err != nil {
		return Unregistered, -1, err
	}
	return MemoryType(typ), int(dev), nil
}

// StreamCreate makes a stream that does not synchronize with the legacy
// default stream (cudaStreamNonBlocking): nexar's own work is ordered by
// events only.
func (l *Runtime) StreamCreate() (Stream, error) {
	var h C.uintptr_t
	if err := l.check("stream_create", C.nx_t_screate(l.t, &h)); err != nil {
		return 0, err
	}
	return Stream(h), nil
}

// StreamDestroy releases s (its pending work still completes).
func (l *Runtime) StreamDestroy(s Stream) error {
	return l.check("stream_destroy", C.nx_t_sdestroy(l.t, C.uintptr_t(s)))
}

// StreamSynchronize blocks until all work enqueued on s has completed.
func (l *Runtime) StreamSynchronize(s Stream) error {
	return l.check("stream_synchronize", C.nx_t_ssync(l.t, C.uintptr_t(s)))
}

// StreamWaitEvent makes work enqueued on s after this call wait for the
// latest record of ev made before this call.
func (l *Runtime) StreamWaitEvent(s Stream, ev Event) error {
	return l.check("stream_wait_event", C.nx_t_swait(l.t, C.uintptr_t(s), C.uintptr_t(ev)))
}

// EventCreate makes an event without timing (cudaEventDisableTiming: the
// cheap kind, for ordering only).
func (l *Runtime) EventCreate() (Event, error) {
	var h C.uintptr_t
	if err := l.check("event_create", C.nx_t_ecreate(l.t, &h)); err != nil {
		return 0, err
	}
	return Event(h), nil
}

// EventDestroy releases ev.
func (l *Runtime) EventDestroy(ev Event) error {
	return l.check("event_destroy", C.nx_t_edestroy(l.t, C.uintptr_t(ev)))
}

// EventRecord records ev at the current end of stream s.
func (l *Runtime) EventRecord(ev Event, s Stream) error {
	return l.check("event_record", C.nx_t_erecord(l.t, C.uintptr_t(ev), C.uintptr_t(s)))
}

// EventQuery reports whether the work before ev's latest record has
// completed (not yet is false, not an error).
func (l *Runtime) EventQuery(ev Event) (bool, error) {
	var done C.int
	if err := l.check("event_query", C.nx_t_equery(l.t, C.uintptr_t(ev), &done)); err != nil {
		return false, err
	}
	return done != 0, nil
}

// ErrNotSupported is returned (wrapped) by DmaBuf where the driver cannot
// export device memory as a dma-buf (no cuMemGetHandleForAddressRange, or
// CUDA_ERROR_NOT_SUPPORTED: an old driver or a kernel without dma-buf; an
// adapter without dmabuf_export, or one that says NEXAR_DEVICE_NOT_SUPPORTED).
var ErrNotSupported = errors.New("hw/cuda: not supported by the device driver")

// DmaBufAt exports the device range [p, p+n) (page aligned, within one
// allocation) as a dma-buf: its file descriptor, which the caller closes,
// and the range's offset in it; a NIC registers the range through it
// (GPUDirect RDMA, ibv_reg_dmabuf_mr). For a CUDA runtime the driver's
// cuMemGetHandleForAddressRange is looked up in the runtime library first,
// then in libcuda.so.1 (the offset is then 0: the handle is the range's).
func (l *Runtime) DmaBufAt(p DevicePtr, n int) (int, uint64, error) {
	fd := C.int(-1)
	var off C.uint64_t
	switch rc := C.nx_t_dmabuf(l.t, C.uintptr_t(p), C.size_t(n), &fd, &off); rc {
	case 0:
		return int(fd), uint64(off), nil
	case C.NEXAR_DEVICE_NOT_SUPPORTED:
		if l.cudrt {
			return -1, 0, fmt.Errorf("%w (cuMemGetHandleForAddressRange beside %s: missing, or CUDA_ERROR_NOT_SUPPORTED)", ErrNotSupported, l.name)
		}
		return -1, 0, fmt.Errorf("%w (%s: no dma-buf export)", ErrNotSupported, l.name)
	default:
		if l.cudrt {
			return -1, 0, fmt.Errorf("hw/cuda: cuMemGetHandleForAddressRange(%#x, %d): CUresult %d", uintptr(p), n, int(rc))
		}
		return -1, 0, fmt.Errorf("hw/cuda: %s dmabuf_export(%#x, %d): error %d", l.name, uintptr(p), n, int(rc))
	}
}

// DmaBuf is DmaBufAt for a caller that registers from the descriptor's
// start: an export at another offset is closed and refused as not
// supported.
func (l *Runtime) DmaBuf(p DevicePtr, n int) (int, error) {
	fd, off, err := l.DmaBufAt(p, n)
	if err == nil && off != 0 {
		closeFD(fd)
		return -1, fmt.Errorf("%w (%s exports the range at offset %d: use DmaBufAt)", ErrNotSupported, l.Name(), off)
	}
	return fd, err
}

// The package-level functions use the Default runtime.

// LibraryPath is the name libcudart was loaded under, or an error.
func LibraryPath() (string, error) {
	l, err := load()
	if err != nil {
		return "", err
	}
	return l.name, nil
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
