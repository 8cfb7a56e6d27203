//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// nx_names collects the paths of the loaded objects, NUL separated, into a
// malloc'd buffer. Nothing is opened inside the iteration (it holds the
// loader's lock).
typedef struct { char *buf; size_t len, cap; } nx_names;

static int nx_name_cb(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	nx_names *n = data;
	const char *s = info->dlpi_name;
	if (s == NULL || s[0] == 0) return 0; // the program itself: searched apart
	size_t l = strlen(s) + 1;
	if (n->len + l > n->cap) {
		size_t c = (n->cap + l) * 2;
		char *b = realloc(n->buf, c);
		if (b == NULL) return 1;
		n->buf = b;
		n->cap = c;
	}
	memcpy(n->buf + n->len, s, l);
	n->len += l;
	return 0;
}

static char *nx_loaded_names(size_t *len) {
	nx_names n = {0};
	dl_iterate_phdr(nx_name_cb, &n);
	*len = n.len;
	return n.buf;
}

// nx_exports returns a handle of the loaded object path (NULL: the program
// and the global scope) if it exports sym, else NULL (the reference
// dropped). It loads nothing.
static void *nx_exports(const char *path, const char *sym) {
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL) : dlopen(NULL, RTLD_NOW);
	if (h == NULL) return NULL;
	if (dlsym(h, sym) == NULL) {
		if (path) dlclose(h);
		return NULL;
	}
	return h;
}

// nx_object_of names the object that defines sym in the global scope.
static const char *nx_object_of(void *h, const char *sym) {
	Dl_info di;
	void *f = dlsym(h, sym);
	if (f == NULL || dladdr(f, &di) == 0 || di.dli_fname == NULL) return NULL;
	return di.dli_fname;
}

// The CUDA driver's pointer query: cuPointerGetAttribute(&type,
// CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr), and the device ordinal.
typedef int (*nx_cu_attr_fn)(void *, int, unsigned long long);
static int nx_cu_attr(void *f, uintptr_t p, int attr, int *out) {
	unsigned int v = 0;
	int rc = ((nx_cu_attr_fn)f)(&v, attr, (unsigned long long)p);
	*out = (int)v;
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FindLoaded returns a CUDA runtime the process has loaded under any name:
// the first loaded object (the program itself and the global scope first,
// then each shared object in load order) that exports the runtime's entry
// points, e.g. torch's bundled libcudart-<hash>.so.12 or a runtime renamed
// by its packager. It loads nothing, and returns nil and no error when no
// loaded object is a CUDA runtime: a program linked with the static CUDA
// runtime (nvcc's default) exports none.
func FindLoaded() (*Runtime, error) {
	cs := C.CString("cudaPointerGetAttributes")
	defer C.free(unsafe.Pointer(cs))
	if h := C.nx_exports(nil, cs); h != nil {
		name := "the program"
		if o := C.nx_object_of(h, cs); o != nil {
			name = C.GoString(o)
		}
		if rt, err := bind(h, name); err == nil {
			return rt, nil
		}
	}
	var n C.size_t
	buf := C.nx_loaded_names(&n)
	if buf == nil {
		return nil, nil
	}
	names := C.GoBytes(unsafe.Pointer(buf), C.int(n))
	C.free(unsafe.Pointer(buf))
	var last error
	for len(names) > 0 {
		i := 0
		for names[i] != 0 {
			i++
		}
		path := string(names[:i])
		names = names[i+1:]
		cp := C.CString(path)
		h := C.nx_exports(cp, cs)
		C.free(unsafe.Pointer(cp))
		if h == nil {
			continue
		}
		rt, err := bind(h, path) // keeps the reference nx_exports took
		if err == nil {
			return rt, nil
		}
		last = err // a partial runtime: keep looking
	}
	if last != nil {
		return nil, fmt.Errorf("hw/cuda: a loaded object looks like a CUDA runtime but is not usable: %w", last)
	}
	return nil, nil
}

// Driver is the CUDA driver's pointer query (cuPointerGetAttribute of the
// libcuda.so.1 the process has loaded), for classifying pointers where no
// CUDA runtime is reachable. Safe for concurrent use.
type Driver struct {
	attr unsafe.Pointer
}

// LoadedDriver returns the driver if the process has libcuda.so.1 loaded
// (every CUDA program does once it uses CUDA, a statically linked one
// included), else nil. It loads nothing.
func LoadedDriver() *Driver {
	cn := C.CString("libcuda.so.1")
	cs := C.CString("cuPointerGetAttribute")
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cs))
	h := C.nx_exports(cn, cs)
	if h == nil {
		return nil
	}
	return &Driver{attr: C.dlsym(h, cs)}
}

// CUpointer_attribute and CUmemorytype values, and CUresult codes.
const (
	cuAttrMemoryType    = 2 // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	cuAttrDeviceOrdinal = 9 // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	cuMemTypeHost       = 1
	cuMemTypeDevice     = 2
	cuMemTypeUnified    = 4
	cuErrInvalidValue   = 1
)

// ErrDriver is wrapped by the driver's failures to answer.
var ErrDriver = errors.New("hw/cuda: the CUDA driver cannot classify the pointer")

// PointerType says what the driver knows of p: Device (with its device),
// Host (page-locked), Managed, or Unregistered for memory it does not know.
func (d *Driver) PointerType(p uintptr) (MemoryType, int, error) {
	var typ C.int
	switch rc := C.nx_cu_attr(d.attr, C.uintptr_t(p), cuAttrMemoryType, &typ); rc {
	case 0:
	case cuErrInvalidValue: // not memory the driver knows
		return Unregistered, -1, nil
	default:
		return Unregistered, -1, fmt.Errorf("%w: cuPointerGetAttribute(%#x): CUresult %d", ErrDriver, p, int(rc))
	}
	switch typ {
	case cuMemTypeDevice:
		var dev C.int
		if rc := C.nx_cu_attr(d.attr, C.uintptr_t(p), cuAttrDeviceOrdinal, &dev); rc != 0 {
			dev = -1
		}
		return Device, int(dev), nil
	case cuMemTypeHost:
		return Host, -1, nil
	case cuMemTypeUnified:
		return Managed, -1, nil
	}
	return Unregistered, -1, nil
}

// Readable reports whether the byte at p is host memory this process can
// read, without touching it: process_vm_readv of this process into a
// local byte fails with EFAULT where a read would fault (device memory
// mapped PROT_NONE under unified addressing, an unmapped address). Where
// the system refuses the call (a seccomp filter), it reports true: the
// caller then reads as it would have.
func Readable(p uintptr) bool {
	var b [1]byte
	local := []unix.Iovec{{Base: &b[0], Len: 1}}
	remote := []unix.RemoteIovec{{Base: p, Len: 1}}
	n, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
	switch {
	case err == nil:
		return n == 1
	case errors.Is(err, unix.EFAULT):
		return false
	}
	return true // ENOSYS, EPERM: cannot tell
}
