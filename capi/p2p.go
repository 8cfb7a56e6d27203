package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

//export nxgo_send
func nxgo_send(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_send"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	return send(&a, buf, count, dt, peer, tag, comm)
}

func send(a *args, buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t) C.int {
	c := a.comm(comm)
	t := a.dtype(dt)
	n := a.bytes("count", count, 1, t)
	if !a.ok() {
		return a.fail()
	}
	p := a.rank("peer", peer, c.Size(), false)
	b := a.p2pBuf("buf", buf, n, true, false, func() bool { return c.DevicePath(p, true) })
	if !a.ok() {
		return a.fail()
	}
	if a.dev.Direct() {
		return a.callWithBuffers(func() error { return c.SendDevice(bg, b, p, uint64(tag)) })
	}
	return a.callWithBuffers(func() error { return c.Send(bg, b, p, uint64(tag)) })
}

//export nxgo_recv
func nxgo_recv(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t) (r C.int) {
	const fn = "nexar_recv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	return recv(&a, buf, count, dt, peer, tag, comm, nil)
}

//export nxgo_recv_status
func nxgo_recv_status(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t, status unsafe.Pointer) (r C.int) {
	const fn = "nexar_recv_status"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.allowDevice(false, nil)
	return recv(&a, buf, count, dt, peer, tag, comm, status)
}

func recv(a *args, buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t, status unsafe.Pointer) C.int {
	c := a.comm(comm)
	t := a.dtype(dt)
	n := a.bytes("count", count, 1, t)
	if !a.ok() {
		return a.fail()
	}
	p := a.rank("peer", peer, c.Size(), true)
	// Read as well as written when staged: a shorter message leaves the
	// tail as it was.
	b := a.p2pBuf("buf", buf, n, true, true, func() bool { return c.DevicePath(p, false) })
	if !a.ok() {
		return a.fail()
	}
	recv := c.Recv
	if a.dev.Direct() {
		recv = c.RecvDevice
	}
	var st core.Status
	if r := a.callWithBuffers(func() (err error) { st, err = recv(bg, b, p, uint64(tag)); return err }); r != resSuccess {
		return r
	}
	writeStatus(status, st, t.Size())
	return resSuccess
}

//export nxgo_isend
func nxgo_isend(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_isend"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	n := a.bytes("count", count, 1, t)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	p := a.rank("peer", peer, c.Size(), false)
	b := a.p2pBuf("buf", buf, n, true, false, func() bool { return c.DevicePath(p, true) })
	if !a.ok() {
		return a.fail()
	}
	isend := c.ISend
	if a.dev.Direct() {
		if err := a.dev.WaitStream(); err != nil {
			return a.result(err)
		}
		isend = c.ISendDevice
	}
	*req = newRequest(&request{r: isend(b, p, uint64(tag))})
	return resSuccess
}

//export nxgo_irecv
func nxgo_irecv(buf unsafe.Pointer, count C.size_t, dt C.int, peer C.int, tag C.uint64_t, comm C.uintptr_t, req *C.uintptr_t) (r C.int) {
	const fn = "nexar_irecv"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	t := a.dtype(dt)
	n := a.bytes("count", count, 1, t)
	a.out("req", unsafe.Pointer(req))
	if !a.ok() {
		return a.fail()
	}
	p := a.rank("peer", peer, c.Size(), true)
	b := a.p2pBuf("buf", buf, n, true, true, func() bool { return c.DevicePath(p, false) })
	if !a.ok() {
		return a.fail()
	}
	irecv := c.IRecv
	if a.dev.Direct() {
		if err := a.dev.WaitStream(); err != nil {
			return a.result(err)
		}
		irecv = c.IRecvDevice
	}
	*req = newRequest(&request{r: irecv(b, p, uint64(tag)), esize: t.Size(), isRecv: true})
	return resSuccess
}
