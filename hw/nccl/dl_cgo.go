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
typedef int (*nx_comm_fn)(nx_comm);
typedef int (*nx_async_fn)(nx_comm, int *);
typedef int (*nx_void_fn)(void);
typedef const char *(*nx_errstr_fn)(int);
typedef const char *(*nx_lasterr_fn)(nx_comm);
typedef int (*nx_red_fn)(const void *, void *, size_t, int, int, nx_comm, void *);
typedef int (*nx_rooted_red_fn)(const void *, void *, size_t, int, int, int, nx_comm, void *);
typedef int (*nx_bcast_fn)(const void *, void *, size_t, int, int, nx_comm, void *);
typedef int (*nx_gather_fn)(const void *, void *, size_t, int, nx_comm, void *);

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
static int nx_comm_call(void *f, uintptr_t comm) { return ((nx_comm_fn)f)((nx_comm)comm); }
static int nx_async(void *f, uintptr_t comm, int *e) { return ((nx_async_fn)f)((nx_comm)comm, e); }
static int nx_void(void *f) { return ((nx_void_fn)f)(); }
static const char *nx_errstr(void *f, int rc) { return ((nx_errstr_fn)f)(rc); }
static const char *nx_lasterr(void *f, uintptr_t comm) { return ((nx_lasterr_fn)f)((nx_comm)comm); }

// The collectives: kind 0 allreduce, 1 reduce, 2 broadcast, 3 allgather,
// 4 reduce-scatter (count is recvcount / sendcount as NCCL takes them).
static int nx_coll(void *f, int kind, uintptr_t send, uintptr_t recv, size_t count, int dt, int op, int root,
		uintptr_t comm, uintptr_t stream) {
	const void *s = (const void *)send;
	void *r = (void *)recv, *st = (void *)stream;
	nx_comm c = (nx_comm)comm;
	switch (kind) {
	case 0: case 4: return ((nx_red_fn)f)(s, r, count, dt, op, c, st);
	case 1: return ((nx_rooted_red_fn)f)(s, r, count, dt, op, root, c, st);
	case 2: return ((nx_bcast_fn)f)(s, r, count, dt, root, c, st);
	case 3: return ((nx_gather_fn)f)(s, r, count, dt, c, st);
	}
	return 4; // ncclInvalidArgument
}

// ncclSend(sendbuff, count, datatype, peer, comm, stream) and ncclRecv
// (recvbuff, ...): NCCL 2.7 and later.
typedef int (*nx_p2p_fn)(void *, size_t, int, int, nx_comm, void *);
static int nx_p2p(void *f, uintptr_t buf, size_t count, int dt, int peer, uintptr_t comm, uintptr_t stream) {
	return ((nx_p2p_fn)f)((void *)buf, count, dt, peer, (nx_comm)comm, (void *)stream);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/internal/dtype"
)

// Library is one loaded NCCL: its entry points, resolved once. Safe for
// concurrent use.
type Library struct {
	path string
	f    struct {
		version, getID, initRank, destroy, abort, asyncErr, errstr, lastErr unsafe.Pointer
		groupStart, groupEnd                                                unsafe.Pointer
		send, recv                                                          unsafe.Pointer // nil before NCCL 2.7
		coll                                                                [numKinds]unsafe.Pointer
	}
}

// The collectives, in nx_coll's numbering.
const (
	kAllReduce = iota
	kReduce
	kBroadcast
	kAllGather
	kReduceScatter
	numKinds
)

var collNames = [numKinds]string{"ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter"}

var (
	loadOnce sync.Once
	lib      *Library
	loadErr  error
)

func dlerror() string {
	if e := C.dlerror(); e != nil {
		return C.GoString(e)
	}
	return "unknown dlopen error"
}

// Default returns the process-wide library: the first of libnccl.so.2 and
// libnccl.so that loads. Loaded once. A library the configuration names
// (NEXAR_NCCL, core.Config.NCCLLibrary) is loaded with Open by whoever
// holds the configuration (capi).
func Default() (*Library, error) {
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
		loadErr = fmt.Errorf("%w (tried %s; set NEXAR_NCCL to its path; last error: %s)",
			ErrNoLibrary, strings.Join(names, ", "), last)
	})
	return lib, loadErr
}

// Open loads NCCL (or a stand-in with the same entry points) at path, or by
// name on the loader's path. A library the process has loaded already (torch
// loads libnccl.so.2) is that same library. Local: its symbols do not
// interpose on the process's.
func Open(path string) (*Library, error) {
	cn := C.CString(path)
	h := C.dlopen(cn, C.RTLD_NOW|C.RTLD_LOCAL)
	C.free(unsafe.Pointer(cn))
	if h == nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrNoLibrary, path, dlerror())
	}
	return bind(h, path)
}

