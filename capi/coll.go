package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
)

// Each collective has a prep function shared by its blocking and
// non-blocking exports: it checks the arguments and turns C pointers into
// slices (nil send or recv meaning in place, as core expects).

type reduceArgs struct {
	c          *core.Comm
	send, recv []byte
	dt         collective.DType
	op         collective.Op
	root       int
	asideLen   int // reduce-scatter in place: recv's result length, input to copy aside
}

// aside copies an in-place reduce-scatter's input aside (see
// prepReduceScatter), when the call runs: a staged device buffer holds its
// data only then.
func (x *reduceArgs) aside() {
	if x.asideLen > 0 {
		x.send = append([]byte{}, x.recv...)
		x.recv = x.recv[:x.asideLen:x.asideLen]
		x.asideLen = 0
	}
}

// prepElementwise serves allreduce, scan and exscan (and reduce with
// rooted = true): send and recv both hold count elements.
func prepElementwise(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, root C.int, rooted bool, comm C.uintptr_t) reduceArgs {
	var x reduceArgs
	x.c = a.comm(comm)
	x.dt, x.op = a.dtypeOp(dt, op)
	n := a.bytes("count", count, 1, x.dt)
	if !a.ok() {
		return x
	}
	isRoot := true
	if rooted {
		x.root = a.rank("root", root, x.c.Size(), false)
		isRoot = x.c.Rank() == x.root
	}
	switch {
	case isRoot && same(sendbuf, recvbuf):
		x.recv = a.buf("recvbuf", recvbuf, n)
	case isRoot:
		x.send = a.buf("sendbuf", sendbuf, n)
		x.recv = a.buf("recvbuf", recvbuf, n)
	default: // a non-root of reduce: recvbuf is not used
		x.send = a.buf("sendbuf", sendbuf, n)
	}
	return x
}

//export nxgo_allreduce
func nxgo_allreduce(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_allreduce"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	if r, ok := hierAllreduce(&a, sendbuf, recvbuf, count, dt, op, comm); ok {
		return r
	}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Allreduce(bg, x.send, x.recv, x.dt, x.op) })
}

//export nxgo_iallreduce
func nxgo_iallreduce(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iallreduce"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IAllreduce(x.send, x.recv, x.dt, x.op)})
	return resSuccess
}

//export nxgo_reduce
func nxgo_reduce(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_reduce"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, root, true, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Reduce(bg, x.send, x.recv, x.dt, x.op, x.root) })
}

//export nxgo_ireduce
func nxgo_ireduce(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, root C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_ireduce"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, root, true, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IReduce(x.send, x.recv, x.dt, x.op, x.root)})
	return resSuccess
}

//export nxgo_scan
func nxgo_scan(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_scan"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Scan(bg, x.send, x.recv, x.dt, x.op) })
}

//export nxgo_exscan
func nxgo_exscan(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_exscan"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Exscan(bg, x.send, x.recv, x.dt, x.op) })
}

//export nxgo_iscan
func nxgo_iscan(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iscan"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IScan(x.send, x.recv, x.dt, x.op)})
	return resSuccess
}

//export nxgo_iexscan
func nxgo_iexscan(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iexscan"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IExscan(x.send, x.recv, x.dt, x.op)})
	return resSuccess
}

func prepBroadcast(a *args, buf unsafe.Pointer, count C.size_t, dt, root C.int, comm C.uintptr_t) (*core.Comm, []byte, collective.DType, int) {
	c := a.comm(comm)
	t := a.dtype(dt)
	b := a.buf("buf", buf, a.bytes("count", count, 1, t))
	if !a.ok() {
		return nil, nil, 0, 0
	}
	return c, b, t, a.rank("root", root, c.Size(), false)
}

//export nxgo_broadcast
func nxgo_broadcast(buf unsafe.Pointer, count C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_broadcast"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	if r, ok := hierBroadcast(&a, buf, count, dt, root, comm); ok {
		return r
	}
	c, b, t, rt := prepBroadcast(&a, buf, count, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return c.Broadcast(bg, b, t, rt) })
}

//export nxgo_ibroadcast
func nxgo_ibroadcast(buf unsafe.Pointer, count C.size_t, dt, root C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_ibroadcast"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c, b, t, rt := prepBroadcast(&a, buf, count, dt, root, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: c.IBroadcast(b, t, rt)})
	return resSuccess
}

type blockArgs struct {
	c          *core.Comm
	send, recv []byte
	dt         collective.DType
}

