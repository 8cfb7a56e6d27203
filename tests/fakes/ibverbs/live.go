//go:build cgo

package ibverbs

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

typedef int (*nx_live_fn)(int);
typedef long long (*nx_regs_fn)(void);
typedef long long (*nx_bytes_fn)(int);

static int nx_live(const char *lib, int kind) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (!h) return -2;
	nx_live_fn f = (nx_live_fn)dlsym(h, "nexar_fake_ibv_live");
	int n = f ? f(kind) : -3;
	dlclose(h);
	return n;
}

static long long nx_regs(const char *lib) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (!h) return -2;
	nx_regs_fn f = (nx_regs_fn)dlsym(h, "nexar_fake_ibv_regs");
	long long n = f ? f() : -3;
	dlclose(h);
	return n;
}

static long long nx_bytes(const char *lib, int kind) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (!h) return -2;
	nx_bytes_fn f = (nx_bytes_fn)dlsym(h, "nexar_fake_ibv_bytes");
	long long n = f ? f(kind) : -3;
	dlclose(h);
	return n;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Counts are the fake's live objects of each kind in this process.
type Counts struct {
	Contexts, PDs, MRs, CQs, QPs, Channels int
}

// Live reads the live objects of the fake at lib, which this process must
// have loaded already (through hw/rdma).
func Live(lib string) (Counts, error) {
	cl := C.CString(lib)
	defer C.free(unsafe.Pointer(cl))
	var v [6]int
	for k := range v {
		n := int(C.nx_live(cl, C.int(k)))
		if n < 0 {
			return Counts{}, fmt.Errorf("fakes/ibverbs: %s is not loaded or is not the fake (%d)", lib, n)
		}
		v[k] = n
	}
	return Counts{v[0], v[1], v[2], v[3], v[4], v[5]}, nil
}

// Registrations reads how many memory registrations (ibv_reg_mr and
// ibv_reg_dmabuf_mr that succeeded) the fake at lib has made in this
// process, which must have loaded it already.
func Registrations(lib string) (int64, error) {
	cl := C.CString(lib)
	defer C.free(unsafe.Pointer(cl))
	n := int64(C.nx_regs(cl))
	if n < 0 {
		return 0, fmt.Errorf("fakes/ibverbs: %s is not loaded or is not the fake (%d)", lib, n)
	}
	return n, nil
}

// Bytes the fake NIC at lib moved in this process through registrations
// of each kind: host memory, peer memory (device memory by its address)
// and dma-buf (device memory by a dma-buf).
type Bytes struct{ Host, PeerMem, DmaBuf int64 }

// Moved reads Bytes of the fake at lib, which this process must have
// loaded already.
func Moved(lib string) (Bytes, error) {
	cl := C.CString(lib)
	defer C.free(unsafe.Pointer(cl))
	var v [3]int64
	for k := range v {
		n := int64(C.nx_bytes(cl, C.int(k)))
		if n < 0 {
			return Bytes{}, fmt.Errorf("fakes/ibverbs: %s is not loaded or is not the fake (%d)", lib, n)
		}
		v[k] = n
	}
	return Bytes{v[0], v[1], v[2]}, nil
}
