package main

/*
#include "capi.h"
*/
import "C"

import "unsafe"

// The _stream variants: the blocking call's arguments and a cudaStream_t
// (opaque). The call is ordered after the work enqueued on stream so far;
// device buffers' results are copied back on the library's stream and the
// caller's stream waits for them (the call returns once the host part is
// done, without waiting for those copies). See hw/cuda/stage. A send or
// receive whose device buffer goes straight to the NIC (p2p.go, GPUDirect
// RDMA) leaves nothing on the stream: the host waits for the stream to
// reach the call, and the call returns once the transfer is over.

//export nxgo_allreduce_stream
func nxgo_allreduce_stream(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_allreduce_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	if r, ok := hierAllreduce(&a, sendbuf, recvbuf, count, dt, op, comm); ok {
		return r
	}
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, 0, false, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Allreduce(bg, x.send, x.recv, x.dt, x.op) })
}

//export nxgo_broadcast_stream
func nxgo_broadcast_stream(buf unsafe.Pointer, count C.size_t, dt, root C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_broadcast_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	if r, ok := hierBroadcast(&a, buf, count, dt, root, comm); ok {
		return r
	}
	c, b, t, rt := prepBroadcast(&a, buf, count, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return c.Broadcast(bg, b, t, rt) })
}

//export nxgo_allgather_stream
func nxgo_allgather_stream(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_allgather_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	if r, ok := hierAllgather(&a, sendbuf, recvbuf, sendcount, dt, comm); ok {
		return r
	}
	x := prepGatherLike(&a, sendbuf, recvbuf, sendcount, dt, comm, false)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Allgather(bg, x.send, x.recv, x.dt) })
}

//export nxgo_reduce_scatter_stream
func nxgo_reduce_scatter_stream(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, op C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_reduce_scatter_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	if r, ok := hierReduceScatter(&a, sendbuf, recvbuf, recvcount, dt, op, comm); ok {
		return r
	}
	x := prepReduceScatter(&a, sendbuf, recvbuf, recvcount, dt, op, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { x.aside(); return x.c.ReduceScatter(bg, x.send, x.recv, x.dt, x.op) })
}

//export nxgo_send_stream
func nxgo_send_stream(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_send_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	return send(&a, buf, count, dt, peer, tag, comm)
}

//export nxgo_recv_stream
func nxgo_recv_stream(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_recv_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	return recv(&a, buf, count, dt, peer, tag, comm, nil)
}

// The collectives below have no hierarchical or GPUDirect path: their
// device buffers are always staged.

//export nxgo_reduce_stream
func nxgo_reduce_stream(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, root C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_reduce_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	x := prepElementwise(&a, sendbuf, recvbuf, count, dt, op, root, true, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Reduce(bg, x.send, x.recv, x.dt, x.op, x.root) })
}

//export nxgo_alltoall_stream
func nxgo_alltoall_stream(sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_alltoall_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	x := prepGatherLike(&a, sendbuf, recvbuf, count, dt, comm, true)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Alltoall(bg, x.send, x.recv, x.dt) })
}

//export nxgo_alltoallv_stream
func nxgo_alltoallv_stream(sendbuf unsafe.Pointer, sendcounts, sdispls *C.size_t, recvbuf unsafe.Pointer, recvcounts, rdispls *C.size_t, dt C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_alltoallv_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	x := prepAlltoallv(&a, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Alltoallv(bg, x.send, x.counts, x.displs, x.recv, x.rcounts, x.rdispls, x.dt) })
}

//export nxgo_gather_stream
func nxgo_gather_stream(sendbuf, recvbuf unsafe.Pointer, sendcount C.size_t, dt, root C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_gather_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	x := prepGather(&a, sendbuf, recvbuf, sendcount, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Gather(bg, x.send, x.recv, x.dt, x.root) })
}

//export nxgo_scatter_stream
func nxgo_scatter_stream(sendbuf, recvbuf unsafe.Pointer, recvcount C.size_t, dt, root C.int, comm C.uintptr_t, stream unsafe.Pointer) (r C.int) {
	const fn = "nexar_scatter_stream"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(true, stream)
	x := prepScatter(&a, sendbuf, recvbuf, recvcount, dt, root, comm)
	if !a.ok() {
		return a.fail()
	}
	return a.callWithBuffers(func() error { return x.c.Scatter(bg, x.send, x.recv, x.dt, x.root) })
}
