//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>

// cuMemGetHandleForAddressRange (CUDA driver API, 11.7+): handle is an
// int* for CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (1).
typedef int (*nx_range_handle_fn)(void *, unsigned long long, size_t, int, unsigned long long);

static int nx_dmabuf(void *f, uintptr_t p, size_t n, int *fd) {
	return ((nx_range_handle_fn)f)(fd, (unsigned long long)p, n, 1, 0);
}

static void *nx_driver_sym(void *runtime, const char *name) {
	void *f = dlsym(runtime, name); // a stand-in runtime may carry it
	if (f) return f;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	return h ? dlsym(h, name) : NULL;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// ErrNotSupported is returned (wrapped) by DmaBuf where the driver cannot
// export device memory as a dma-buf (no cuMemGetHandleForAddressRange, or
// CUDA_ERROR_NOT_SUPPORTED: an old driver or a kernel without dma-buf).
var ErrNotSupported = errors.New("hw/cuda: not supported by the CUDA driver")

// driverSyms are the driver entry points beside the runtime, found once.
type driverSyms struct {
	once        sync.Once
	rangeHandle unsafe.Pointer
}

const cudaErrorNotSupported = 801 // CUDA_ERROR_NOT_SUPPORTED

// DmaBuf exports the device range [p, p+n) (page aligned, within one
// allocation) as a dma-buf and returns its file descriptor, which the
// caller closes; a NIC registers the range through it (GPUDirect RDMA,
// ibv_reg_dmabuf_mr). The driver's cuMemGetHandleForAddressRange is
// looked up in the runtime library first, then in libcuda.so.1.
func (l *Runtime) DmaBuf(p DevicePtr, n int) (int, error) {
	l.drv.once.Do(func() {
		cs := C.CString("cuMemGetHandleForAddressRange")
		l.drv.rangeHandle = C.nx_driver_sym(l.h, cs)
		C.free(unsafe.Pointer(cs))
	})
	if l.drv.rangeHandle == nil {
		return -1, fmt.Errorf("%w (no cuMemGetHandleForAddressRange beside %s)", ErrNotSupported, l.path)
	}
	var fd C.int = -1
	switch rc := C.nx_dmabuf(l.drv.rangeHandle, C.uintptr_t(p), C.size_t(n), &fd); rc {
	case 0:
		return int(fd), nil
	case cudaErrorNotSupported:
		return -1, fmt.Errorf("%w (cuMemGetHandleForAddressRange: CUDA_ERROR_NOT_SUPPORTED)", ErrNotSupported)
	default:
		return -1, fmt.Errorf("hw/cuda: cuMemGetHandleForAddressRange(%#x, %d): CUresult %d", uintptr(p), n, int(rc))
	}
}
