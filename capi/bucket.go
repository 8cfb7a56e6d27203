package main

/*
#include "capi.h"
*/
import "C"

import (
	"strconv"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/compress"
	"github.com/nexar-go/nexar/core"
)

type multiArgs struct {
	c          *core.Comm
	send, recv [][]byte
	dt         collective.DType
	op         collective.Op
	bucket     int
}

// prepMulti serves nexar_allreduce_multi and nexar_iallreduce_multi: it
// reads the C arrays (copied here, so the caller may free them once the
// call returns) and wraps each buffer. A NULL sendbufs, or a sendbufs[i]
// that is NULL or equal to recvbufs[i], means in place.
func prepMulti(a *args, sendbufs, recvbufs unsafe.Pointer, counts *C.size_t, nbufs C.size_t, dt, op C.int, bucket C.size_t, comm C.uintptr_t) multiArgs {
	var x multiArgs
	x.c = a.comm(comm)
	x.dt, x.op = a.dtypeOp(dt, op)
	if a.ok() && uint64(nbufs) > maxBytes {
		a.failf(resInvalidArgument, "nbufs %d is too large", uint64(nbufs))
	}
	if a.ok() && uint64(bucket) > maxBytes {
		a.failf(resInvalidArgument, "bucket_bytes %d is too large", uint64(bucket))
	}
	n := int(nbufs)
	if !a.ok() || n == 0 {
		x.recv = [][]byte{}
		return x
	}
	if recvbufs == nil {
		a.failf(resInvalidArgument, "recvbufs is NULL with nbufs %d", n)
		return x
	}
	cnt := a.counts("counts", counts, n)
	if !a.ok() {
		return x
	}
	rp := unsafe.Slice((*unsafe.Pointer)(recvbufs), n)
	var sp []unsafe.Pointer
	if sendbufs != nil {
		sp = unsafe.Slice((*unsafe.Pointer)(sendbufs), n)
		x.send = make([][]byte, n)
	}
	x.recv = make([][]byte, n)
	for i := 0; i < n && a.ok(); i++ {
		nb := a.bytes("counts["+strconv.Itoa(i)+"]", C.size_t(cnt[i]), 1, x.dt)
		x.recv[i] = a.buf("recvbufs["+strconv.Itoa(i)+"]", rp[i], nb)
		if sp != nil && sp[i] != nil && !same(sp[i], rp[i]) {
			x.send[i] = a.buf("sendbufs["+strconv.Itoa(i)+"]", sp[i], nb)
		}
	}
	x.bucket = int(bucket)
	return x
}

//export nxgo_allreduce_multi
func nxgo_allreduce_multi(sendbufs, recvbufs unsafe.Pointer, counts *C.size_t, nbufs C.size_t, dt, op C.int, bucket C.size_t, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_allreduce_multi"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepMulti(&a, sendbufs, recvbufs, counts, nbufs, dt, op, bucket, comm)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, x.c.AllreduceMulti(bg, x.send, x.recv, x.dt, x.op, x.bucket))
}

//export nxgo_iallreduce_multi
func nxgo_iallreduce_multi(sendbufs, recvbufs unsafe.Pointer, counts *C.size_t, nbufs C.size_t, dt, op C.int, bucket C.size_t, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_iallreduce_multi"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	x := prepMulti(&a, sendbufs, recvbufs, counts, nbufs, dt, op, bucket, comm)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	*req = newRequest(&request{r: x.c.IAllreduceMulti(x.send, x.recv, x.dt, x.op, x.bucket)})
	return resSuccess
}

//export nxgo_allreduce_compressed
func nxgo_allreduce_compressed(buf, residual unsafe.Pointer, count C.size_t, dt, method C.int, ratio C.double, seed C.uint64_t, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_allreduce_compressed"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	n := a.bytes("count", count, 1, t)
	if a.ok() && (method < 0 || method > 255) {
		a.failf(resInvalidArgument, "method %d is not a nexar_compress_t", int(method))
	}
	b := a.buf("buf", buf, n)
	var res []byte
	if residual != nil {
		res = a.buf("residual", residual, n)
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.AllreduceCompressed(bg, b, res, t, compress.Method(method), float64(ratio), uint64(seed)))
}
