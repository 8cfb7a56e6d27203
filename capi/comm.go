package main

/*
#include <stdlib.h>

#include "capi.h"
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

// bg is the context of every call: core bounds each operation by the
// communicator's Timeout, and the C API has no cancellation of its own
// (nexar_comm_abort plays that role).
var bg = context.Background()

//export nxgo_comm_init_from_env
func nxgo_comm_init_from_env(comm *C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_init_from_env"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.out("comm", unsafe.Pointer(comm))
	if !a.ok() {
		return a.fail()
	}
	*comm = 0
	cfg, err := core.ConfigFromLookup(cEnv)
	if err != nil {
		return fail(fn, resInvalidArgument, "%v", err)
	}
	return newComm(fn, cfg, comm)
}

// cEnv looks name up in the C environment as it is now: the Env of every
// config capi makes (core reads the knobs through it). os.LookupEnv would
// read Go's copy, taken when the runtime started (library load), so a
// variable the host program set or changed with setenv since would be
// missed. getenv is not safe against a concurrent setenv in another thread;
// that is the host program's to avoid, as for any getenv.
func cEnv(name string) (string, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

//export nxgo_comm_init
func nxgo_comm_init(config unsafe.Pointer, comm *C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_init"
	defer recoverToResult(fn, &r)
	return initFrom(fn, config, comm, false)
}

// initFrom creates a communicator from a nexar_config_t: the world it
// describes, or with join (nexar_comm_join) this process's place in a
// running job.
func initFrom(fn string, config unsafe.Pointer, comm *C.uintptr_t, join bool) C.int {
	a := args{fn: fn}
	a.out("config", config)
	a.out("comm", unsafe.Pointer(comm))
	if !a.ok() {
		return a.fail()
	}
	*comm = 0
	cfg := readConfig(&a, config, join)
	if a.ok() && join && cfg.Seed == "" {
		a.failf(resInvalidArgument, "config->seed_addr is NULL: give the seed's or a member's lobby address (a comma-separated list tries each)")
	}
	if !a.ok() {
		return a.fail()
	}
	return newComm(fn, cfg, comm) // with join, core.New joins (cfg.Join)
}

func newComm(fn string, cfg core.Config, out *C.uintptr_t) C.int {
	// The knobs the config leaves unset, from the C environment as it is
	// now (core.New would read Go's copy, taken when the library loaded);
	// the device probe needs the CUDA runtime's knob first.
	cfg.Env = cEnv
	cfg, err := cfg.WithEnv()
	if err != nil {
		return fail(fn, resInvalidArgument, "%v", err)
	}
	router.Probe(cfg) // first: the data path takes the runtime (GPUDirect RDMA)
	cfg.GPU = gpu()
	c, err := newWorld(bg, cfg)
	if err != nil {
		return result(fn, err)
	}
	*out = C.uintptr_t(comms.add(c))
	return resSuccess
}

//export nxgo_comm_destroy
func nxgo_comm_destroy(comm C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_destroy"
	defer recoverToResult(fn, &r)
	c, ok := comms.remove(uintptr(comm))
	if !ok {
		return fail(fn, resInvalidHandle, "comm %#x is not a valid communicator (never created, or already destroyed)", uintptr(comm))
	}
	w := watchers.remove(uintptr(comm))
	if w != nil {
		w.stop(uintptr(comm)) // no handler call from here on, none running (unless this is one)
	}
	router.Release(uintptr(comm)) // NCCL and the hierarchy's communicators, before their parent
	// Close is local and idempotent; its error (if any) is only reported.
	// It closes the failure stream, which ends the watcher's goroutine.
	// The handle owns the successors the shrink policy made for it too.
	return result(fn, c.CloseChain())
}

//export nxgo_comm_abort
func nxgo_comm_abort(comm C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_abort"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if !a.ok() {
		return a.fail()
	}
	c.Abort(nil)
	return resSuccess
}

//export nxgo_comm_rank
func nxgo_comm_rank(comm C.uintptr_t, rank *C.int) (r C.int) {
	const fn = "nexar_comm_rank"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("rank", unsafe.Pointer(rank))
	if !a.ok() {
		return a.fail()
	}
	*rank = C.int(c.Rank())
	return resSuccess
}

//export nxgo_comm_size
func nxgo_comm_size(comm C.uintptr_t, size *C.int) (r C.int) {
	const fn = "nexar_comm_size"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("size", unsafe.Pointer(size))
	if !a.ok() {
		return a.fail()
	}
	*size = C.int(c.Size())
	return resSuccess
}

//export nxgo_comm_split
func nxgo_comm_split(comm C.uintptr_t, color, key C.int, newcomm *C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_split"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("newcomm", unsafe.Pointer(newcomm))
	if !a.ok() {
		return a.fail()
	}
	*newcomm = 0
	nc, err := c.Split(bg, int(color), int(key))
	if err != nil {
		return result(fn, err)
	}
	if nc != nil {
		*newcomm = C.uintptr_t(comms.add(nc))
		router.Probe(nc.Config())
	}
	return resSuccess
}

//export nxgo_comm_get_path
func nxgo_comm_get_path(comm C.uintptr_t, peer C.int, buf *C.char, size C.size_t, n *C.size_t) (r C.int) {
	const fn = "nexar_comm_get_path"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("len", unsafe.Pointer(n))
	if size > 0 {
		a.out("buf", unsafe.Pointer(buf))
	}
	if !a.ok() {
		return a.fail()
	}
	if peer < 0 || int(peer) >= c.Size() {
		return fail(fn, resInvalidArgument, "peer %d is not a rank of this communicator (size %d)", int(peer), c.Size())
	}
	path := c.Paths()[int(peer)]
	*n = C.size_t(len(path))
	if size > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(size))
		k := copy(dst[:len(dst)-1], path)
		dst[k] = 0
	}
	return resSuccess
}

//export nxgo_comm_get_error
func nxgo_comm_get_error(comm C.uintptr_t, errp *C.int) (r C.int) {
	const fn = "nexar_comm_get_error"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("error", unsafe.Pointer(errp))
	if !a.ok() {
		return a.fail()
	}
	*errp = resultOf(c.Err())
	return resSuccess
}
