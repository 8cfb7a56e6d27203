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
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.Allreduce(bg, x.send, x.recv, x.dt, x.op))
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
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, root, true, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.Reduce(bg, x.send, x.recv, x.dt, x.op, x.root))
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
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.Scan(bg, x.send, x.recv, x.dt, x.op))
}

//export nxgo_exscan
func nxgo_exscan(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_exscan"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.Exscan(bg, x.send, x.recv, x.dt, x.op))
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
	c, b, t, rt := prepBroadcast(&a, buf, count, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Broadcast(bg, b, t, rt))
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
	x := prepGatherLike(&a, sendbuf, recvbuf, sendcount, dt, comm, false)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.Allgather(bg, x.send, x.recv, x.dt))
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
	x := prepGatherLike(&a, sendbuf, recvbuf, count, dt, comm, true)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.Alltoall(bg, x.send, x.recv, x.dt))
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
		b := a.buf("recvbuf", recvbuf, ns)
		if !a.ok() {
			return x
		}
		x.send = append([]byte{}, b...)
		x.recv = b[:nr:nr]
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
	x := prepReduceScatter(&a, sendbuf, recvbuf, recvcount, dt, op, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.ReduceScatter(bg, x.send, x.recv, x.dt, x.op))
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
	*req = newRequest(&request{r: x.c.IReduceScatter(x.send, x.recv, x.dt, x.op)})
	return resSuccess
}

//export nxgo_gather
func nxgo_gather(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_gather"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	if !a.ok() {
		return a.fail()
	}
	rt := a.rank("root", root, c.Size(), false)
	ns := a.bytes("sendcount", sendcount, 1, t)
	var send, recv []byte
	if c.Rank() == rt {
		recv = a.buf("recvbuf", recvbuf, a.bytes("sendcount", sendcount, c.Size(), t))
		if !same(sendbuf, recvbuf) {
			send = a.buf("sendbuf", sendbuf, ns)
		}
	} else {
		send = a.buf("sendbuf", sendbuf, ns)
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Gather(bg, send, recv, t, rt))
}

//export nxgo_scatter
func nxgo_scatter(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_scatter"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	if !a.ok() {
		return a.fail()
	}
	rt := a.rank("root", root, c.Size(), false)
	nr := a.bytes("recvcount", recvcount, 1, t)
	var send, recv []byte
	if c.Rank() == rt {
		send = a.buf("sendbuf", sendbuf, a.bytes("recvcount", recvcount, c.Size(), t))
		if !same(sendbuf, recvbuf) {
			recv = a.buf("recvbuf", recvbuf, nr)
		}
	} else {
		recv = a.buf("recvbuf", recvbuf, nr)
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Scatter(bg, send, recv, t, rt))
}

//export nxgo_allgatherv
func nxgo_allgatherv(sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_allgatherv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	if !a.ok() {
		return a.fail()
	}
	counts := a.counts("recvcounts", recvcounts, c.Size())
	disp := a.counts("displs", displs, c.Size())
	recv := a.buf("recvbuf", recvbuf, a.extent("recvcounts/displs", counts, disp, t))
	var send []byte
	if a.ok() && uint64(sendcount) != uint64(counts[c.Rank()]) {
		a.failf(resInvalidArgument, "sendcount %d differs from recvcounts[%d] = %d", uint64(sendcount), c.Rank(), counts[c.Rank()])
	}
	if !same(sendbuf, recvbuf) {
		send = a.buf("sendbuf", sendbuf, a.bytes("sendcount", sendcount, 1, t))
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Allgatherv(bg, send, recv, counts, disp, t))
}

//export nxgo_gatherv
func nxgo_gatherv(sendbuf unsafe.Pointer, sendcount C.size_t, recvbuf unsafe.Pointer, recvcounts, displs *C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_gatherv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	if !a.ok() {
		return a.fail()
	}
	rt := a.rank("root", root, c.Size(), false)
	var send, recv []byte
	var counts, disp []int
	inPlace := false
	if c.Rank() == rt {
		counts = a.counts("recvcounts", recvcounts, c.Size())
		disp = a.counts("displs", displs, c.Size())
		recv = a.buf("recvbuf", recvbuf, a.extent("recvcounts/displs", counts, disp, t))
		if a.ok() && uint64(sendcount) != uint64(counts[rt]) {
			a.failf(resInvalidArgument, "sendcount %d differs from recvcounts[%d] = %d", uint64(sendcount), rt, counts[rt])
		}
		inPlace = same(sendbuf, recvbuf)
	}
	if !inPlace {
		send = a.buf("sendbuf", sendbuf, a.bytes("sendcount", sendcount, 1, t))
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Gatherv(bg, send, recv, counts, disp, t, rt))
}

//export nxgo_scatterv
func nxgo_scatterv(sendbuf unsafe.Pointer, sendcounts, displs *C.size_t, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_scatterv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	if !a.ok() {
		return a.fail()
	}
	rt := a.rank("root", root, c.Size(), false)
	var send, recv []byte
	var counts, disp []int
	inPlace := false
	if c.Rank() == rt {
		counts = a.counts("sendcounts", sendcounts, c.Size())
		disp = a.counts("displs", displs, c.Size())
		send = a.buf("sendbuf", sendbuf, a.extent("sendcounts/displs", counts, disp, t))
		if a.ok() && uint64(recvcount) != uint64(counts[rt]) {
			a.failf(resInvalidArgument, "recvcount %d differs from sendcounts[%d] = %d", uint64(recvcount), rt, counts[rt])
		}
		inPlace = same(sendbuf, recvbuf)
	}
	if !inPlace {
		recv = a.buf("recvbuf", recvbuf, a.bytes("recvcount", recvcount, 1, t))
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Scatterv(bg, send, counts, disp, recv, t, rt))
}

//export nxgo_alltoallv
func nxgo_alltoallv(sendbuf unsafe.Pointer, sendcounts, sdispls *C.size_t, recvbuf unsafe.Pointer, recvcounts, rdispls *C.size_t, dt C.int, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_alltoallv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	if !a.ok() {
		return a.fail()
	}
	sc := a.counts("sendcounts", sendcounts, c.Size())
	sd := a.counts("sdispls", sdispls, c.Size())
	rc := a.counts("recvcounts", recvcounts, c.Size())
	rd := a.counts("rdispls", rdispls, c.Size())
	send := a.buf("sendbuf", sendbuf, a.extent("sendcounts/sdispls", sc, sd, t))
	recv := a.buf("recvbuf", recvbuf, a.extent("recvcounts/rdispls", rc, rd, t))
	if a.ok() && same(sendbuf, recvbuf) && len(recv) > 0 {
		a.failf(resInvalidArgument, "sendbuf == recvbuf: alltoallv has no in-place form")
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.Alltoallv(bg, send, sc, sd, recv, rc, rd, t))
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
