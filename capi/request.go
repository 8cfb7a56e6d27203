package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

func newRequest(r *request) C.uintptr_t { return C.uintptr_t(requests.add(r)) }

func (a *args) request(h C.uintptr_t) *request {
	if !a.ok() {
		return nil
	}
	q, ok := requests.get(uintptr(h))
	if !ok {
		a.failf(resInvalidHandle, "req %#x is not a valid request (never created, or freed)", uintptr(h))
	}
	return q
}

//export nxgo_wait
func nxgo_wait(req C.uintptr_t) (r C.int) {
	const fn = "nexar_wait"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	q := a.request(req)
	if !a.ok() {
		return a.fail()
	}
	return result(fn, q.r.Wait(bg))
}

//export nxgo_test
func nxgo_test(req C.uintptr_t, done *C.int) (r C.int) {
	const fn = "nexar_test"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	q := a.request(req)
	a.out("done", unsafe.Pointer(done))
	if !a.ok() {
		return a.fail()
	}
	ok, err := q.r.Test()
	if !ok {
		*done = 0
		return resSuccess
	}
	*done = 1
	return result(fn, err)
}

//export nxgo_request_status
func nxgo_request_status(req C.uintptr_t, status unsafe.Pointer) (r C.int) {
	const fn = "nexar_request_status"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	q := a.request(req)
	a.out("status", status)
	if !a.ok() {
		return a.fail()
	}
	if ok, _ := q.r.Test(); !ok {
		return fail(fn, resInvalidArgument, "req %#x has not completed", uintptr(req))
	}
	if !q.isRecv {
		writeStatus(status, core.Status{}, 0)
		return resSuccess
	}
	writeStatus(status, q.r.Status(), q.esize)
	return resSuccess
}

//export nxgo_request_free
func nxgo_request_free(req C.uintptr_t) (r C.int) {
	const fn = "nexar_request_free"
	defer recoverToResult(fn, &r)
	if _, ok := requests.remove(uintptr(req)); !ok {
		return fail(fn, resInvalidHandle, "req %#x is not a valid request (never created, or already freed)", uintptr(req))
	}
	return resSuccess
}
