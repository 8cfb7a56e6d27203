package main

/*
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
	"github.com/nexar-go/nexar/hw/cuda"
)

// The hierarchical device collectives (package hier) in the C ABI: an
// allreduce, broadcast, allgather or reduce-scatter whose buffers are all
// device memory, blocking or _stream, goes to NCCL within a host and nexar
// between hosts where hier.Router.Route says so (NEXAR_NCCL_HIER, read into
// the communicator's configuration); otherwise device buffers are staged
// (capi/devmem.go). capi only converts the C values.

// route returns the hierarchical communicator for a call of a.fn whose
// buffers are bufs, or nil when the call takes the usual path (which
// reports bad arguments).
func (a *args) route(handle C.uintptr_t, count C.size_t, dt, op C.int, reduces bool, bufs ...unsafe.Pointer) *hier.Comm {
	if router.Runtime() == nil || count == 0 || !a.ok() || dt < 0 || op < 0 {
		return nil
	}
	c := a.comm(handle)
	if !a.ok() {
		return nil
	}
	ptrs := make([]uintptr, len(bufs))
	for i, p := range bufs {
		ptrs[i] = uintptr(p)
	}
	x := hier.Collective{Count: int(count), DType: collective.DType(dt), Op: collective.Op(op), Reduces: reduces, Bufs: ptrs}
	h, err := router.Route(bg, uintptr(handle), c, x)
	var se *hier.SetupError
	switch {
	case errors.As(err, &se):
		a.failf(resultOf(se.Err), "%v", err)
	case err != nil:
		a.devErr(err)
	}
	return h
}

func devPtr(p unsafe.Pointer) cuda.DevicePtr { return cuda.DevicePtr(uintptr(p)) }

// hierCall makes call through the handle's hierarchy, on the call's stream
// and blocking unless a _stream variant, when a.route says so; ok is false
// when the call takes the usual path. countName and perRank describe the
// count argument (perRank: it counts one rank's block of a buffer of
// Size() blocks).
func hierCall(a *args, comm C.uintptr_t, countName string, count C.size_t, perRank bool, dt, op C.int, reduces bool,
	bufs []unsafe.Pointer, call func(h *hier.Comm, stream cuda.Stream, blocking bool) error) (r C.int, ok bool) {
	return hierOrDirect(a, comm, countName, count, perRank, dt, op, reduces, bufs, call, "", 0, nil)
}

// hierOrDirect is hierCall that, where the hierarchy does not take the
// call, makes it by GPUDirect RDMA (direct) where hier.Router.Direct
// chooses that (every path between the members moves device memory); a
// nil direct leaves it to the usual path.
func hierOrDirect(a *args, comm C.uintptr_t, countName string, count C.size_t, perRank bool, dt, op C.int, reduces bool,
	bufs []unsafe.Pointer, call func(h *hier.Comm, stream cuda.Stream, blocking bool) error, kind string, root C.int, direct func(d *hier.Direct) error) (r C.int, ok bool) {
	h := a.route(comm, count, dt, op, reduces, bufs...)
	if !a.ok() {
		return a.fail(), true
	}
	if h == nil && direct != nil {
		return directCall(a, comm, countName, count, perRank, dt, op, reduces, bufs, kind, root, direct)
	}
	if h == nil {
		return 0, false
	}
	mult := 1
	if perRank {
		mult = h.Size()
	}
	if a.bytes(countName, count, mult, collective.DType(dt)); !a.ok() {
		return a.fail(), true
	}
	err := call(h, a.dev.Stream(), !a.dev.StreamVariant())
	var ce *core.Error
	if err != nil && !errors.As(err, &ce) {
		return fail(a.fn, resUnavailable, "%v", err), true
	}
	return result(a.fn, err), true
}

// directCall makes a device collective by GPUDirect RDMA where
// hier.Router.Direct chooses that (collectively: every rank asks, for the
// same call); ok is false when it chose staging. Like a point-to-point
// call by GPUDirect, it first waits for the work on the caller's stream
// and returns with the transfer over: nothing is left on the stream.
func directCall(a *args, comm C.uintptr_t, countName string, count C.size_t, perRank bool, dt, op C.int, reduces bool,
	bufs []unsafe.Pointer, kind string, root C.int, direct func(d *hier.Direct) error) (C.int, bool) {
	if router.Runtime() == nil || count == 0 || dt < 0 || op < 0 {
		return 0, false
	}
	c := a.comm(comm)
	if !a.ok() {
		return a.fail(), true
	}
	ptrs := make([]uintptr, len(bufs))
	for i, p := range bufs {
		ptrs[i] = uintptr(p)
	}
	x := hier.Collective{Count: int(count), DType: collective.DType(dt), Op: collective.Op(op), Reduces: reduces, Bufs: ptrs}
	d, err := router.Direct(bg, uintptr(comm), c, kind, int(root), x)
	if err != nil {
		return result(a.fn, err), true
	}
	if d == nil {
		return 0, false
	}
	mult := 1
	if perRank {
		mult = c.Size()
	}
	if a.bytes(countName, count, mult, collective.DType(dt)); !a.ok() {
		return a.fail(), true
	}
	if err := a.dev.WaitStream(); err != nil {
		return a.result(err), true
	}
	err = direct(d)
	var ae *hier.ArgError
	var ce *core.Error
	switch {
	case errors.As(err, &ae):
		a.devErr(err)
		return a.fail(), true
	case err != nil && !errors.As(err, &ce):
		return fail(a.fn, resUnavailable, "%v", err), true
	}
	return result(a.fn, err), true
}

// hierAllreduce serves nexar_allreduce and nexar_allreduce_stream.
func hierAllreduce(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (C.int, bool) {
	return hierOrDirect(a, comm, "count", count, false, dt, op, true, []unsafe.Pointer{sendbuf, recvbuf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.Allreduce(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), collective.Op(op), s, blocking)
		},
		"allreduce", 0, func(d *hier.Direct) error {
			return d.Allreduce(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), collective.Op(op))
		})
}

// hierBroadcast serves nexar_broadcast and nexar_broadcast_stream.
func hierBroadcast(a *args, buf unsafe.Pointer, count C.size_t, dt, root C.int, comm C.uintptr_t) (C.int, bool) {
	return hierOrDirect(a, comm, "count", count, false, dt, 0, false, []unsafe.Pointer{buf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.Broadcast(bg, devPtr(buf), int(count), collective.DType(dt), int(root), s, blocking)
		},
		"broadcast", root, func(d *hier.Direct) error {
			if root < 0 || int(root) >= d.Comm().Size() {
				return &hier.ArgError{Msg: fmt.Sprintf("root %d is not one of the %d ranks", root, d.Comm().Size())}
			}
			return d.Broadcast(bg, devPtr(buf), int(count)*collective.DType(dt).Size(), int(root))
		})
}

// hierAllgather serves nexar_allgather and nexar_allgather_stream.
func hierAllgather(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt C.int, comm C.uintptr_t) (C.int, bool) {
	return hierOrDirect(a, comm, "count", count, true, dt, 0, false, []unsafe.Pointer{sendbuf, recvbuf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.Allgather(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), s, blocking)
		},
		"allgather", 0, func(d *hier.Direct) error {
			n := int(count) * collective.DType(dt).Size()
			send := devPtr(sendbuf)
			if sendbuf == recvbuf { // in place: this rank's block is in recvbuf already
				send += cuda.DevicePtr(d.Comm().Rank() * n)
			}
			return d.Allgather(bg, send, devPtr(recvbuf), n)
		})
}

// hierReduceScatter serves nexar_reduce_scatter and nexar_reduce_scatter_stream.
func hierReduceScatter(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (C.int, bool) {
	return hierCall(a, comm, "recvcount", count, true, dt, op, true, []unsafe.Pointer{sendbuf, recvbuf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.ReduceScatter(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), collective.Op(op), s, blocking)
		})
}
