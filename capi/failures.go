package main

/*
#include <stdlib.h>

#include "capi.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

// watcher delivers a communicator's failure events (core.Comm.Failures) to
// its C handler, from a goroutine of its own started at the first
// registration. It is safe for concurrent use.
type watcher struct {
	mu      sync.Mutex // guards fn, user, stopped
	fn      C.uintptr_t
	user    unsafe.Pointer
	stopped bool
	calling sync.Mutex // held during a call of the handler
}

// watchers maps a comm handle to its watcher, if a handler was ever set.
var watchers watcherTable

// watcherTable maps comm handles (issued by comms) to watchers. It is safe
// for concurrent use.
type watcherTable struct {
	mu sync.Mutex
	m  map[uintptr]*watcher
}

func (t *watcherTable) getOrStart(h uintptr, c *core.Comm) *watcher {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w, ok := t.m[h]; ok {
		return w
	}
	if t.m == nil {
		t.m = make(map[uintptr]*watcher)
	}
	w := &watcher{}
	t.m[h] = w
	go w.run(h, c)
	return w
}

func (t *watcherTable) remove(h uintptr) *watcher {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.m[h]
	delete(t.m, h)
	return w
}

func (w *watcher) run(h uintptr, c *core.Comm) {
	for ev := range c.Failures() { // closed by Close (nexar_comm_destroy)
		w.calling.Lock()
		w.mu.Lock()
		fn, user, stopped := w.fn, w.user, w.stopped
		w.mu.Unlock()
		if fn != 0 && !stopped {
			w.call(fn, h, ev, user)
		}
		w.calling.Unlock()
	}
}

func (w *watcher) call(fn C.uintptr_t, h uintptr, ev core.FailureEvent, user unsafe.Pointer) {
	defer func() { _ = recover() }() // a Go panic must not kill the process; C faults cannot be caught
	msg := C.CString(ev.Err.Error())
	defer C.free(unsafe.Pointer(msg))
	C.nxcapi_call_failure(fn, C.uintptr_t(h), C.int(ev.Rank), C.int(ev.Err.Code), msg, user)
}

// stop makes w (the watcher of comm handle h) call nothing more and waits
// for a call in progress, unless the caller is that call
// (nexar_comm_destroy(h) from h's own handler).
func (w *watcher) stop(h uintptr) {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	if C.nxcapi_in_failure_handler(C.uintptr_t(h)) == 0 {
		w.calling.Lock() // waits for the call in progress, if any
		w.calling.Unlock()
	}
}

//export nxgo_comm_get_failed
func nxgo_comm_get_failed(comm C.uintptr_t, ranks *C.int, capacity C.size_t, count *C.size_t) (r C.int) {
	const fn = "nexar_comm_get_failed"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.baseComm(comm)
	a.out("count", unsafe.Pointer(count))
	if capacity > 0 {
		a.out("ranks", unsafe.Pointer(ranks))
	}
	if !a.ok() {
		return a.fail()
	}
	failed := c.Failed()
	*count = C.size_t(len(failed))
	n := len(failed)
	if uint64(capacity) < uint64(n) {
		n = int(capacity)
	}
	if n > 0 {
		dst := unsafe.Slice(ranks, n)
		for i := range dst {
			dst[i] = C.int(failed[i])
		}
	}
	return resSuccess
}

//export nxgo_comm_set_failure_handler
func nxgo_comm_set_failure_handler(comm C.uintptr_t, handler C.uintptr_t, user unsafe.Pointer) (r C.int) {
	const fn = "nexar_comm_set_failure_handler"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.baseComm(comm)
	if !a.ok() {
		return a.fail()
	}
	w := watchers.getOrStart(uintptr(comm), c)
	w.mu.Lock()
	w.fn, w.user = handler, user
	w.mu.Unlock()
	return resSuccess
}
