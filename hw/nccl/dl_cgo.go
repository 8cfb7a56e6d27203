//go:build cgo

package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

typedef struct { char internal[128]; } nx_nccl_id; // ncclUniqueId
typedef void *nx_comm;                              // ncclComm_t

typedef int (*nx_version_fn)(int *);
typedef int (*nx_getid_fn)(nx_nccl_id *);
typedef int (*nx_init_fn)(nx_comm *, int, nx_nccl_id, int);
typedef int (*nx_allreduce_fn)(const void *, void *, size_t, int, int, nx_comm, void *);
typedef int (*nx_destroy_fn)(nx_comm);
typedef const char *(*nx_errstr_fn)(int);

static int nx_version(void *f, int *v) { return ((nx_version_fn)f)(v); }
static int nx_getid(void *f, void *out) { return ((nx_getid_fn)f)((nx_nccl_id *)out); }
static int nx_init(void *f, uintptr_t *comm, int n, const void *id, int rank) {
	nx_nccl_id u;
	memcpy(&u, id, sizeof u);
	nx_comm c = NULL;
	int rc = ((nx_init_fn)f)(&c, n, u, rank);
	*comm = (uintptr_t)c;
	return rc;
}
static int nx_allreduce(void *f, uintptr_t send, uintptr_t recv, size_t count, int dt, int op,
		uintptr_t comm, uintptr_t stream) {
	return ((nx_allreduce_fn)f)((const void *)send, (void *)recv, count, dt, op,
		(nx_comm)comm, (void *)stream);
}
static int nx_destroy(void *f, uintptr_t comm) { return ((nx_destroy_fn)f)((nx_comm)comm); }
static const char *nx_errstr(void *f, int rc) { return ((nx_errstr_fn)f)(rc); }
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/hw/cuda"
)

type library struct {
	path                                                 string
	version, getID, initRank, allReduce, destroy, errstr unsafe.Pointer
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
		if p := os.Getenv("NEXAR_NCCL"); p != "" {
			names = append([]string{p}, names...)
		}
		var h unsafe.Pointer
		var path, last string
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
			loadErr = fmt.Errorf("%w (tried %s; set NEXAR_NCCL to its path; last error: %s)",
				ErrNoLibrary, strings.Join(names, ", "), last)
			return
		}
		l := &library{path: path}
		for _, s := range []struct {
			name string
			dst  *unsafe.Pointer
		}{
			{"ncclGetVersion", &l.version}, {"ncclGetUniqueId", &l.getID},
			{"ncclCommInitRank", &l.initRank}, {"ncclAllReduce", &l.allReduce},
			{"ncclCommDestroy", &l.destroy}, {"ncclGetErrorString", &l.errstr},
		} {
			cs := C.CString(s.name)
			*s.dst = C.dlsym(h, cs)
			C.free(unsafe.Pointer(cs))
			if *s.dst == nil {
				loadErr = fmt.Errorf("hw/nccl: %s lacks %s: %s", path, s.name, dlerror())
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

// LibraryVersion returns NCCL's version code (see Version). It needs no GPU.
func LibraryVersion() (int, error) {
	l, err := load()
	if err != nil {
		return 0, err
	}
	var v C.int
	if err := l.check("ncclGetVersion", C.nx_version(l.version, &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Available returns nil when NCCL loads and CUDA sees a device.
func Available() error {
	if _, err := load(); err != nil {
		return err
	}
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("hw/nccl: %w", err)
	}
	return nil
}

// NewUniqueID creates the bootstrap token (on rank 0).
func NewUniqueID() (UniqueID, error) {
	var id UniqueID
	l, err := load()
	if err != nil {
		return id, err
	}
	err = l.check("ncclGetUniqueId", C.nx_getid(l.getID, unsafe.Pointer(&id[0])))
	return id, err
}

// Comm is an NCCL communicator. Use it from one goroutine at a time.
type Comm struct {
	l    *library
	comm C.uintptr_t
}

// NewComm joins the communicator identified by id as rank of n. It blocks
// until all n ranks have joined (NCCL has no deadline of its own: callers
// bound it through their control-plane barrier).
func NewComm(id UniqueID, n, rank int) (*Comm, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	c := &Comm{l: l}
	if err := l.check("ncclCommInitRank", C.nx_init(l.initRank, &c.comm, C.int(n), unsafe.Pointer(&id[0]), C.int(rank))); err != nil {
		return nil, err
	}
	return c, nil
}

// AllReduce reduces count elements of dt from send into recv (device
// addresses) on stream (0 for the default stream). It only enqueues the work.
func (c *Comm) AllReduce(send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op, stream uintptr) error {
	ndt, err := DType(dt)
	if err != nil {
		return err
	}
	nop, err := Op(op)
	if err != nil {
		return err
	}
	return c.l.check("ncclAllReduce", C.nx_allreduce(c.l.allReduce, C.uintptr_t(send), C.uintptr_t(recv),
		C.size_t(count), C.int(ndt), C.int(nop), c.comm, C.uintptr_t(stream)))
}

// Close destroys the communicator.
func (c *Comm) Close() error {
	return c.l.check("ncclCommDestroy", C.nx_destroy(c.l.destroy, c.comm))
}