// prepGatherLike serves allgather (send: count, recv: size*count) and
// alltoall (both size*count); in place when sendbuf == recvbuf.
func prepGatherLike(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt C.int, comm C.uintptr_t, sendBlocks bool) blockArgs {
	var x blockArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	size := x.c.Size()
	ns := a.bytes("count", count, 1, x.dt)
	if sendBlocks {
		ns = a.bytes("count", count, size, x.dt)
	}
	nr := a.bytes("count", count, size, x.dt)
	if !same(sendbuf, recvbuf) {
		x.send = a.buf("sendbuf", sendbuf, ns)
	}
	x.recv = a.buf("recvbuf", recvbuf, nr)
	return x
}

//export nxgo_allgather
func nxgo_allgather(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_allgather"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	if r, ok := hierAllgather(&a, sendbuf, recvbuf, sendcount, dt, comm); ok {
		return r
	}
	x := prepGatherLike(&a, sendbuf, recvbuf, sendcount, dt, comm, false)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Allgather(bg, x.send, x.recv, x.dt) })
}

//export nxgo_iallgather
func nxgo_iallgather(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iallgather"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepGatherLike(&a, sendbuf, recvbuf, sendcount, dt, comm, false)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IAllgather(x.send, x.recv, x.dt)})
	return resSuccess
}

//export nxgo_alltoall
func nxgo_alltoall(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_alltoall"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepGatherLike(&a, sendbuf, recvbuf, count, dt, comm, true)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Alltoall(bg, x.send, x.recv, x.dt) })
}

//export nxgo_ialltoall
func nxgo_ialltoall(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_ialltoall"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepGatherLike(&a, sendbuf, recvbuf, count, dt, comm, true)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IAlltoall(x.send, x.recv, x.dt)})
	return resSuccess
}

// prepReduceScatter: send holds size*recvcount elements, recv recvcount.
// In place (sendbuf == recvbuf) the input is copied aside so the result can
// go to the front of the buffer, as the header promises, whatever core's
// own in-place layout is.
func prepReduceScatter(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) reduceArgs {
	var x reduceArgs
	x.c = a.comm(comm)
	x.dt, x.op = a.dtypeOp(dt, op)
	if !a.ok() {
		return x
	}
	ns := a.bytes("recvcount", count, x.c.Size(), x.dt)
	nr := a.bytes("recvcount", count, 1, x.dt)
	if same(sendbuf, recvbuf) {
		x.recv = a.buf("recvbuf", recvbuf, ns)
		x.asideLen = nr
		if nr == 0 {
			x.send, x.recv = []byte{}, []byte{}
		}
		return x
	}
	x.send = a.buf("sendbuf", sendbuf, ns)
	x.recv = a.buf("recvbuf", recvbuf, nr)
	return x
}

//export nxgo_reduce_scatter
func nxgo_reduce_scatter(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, op C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_reduce_scatter"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	if r, ok := hierReduceScatter(&a, sendbuf, recvbuf, recvcount, dt, op, comm); ok {
		return r
	}
	x := prepReduceScatter(&a, sendbuf, recvbuf, recvcount, dt, op, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { x.aside(); return x.c.ReduceScatter(bg, x.send, x.recv, x.dt, x.op) })
}

//export nxgo_ireduce_scatter
func nxgo_ireduce_scatter(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, op C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_ireduce_scatter"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepReduceScatter(&a, sendbuf, recvbuf, recvcount, dt, op, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	x.aside()
	*req = newRequest(&request{r: x.c.IReduceScatter(x.send, x.recv, x.dt, x.op)})
	return resSuccess
}

// vArgs are the arguments of gather, scatter and the v-forms, as core
// takes them (counts and displs copied into Go memory: the caller may free
// its arrays once the call returns, even for a non-blocking one).
type vArgs struct {
	c                *core.Comm
	send, recv       []byte
	counts, displs   []int // gatherv/scatterv/allgatherv: root's (or everyone's)
	rcounts, rdispls []int // alltoallv: the receive side
	dt               collective.DType
	root             int
}

// prepGather: root's recvbuf holds size*sendcount elements; in place when
// root passes sendbuf == recvbuf.
func prepGather(a *args, sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt, root C.int, comm C.uintptr_t) vArgs {
	var x vArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	x.root = a.rank("root", root, x.c.Size(), false)
	ns := a.bytes("sendcount", sendcount, 1, x.dt)
	if x.c.Rank() == x.root {
		x.recv = a.buf("recvbuf", recvbuf, a.bytes("sendcount", sendcount, x.c.Size(), x.dt))
		if !same(sendbuf, recvbuf) {
			x.send = a.buf("sendbuf", sendbuf, ns)
		}
	} else {
		x.send = a.buf("sendbuf", sendbuf, ns)
	}
	return x
}

