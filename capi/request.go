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
	return result(fn, q.wait(bg))
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
	ok, err := q.test()
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
	if ok, _ := q.test(); !ok {
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

// requestsOf reads count handles from reqs: nil entries for
// NEXAR_REQUEST_NULL (skipped, as MPI_REQUEST_NULL), a failure naming the
// first handle that is not a request.
func (a *args) requestsOf(count C.size_t, reqs *C.uintptr_t) []*request {
	if !a.ok() || count == 0 {
		return nil
	}
	if reqs == nil {
		a.failf(resInvalidArgument, "reqs is NULL with count %d", uint64(count))
		return nil
	}
	if uint64(count) > 1<<24 {
		a.failf(resInvalidArgument, "count %d is too large", uint64(count))
		return nil
	}
	hs := unsafe.Slice(reqs, int(count))
	out := make([]*request, len(hs))
	for i, h := range hs {
		if h == 0 {
			continue
		}
		q, ok := requests.get(uintptr(h))
		if !ok {
			a.failf(resInvalidHandle, "reqs[%d] = %#x is not a valid request (never created, or freed)", i, uintptr(h))
			return nil
		}
		out[i] = q
	}
	return out
}

//export nxgo_waitall
func nxgo_waitall(count C.size_t, reqs *C.uintptr_t, results *C.int) (r C.int) {
	const fn = "nexar_waitall"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	qs := a.requestsOf(count, reqs)
	if !a.ok() {
		return a.fail()
	}
	var res []C.int
	if results != nil {
		res = unsafe.Slice(results, len(qs))
	}
	first, firstErr := -1, error(nil)
	for i, q := range qs {
		var err error
		if q != nil {
			err = q.wait(bg)
		}
		if res != nil {
			res[i] = resultOf(err)
			if err == nil {
				res[i] = resSuccess
			}
		}
		if err != nil && first < 0 {
			first, firstErr = i, err
		}
	}
	if first < 0 {
		return resSuccess
	}
	return fail(fn, resultOf(firstErr), "reqs[%d]: %v", first, firstErr)
}

//export nxgo_testany
func nxgo_testany(count C.size_t, reqs *C.uintptr_t, index *C.size_t, done *C.int) (r C.int) {
	const fn = "nexar_testany"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.out("index", unsafe.Pointer(index))
	a.out("done", unsafe.Pointer(done))
	qs := a.requestsOf(count, reqs)
	if !a.ok() {
		return a.fail()
	}
	live := false
	for i, q := range qs {
		if q == nil {
			continue
		}
		live = true
		if ok, err := q.test(); ok {
			*index, *done = C.size_t(i), 1
			if err != nil {
				return fail(fn, resultOf(err), "reqs[%d]: %v", i, err)
			}
			return resSuccess
		}
	}
	*index = count
	*done = 0
	if !live {
		*done = 1 // nothing to wait for: MPI_Testany's flag with MPI_UNDEFINED
	}
	return resSuccess
}