func bind(h unsafe.Pointer, path string) (*Library, error) {
	l := &Library{path: path}
	syms := []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"ncclGetVersion", &l.f.version}, {"ncclGetUniqueId", &l.f.getID},
		{"ncclCommInitRank", &l.f.initRank}, {"ncclCommDestroy", &l.f.destroy},
		{"ncclCommAbort", &l.f.abort}, {"ncclCommGetAsyncError", &l.f.asyncErr},
		{"ncclGetErrorString", &l.f.errstr},
		{"ncclGroupStart", &l.f.groupStart}, {"ncclGroupEnd", &l.f.groupEnd},
	}
	for k := range collNames {
		syms = append(syms, struct {
			name string
			dst  *unsafe.Pointer
		}{collNames[k], &l.f.coll[k]})
	}
	for _, s := range syms {
		cs := C.CString(s.name)
		*s.dst = C.dlsym(h, cs)
		C.free(unsafe.Pointer(cs))
		if *s.dst == nil {
			return nil, fmt.Errorf("hw/nccl: %s lacks %s: %s", path, s.name, dlerror())
		}
	}
	for _, o := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"ncclGetLastError", &l.f.lastErr},               // NCCL 2.13 and later; optional
		{"ncclSend", &l.f.send}, {"ncclRecv", &l.f.recv}, // NCCL 2.7 and later
	} {
		cs := C.CString(o.name)
		*o.dst = C.dlsym(h, cs)
		C.free(unsafe.Pointer(cs))
	}
	return l, nil
}

// Path is the name the library was loaded under.
func (l *Library) Path() string { return l.path }

func (l *Library) check(fn string, rc C.int, comm C.uintptr_t) error {
	if rc == 0 {
		return nil
	}
	e := &Error{Func: fn, Code: int(rc), Msg: C.GoString(C.nx_errstr(l.f.errstr, rc))}
	if l.f.lastErr != nil {
		if d := C.GoString(C.nx_lasterr(l.f.lastErr, comm)); d != "" {
			e.Msg += ": " + d
		}
	}
	return e
}