//export nxgo_gather
func nxgo_gather(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_gather"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepGather(&a, sendbuf, recvbuf, sendcount, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Gather(bg, x.send, x.recv, x.dt, x.root) })
}

//export nxgo_igather
func nxgo_igather(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt, root C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_igather"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepGather(&a, sendbuf, recvbuf, sendcount, dt, root, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IGather(x.send, x.recv, x.dt, x.root)})
	return resSuccess
}

// prepScatter: root's sendbuf holds size*recvcount elements; in place when
// root passes sendbuf == recvbuf.
func prepScatter(a *args, sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t) vArgs {
	var x vArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	x.root = a.rank("root", root, x.c.Size(), false)
	nr := a.bytes("recvcount", recvcount, 1, x.dt)
	if x.c.Rank() == x.root {
		x.send = a.buf("sendbuf", sendbuf, a.bytes("recvcount", recvcount, x.c.Size(), x.dt))
		if !same(sendbuf, recvbuf) {
			x.recv = a.buf("recvbuf", recvbuf, nr)
		}
	} else {
		x.recv = a.buf("recvbuf", recvbuf, nr)
	}
	return x
}

//export nxgo_scatter
func nxgo_scatter(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_scatter"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepScatter(&a, sendbuf, recvbuf, recvcount, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Scatter(bg, x.send, x.recv, x.dt, x.root) })
}

//export nxgo_iscatter
func nxgo_iscatter(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iscatter"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepScatter(&a, sendbuf, recvbuf, recvcount, dt, root, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IScatter(x.send, x.recv, x.dt, x.root)})
	return resSuccess
}

func prepAllgatherv(a *args, sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt C.int, comm C.uintptr_t) vArgs {
	var x vArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	x.counts = a.counts("recvcounts", recvcounts, x.c.Size())
	x.displs = a.counts("displs", displs, x.c.Size())
	x.recv = a.buf("recvbuf", recvbuf, a.extent("recvcounts/displs", x.counts, x.displs, x.dt))
	if a.ok() && uint64(sendcount) != uint64(x.counts[x.c.Rank()]) {
		a.failf(resInvalidArgument, "sendcount %d differs from recvcounts[%d] = %d", uint64(sendcount), x.c.Rank(), x.counts[x.c.Rank()])
	}
	if !same(sendbuf, recvbuf) {
		x.send = a.buf("sendbuf", sendbuf, a.bytes("sendcount", sendcount, 1, x.dt))
	}
	return x
}

//export nxgo_allgatherv
func nxgo_allgatherv(sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_allgatherv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepAllgatherv(&a, sendbuf, sendcount, recvbuf, recvcounts, displs, dt, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Allgatherv(bg, x.send, x.recv, x.counts, x.displs, x.dt) })
}

//export nxgo_iallgatherv
func nxgo_iallgatherv(sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iallgatherv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepAllgatherv(&a, sendbuf, sendcount, recvbuf, recvcounts, displs, dt, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IAllgatherv(x.send, x.recv, x.counts, x.displs, x.dt)})
	return resSuccess
}

func prepGatherv(a *args, sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt, root C.int, comm C.uintptr_t) vArgs {
	var x vArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	x.root = a.rank("root", root, x.c.Size(), false)
	inPlace := false
	if x.c.Rank() == x.root {
		x.counts = a.counts("recvcounts", recvcounts, x.c.Size())
		x.displs = a.counts("displs", displs, x.c.Size())
		x.recv = a.buf("recvbuf", recvbuf, a.extent("recvcounts/displs", x.counts, x.displs, x.dt))
		if a.ok() && uint64(sendcount) != uint64(x.counts[x.root]) {
			a.failf(resInvalidArgument, "sendcount %d differs from recvcounts[%d] = %d", uint64(sendcount), x.root, x.counts[x.root])
		}
		inPlace = same(sendbuf, recvbuf)
	}
	if !inPlace {
		x.send = a.buf("sendbuf", sendbuf, a.bytes("sendcount", sendcount, 1, x.dt))
	}
	return x
}

//export nxgo_gatherv
func nxgo_gatherv(sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_gatherv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepGatherv(&a, sendbuf, sendcount, recvbuf, recvcounts, displs, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Gatherv(bg, x.send, x.recv, x.counts, x.displs, x.dt, x.root) })
}

