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

typedef int (*nx_count_fn)(int *);
typedef int (*nx_malloc_fn)(void **, size_t);
typedef int (*nx_free_fn)(void *);
typedef int (*nx_memcpy_fn)(void *, const void *, size_t, int);
typedef int (*nx_attr_fn)(nx_cuda_ptr_attr *, const void *);
typedef const char *(*nx_errstr_fn)(int);

static int nx_count(void *f, int *n) { return ((nx_count_fn)f)(n); }
static int nx_malloc(void *f, uintptr_t *p, size_t n) {
	void *q = NULL;
	int rc = ((nx_malloc_fn)f)(&q, n);
	*p = (uintptr_t)q;
	return rc;
}
static int nx_free(void *f, uintptr_t p) { return ((nx_free_fn)f)((void *)p); }
static int nx_memcpy(void *f, uintptr_t dst, uintptr_t src, size_t n, int kind) {
	return ((nx_memcpy_fn)f)((void *)dst, (const void *)src, n, kind);
}
static int nx_memcpy_h2d(void *f, uintptr_t dst, const void *src, size_t n) {
	return ((nx_memcpy_fn)f)((void *)dst, src, n, 1);
}
static int nx_memcpy_d2h(void *f, void *dst, uintptr_t src, size_t n) {
	return ((nx_memcpy_fn)f)(dst, (const void *)src, n, 2);
}
static int nx_attr(void *f, uintptr_t p, int *type, int *dev) {
	nx_cuda_ptr_attr a = {0};
	int rc = ((nx_attr_fn)f)(&a, (const void *)p);
	*type = a.type;
	*dev = a.device;
	return rc;
}
static const char *nx_errstr(void *f, int code) { return ((nx_errstr_fn)f)(code); }
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"
)

type library struct {
	path                                      string
	count, malloc, free, memcpy, attr, errstr unsafe.Pointer
}

var (
	loadOnce sync.Once
	lib      *library
	loadErr  error
)

func dlerror() string {
	if e := C.dlerror(); e != nil {
		return C.GoString(e)
	}
	return "unknown dlopen error"
}

func load() (*library, error) {
	loadOnce.Do(func() {
		names := libNames
		if p := os.Getenv("NEXAR_CUDART"); p != "" {
			names = append([]string{p}, names...)
		}
		var h unsafe.Pointer
		var path string
		var last string
		for _, n := range names {
			cn := C.CString(n)
			h = C.dlopen(cn, C.RTLD_NOW|C.RTLD_GLOBAL)
			C.free(unsafe.Pointer(cn))
			if h != nil {
				path = n
				break
			}
			last = dlerror()
		}
		if h == nil {
			loadErr = fmt.Errorf("%w (tried %s; set NEXAR_CUDART to its path; last error: %s)", ErrNoLibrary, strings.Join(names, ", "), last)
			return
		}
		l := &library{path: path}
		for _, s := range []struct {
			name string
			dst  *unsafe.Pointer
		}{
			{"cudaGetDeviceCount", &l.count}, {"cudaMalloc", &l.malloc}, {"cudaFree", &l.free},
			{"cudaMemcpy", &l.memcpy}, {"cudaPointerGetAttributes", &l.attr},
			{"cudaGetErrorString", &l.errstr},
		} {
			cs := C.CString(s.name)
			*s.dst = C.dlsym(h, cs)
			C.free(unsafe.Pointer(cs))
			if *s.dst == nil {
				loadErr = fmt.Errorf("hw/cuda: %s lacks %s: %s", path, s.name, dlerror())
				return
			}
		}
		lib = l
	})
	return lib, loadErr
}

func (l *library) check(fn string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &Error{Func: fn, Code: int(rc), Msg: C.GoString(C.nx_errstr(l.errstr, rc))}
}

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
	var n C.int
	if err := l.check("cudaGetDeviceCount", C.nx_count(l.count, &n)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	return int(n), nil
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
	var p C.uintptr_t
	if err := l.check("cudaMalloc", C.nx_malloc(l.malloc, &p, C.size_t(n))); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// Free releases memory from Malloc.
func Free(p DevicePtr) error {
	l, err := load()
	if err != nil {
		return err
	}
	return l.check("cudaFree", C.nx_free(l.free, C.uintptr_t(p)))
}

// CopyToDevice copies src into device memory at dst (synchronously).
func CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	l, err := load()
	if err != nil {
		return err
	}
	return l.check("cudaMemcpy", C.nx_memcpy_h2d(l.memcpy, C.uintptr_t(dst),
		unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// CopyFromDevice copies device memory at src into dst (synchronously).
func CopyFromDevice(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	l, err := load()
	if err != nil {
		return err
	}
	return l.check("cudaMemcpy", C.nx_memcpy_d2h(l.memcpy, unsafe.Pointer(&dst[0]),
		C.uintptr_t(src), C.size_t(len(dst))))
}

// Memcpy copies n bytes between any two addresses CUDA knows (direction
// inferred through unified addressing).
func Memcpy(dst, src DevicePtr, n int) error {
	l, err := load()
	if err != nil {
		return err
	}
	return l.check("cudaMemcpy", C.nx_memcpy(l.memcpy, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), memcpyDefault))
}

// PointerType says where p lives and on which device. A plain host address
// is Unregistered with no error.
func PointerType(p uintptr) (MemoryType, int, error) {
	l, err := load()
	if err != nil {
		return Unregistered, -1, err
	}
	var typ, dev C.int
	rc := C.nx_attr(l.attr, C.uintptr_t(p), &typ, &dev)
	if rc == 1 { // cudaErrorInvalidValue: pre-11 runtimes say this for host memory
		var n C.int
		C.nx_count(l.count, &n) // clears the sticky last error
		return Unregistered, -1, nil
	}
	if err := l.check("cudaPointerGetAttributes", rc); err != nil {
		return Unregistered, -1, err
	}
	return MemoryType(typ), int(dev), nil
}

// IsDevicePointer reports whether p is device memory. It is false whenever
// CUDA is unavailable, so callers can use it unconditionally.
func IsDevicePointer(p uintptr) bool {
	t, _, err := PointerType(p)
	return err == nil && t.OnDevice()
}