// Version returns NCCL's version code (see the package function Version).
// It needs no GPU.
func (l *Library) Version() (int, error) {
	var v C.int
	if err := l.check("ncclGetVersion", C.nx_version(l.f.version, &v), 0); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NewUniqueID creates the bootstrap token of a new communicator.
func (l *Library) NewUniqueID() (UniqueID, error) {
	var id UniqueID
	err := l.check("ncclGetUniqueId", C.nx_getid(l.f.getID, unsafe.Pointer(&id[0])), 0)
	return id, err
}

// NewComm joins the communicator identified by id as rank of n, on the
// calling OS thread's current CUDA device (callers lock the goroutine to
// its thread and set the device). It blocks until all n ranks have joined:
// NCCL has no deadline of its own, so callers bound it themselves.
func (l *Library) NewComm(id UniqueID, n, rank int) (*Comm, error) {
	c := &Comm{l: l}
	if err := l.check("ncclCommInitRank", C.nx_init(l.f.initRank, &c.comm, C.int(n), unsafe.Pointer(&id[0]), C.int(rank)), 0); err != nil {
		return nil, err
	}
	return c, nil
}

// Group runs fn between ncclGroupStart and ncclGroupEnd on one OS thread
// (NCCL's groups are per thread): the operations fn enqueues are launched
// together at the end. It returns fn's error, else ncclGroupEnd's.
func (l *Library) Group(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := l.check("ncclGroupStart", C.nx_void(l.f.groupStart), 0); err != nil {
		return err
	}
	err := fn()
	if e := l.check("ncclGroupEnd", C.nx_void(l.f.groupEnd), 0); err == nil {
		err = e
	}
	return err
}

// Comm is an NCCL communicator. Enqueueing calls and Close are for one
// goroutine at a time; AsyncError and Abort may be called from any
// goroutine, also while another is enqueueing (NCCL's rule). No call may
// follow Abort or Close.
type Comm struct {
	l    *Library
	comm C.uintptr_t
}

// NewComm joins a communicator through the Default library.
func NewComm(id UniqueID, n, rank int) (*Comm, error) {
	l, err := Default()
	if err != nil {
		return nil, err
	}
	return l.NewComm(id, n, rank)
}

func (c *Comm) coll(kind int, send, recv cuda.DevicePtr, count int, dt dtype.DType, op dtype.Op, root int, stream cuda.Stream) error {
	ndt, err := DType(dt)
	if err != nil {
		return err
	}
	nop := 0
	if kind == kAllReduce || kind == kReduce || kind == kReduceScatter {
		if nop, err = Op(op); err != nil {
			return err
		}
	}
	return c.l.check(collNames[kind], C.nx_coll(c.l.f.coll[kind], C.int(kind), C.uintptr_t(send), C.uintptr_t(recv),
		C.size_t(count), C.int(ndt), C.int(nop), C.int(root), c.comm, C.uintptr_t(stream)), c.comm)
}

// AllReduce enqueues on stream the reduction of count elements of dt from
// send into recv (device addresses) across the ranks. Like every collective
// here, it only enqueues the work: the result is there once the stream has
// passed it.
func (c *Comm) AllReduce(send, recv cuda.DevicePtr, count int, dt dtype.DType, op dtype.Op, stream cuda.Stream) error {
	return c.coll(kAllReduce, send, recv, count, dt, op, 0, stream)
}

// Reduce enqueues the reduction of count elements into root's recv (recv is
// not used on the other ranks).
func (c *Comm) Reduce(send, recv cuda.DevicePtr, count int, dt dtype.DType, op dtype.Op, root int, stream cuda.Stream) error {
	return c.coll(kReduce, send, recv, count, dt, op, root, stream)
}

// Broadcast enqueues the copy of root's send (count elements) into every
// rank's recv (send is used on root only; send == recv is in place).
func (c *Comm) Broadcast(send, recv cuda.DevicePtr, count int, dt dtype.DType, root int, stream cuda.Stream) error {
	return c.coll(kBroadcast, send, recv, count, dt, 0, root, stream)
}

// AllGather enqueues the gathering of every rank's send (sendcount
// elements) into recv, rank order (in place: send == recv + rank*sendcount).
func (c *Comm) AllGather(send, recv cuda.DevicePtr, sendcount int, dt dtype.DType, stream cuda.Stream) error {
	return c.coll(kAllGather, send, recv, sendcount, dt, 0, 0, stream)
}

// ReduceScatter enqueues the reduction of send (n*recvcount elements) with
// block r of the result into rank r's recv (in place: recv == send +
// rank*recvcount).
func (c *Comm) ReduceScatter(send, recv cuda.DevicePtr, recvcount int, dt dtype.DType, op dtype.Op, stream cuda.Stream) error {
	return c.coll(kReduceScatter, send, recv, recvcount, dt, op, 0, stream)
}

// HasP2P reports whether the library has ncclSend and ncclRecv.
func (l *Library) HasP2P() bool { return l.f.send != nil && l.f.recv != nil }

// Send enqueues on stream the sending of count elements of dt at buf
// (device memory) to peer (a rank of c), which must enqueue the matching
// Recv: NCCL matches a pair's sends and receives in the order they were
// enqueued, with no tag, and a Send waits for its Recv (group a pair's
// exchange in one Library.Group). Safe as the collectives are.
func (c *Comm) Send(buf cuda.DevicePtr, count int, dt dtype.DType, peer int, stream cuda.Stream) error {
	return c.p2p("ncclSend", c.l.f.send, buf, count, dt, peer, stream)
}

// Recv enqueues on stream the receipt of count elements of dt from peer
// into buf (device memory); see Send.
func (c *Comm) Recv(buf cuda.DevicePtr, count int, dt dtype.DType, peer int, stream cuda.Stream) error {
	return c.p2p("ncclRecv", c.l.f.recv, buf, count, dt, peer, stream)
}

func (c *Comm) p2p(name string, f unsafe.Pointer, buf cuda.DevicePtr, count int, dt dtype.DType, peer int, stream cuda.Stream) error {
	if f == nil {
		return fmt.Errorf("%w: %s lacks %s (NCCL 2.7 or later has it)", ErrNoLibrary, c.l.path, name)
	}
	ndt, err := DType(dt)
	if err != nil {
		return err
	}
	return c.l.check(name, C.nx_p2p(f, C.uintptr_t(buf), C.size_t(count), C.int(ndt), C.int(peer), c.comm, C.uintptr_t(stream)), c.comm)
}

// AsyncError returns the error NCCL found while running the communicator's
// work (ncclCommGetAsyncError: a peer's connection lost, a CUDA error), or
// nil. Safe while other goroutines use c; not after Abort or Close.
func (c *Comm) AsyncError() error {
	var e C.int
	if err := c.l.check("ncclCommGetAsyncError", C.nx_async(c.l.f.asyncErr, c.comm, &e), c.comm); err != nil {
		return err
	}
	if e == 0 {
		return nil
	}
	return &Error{Func: "ncclCommGetAsyncError", Code: int(e), Msg: C.GoString(C.nx_errstr(c.l.f.errstr, e))}
}

// Abort ends the communicator's uncompleted work (a collective waiting for
// a dead peer completes, its output undefined) and frees it. Safe while
// another goroutine is enqueueing or waiting.
func (c *Comm) Abort() error {
	return c.l.check("ncclCommAbort", C.nx_comm_call(c.l.f.abort, c.comm), 0)
}

// Close destroys the communicator once its launched work has completed.
func (c *Comm) Close() error {
	return c.l.check("ncclCommDestroy", C.nx_comm_call(c.l.f.destroy, c.comm), 0)
}

// LibraryVersion returns the Default library's version code. It needs no
// GPU.
func LibraryVersion() (int, error) {
	l, err := Default()
	if err != nil {
		return 0, err
	}
	return l.Version()
}

// Available returns nil when NCCL loads and CUDA sees a device.
func Available() error {
	if _, err := Default(); err != nil {
		return err
	}
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("hw/nccl: %w", err)
	}
	return nil
}

// NewUniqueID creates a bootstrap token through the Default library.
func NewUniqueID() (UniqueID, error) {
	l, err := Default()
	if err != nil {
		return UniqueID{}, err
	}
	return l.NewUniqueID()
}
