//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

typedef int (*nx_init_fn)(unsigned int);
typedef int (*nx_alloc_host_fn)(void **, size_t);
typedef int (*nx_free_host_fn)(void *);
typedef int (*nx_alloc_managed_fn)(unsigned long long *, size_t, unsigned int);
typedef int (*nx_free_fn)(unsigned long long);
typedef unsigned long (*nx_count_fn)(void);

static int nx_init(void *f) { return ((nx_init_fn)f)(0); }
static int nx_alloc_host(void *f, size_t n, uintptr_t *p) {
	void *q = NULL;
	int rc = ((nx_alloc_host_fn)f)(&q, n);
	*p = (uintptr_t)q;
	return rc;
}
static int nx_free_host(void *f, uintptr_t p) { return ((nx_free_host_fn)f)((void *)p); }
static int nx_alloc_managed(void *f, size_t n, uintptr_t *p) {
	unsigned long long q = 0;
	int rc = ((nx_alloc_managed_fn)f)(&q, n, 1); // CU_MEM_ATTACH_GLOBAL
	*p = (uintptr_t)q;
	return rc;
}
static int nx_free(void *f, uintptr_t p) { return ((nx_free_fn)f)((unsigned long long)p); }
static unsigned long nx_count(void *f) { return ((nx_count_fn)f)(); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Driver is the loaded fake, for the calls a test makes to it directly
// (what a CUDA program's runtime would call). Safe for concurrent use.
type Driver struct {
	h unsafe.Pointer
}

// Load opens the fake at path as a statically linked CUDA runtime opens
// the driver: dlopen, RTLD_NOW | RTLD_LOCAL (its symbols stay out of the
// global scope). It is never unloaded.
func Load(path string) (*Driver, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	h := C.dlopen(cp, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("fake cuda: dlopen %s: %s", path, C.GoString(C.dlerror()))
	}
	return &Driver{h: h}, nil
}

func (d *Driver) sym(name string) unsafe.Pointer {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	f := C.dlsym(d.h, cn)
	if f == nil {
		panic("fake cuda: no " + name)
	}
	return f
}

func cuErr(call string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("fake cuda: %s: CUresult %d", call, int(rc))
}

// Init is cuInit(0): every other entry point fails with
// CUDA_ERROR_NOT_INITIALIZED (3) before it.
func (d *Driver) Init() error { return cuErr("cuInit", C.nx_init(d.sym("cuInit"))) }

// AllocHost is cuMemAllocHost_v2: page-locked host memory the driver knows.
func (d *Driver) AllocHost(n int) (uintptr, error) {
	var p C.uintptr_t
	err := cuErr("cuMemAllocHost_v2", C.nx_alloc_host(d.sym("cuMemAllocHost_v2"), C.size_t(n), &p))
	return uintptr(p), err
}

// FreeHost is cuMemFreeHost.
func (d *Driver) FreeHost(p uintptr) error {
	return cuErr("cuMemFreeHost", C.nx_free_host(d.sym("cuMemFreeHost"), C.uintptr_t(p)))
}

// AllocManaged is cuMemAllocManaged: managed memory (host-readable here).
func (d *Driver) AllocManaged(n int) (uintptr, error) {
	var p C.uintptr_t
	err := cuErr("cuMemAllocManaged", C.nx_alloc_managed(d.sym("cuMemAllocManaged"), C.size_t(n), &p))
	return uintptr(p), err
}

// FreeManaged is cuMemFree_v2 of managed memory.
func (d *Driver) FreeManaged(p uintptr) error {
	return cuErr("cuMemFree_v2", C.nx_free(d.sym("cuMemFree_v2"), C.uintptr_t(p)))
}

// Queries is how many times cuPointerGetAttribute was called.
func (d *Driver) Queries() uint64 { return uint64(C.nx_count(d.sym("nexarFakeCuPointerQueries"))) }