//export nxgo_igatherv
func nxgo_igatherv(sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt, root C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_igatherv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepGatherv(&a, sendbuf, sendcount, recvbuf, recvcounts, displs, dt, root, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IGatherv(x.send, x.recv, x.counts, x.displs, x.dt, x.root)})
	return resSuccess
}

func prepScatterv(a *args, sendbuf unsafe.Pointer, sendcounts, displs *C.size_t, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t) vArgs {
	var x vArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	x.root = a.rank("root", root, x.c.Size(), false)
	inPlace := false
	if x.c.Rank() == x.root {
		x.counts = a.counts("sendcounts", sendcounts, x.c.Size())
		x.displs = a.counts("displs", displs, x.c.Size())
		x.send = a.buf("sendbuf", sendbuf, a.extent("sendcounts/displs", x.counts, x.displs, x.dt))
		if a.ok() && uint64(recvcount) != uint64(x.counts[x.root]) {
			a.failf(resInvalidArgument, "recvcount %d differs from sendcounts[%d] = %d", uint64(recvcount), x.root, x.counts[x.root])
		}
		inPlace = same(sendbuf, recvbuf)
	}
	if !inPlace {
		x.recv = a.buf("recvbuf", recvbuf, a.bytes("recvcount", recvcount, 1, x.dt))
	}
	return x
}

//export nxgo_scatterv
func nxgo_scatterv(sendbuf unsafe.Pointer, sendcounts, displs *C.size_t, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_scatterv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepScatterv(&a, sendbuf, sendcounts, displs, recvbuf, recvcount, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Scatterv(bg, x.send, x.counts, x.displs, x.recv, x.dt, x.root) })
}

//export nxgo_iscatterv
func nxgo_iscatterv(sendbuf unsafe.Pointer, sendcounts, displs *C.size_t, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iscatterv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepScatterv(&a, sendbuf, sendcounts, displs, recvbuf, recvcount, dt, root, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IScatterv(x.send, x.counts, x.displs, x.recv, x.dt, x.root)})
	return resSuccess
}

func prepAlltoallv(a *args, sendbuf unsafe.Pointer, sendcounts, sdispls *C.size_t, recvbuf unsafe.Pointer, recvcounts, rdispls *C.size_t, dt C.int, comm C.uintptr_t) vArgs {
	var x vArgs
	x.c = a.comm(comm)
	x.dt = a.dtype(dt)
	if !a.ok() {
		return x
	}
	x.counts = a.counts("sendcounts", sendcounts, x.c.Size())
	x.displs = a.counts("sdispls", sdispls, x.c.Size())
	x.rcounts = a.counts("recvcounts", recvcounts, x.c.Size())
	x.rdispls = a.counts("rdispls", rdispls, x.c.Size())
	x.send = a.buf("sendbuf", sendbuf, a.extent("sendcounts/sdispls", x.counts, x.displs, x.dt))
	x.recv = a.buf("recvbuf", recvbuf, a.extent("recvcounts/rdispls", x.rcounts, x.rdispls, x.dt))
	if a.ok() && same(sendbuf, recvbuf) && len(x.recv) > 0 {
		a.failf(resInvalidArgument, "sendbuf == recvbuf: alltoallv has no in-place form")
	}
	return x
}

//export nxgo_alltoallv
func nxgo_alltoallv(sendbuf unsafe.Pointer, sendcounts, sdispls *C.size_t, recvbuf unsafe.Pointer, recvcounts, rdispls *C.size_t, dt C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_alltoallv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	x := prepAlltoallv(&a, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Alltoallv(bg, x.send, x.counts, x.displs, x.recv, x.rcounts, x.rdispls, x.dt) })
}

//export nxgo_ialltoallv
func nxgo_ialltoallv(sendbuf unsafe.Pointer, sendcounts, sdispls *C.size_t, recvbuf unsafe.Pointer, recvcounts, rdispls *C.size_t, dt C.int, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_ialltoallv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepAlltoallv(&a, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IAlltoallv(x.send, x.counts, x.displs, x.recv, x.rcounts, x.rdispls, x.dt)})
	return resSuccess
}

//export nxgo_barrier
func nxgo_barrier(comm C.uintptr_t) (r C.int) {
	const fn = "nexar_barrier"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Barrier(bg))
}

//export nxgo_ibarrier
func nxgo_ibarrier(comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_ibarrier"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: c.IBarrier()})
	return resSuccess
}
