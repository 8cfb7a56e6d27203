package main

/*
#include <stdlib.h>
#include <string.h>

#include "capi.h"
#include "nexar.h"

typedef void* (*nxcapi_rpc_alloc_fn)(size_t len, void* user);

// nxcapi_call_lent calls the nexar_rpc_lent_handler_t fn, and
// nxcapi_release the release function of its reply.
static inline int nxcapi_call_lent(uintptr_t fn, uintptr_t comm, int from, uint32_t id, const void* req,
		size_t req_len, nexar_rpc_reply_t* reply, void* user) {
	memset(reply, 0, sizeof *reply);
	return (int)((nexar_rpc_lent_handler_t)fn)((nexar_comm_t)comm, from, id, req, req_len, reply, user);
}

static inline void nxcapi_release(nexar_rpc_reply_t* reply) {
	if (reply->release != NULL) {
		reply->release(reply->owner);
	}
}

// nxcapi_rpc_alloc calls the nexar_rpc_alloc_t fn (Go cannot call a C
// function pointer itself).
static inline void* nxcapi_rpc_alloc(uintptr_t fn, size_t len, void* user) {
	return ((nxcapi_rpc_alloc_fn)fn)(len, user);
}
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/internal/abi"
	"github.com/nexar-go/nexar/transport"
)

//export nxgo_rpc_register
func nxgo_rpc_register(comm C.uintptr_t, id C.uint32_t, handler C.uintptr_t, user unsafe.Pointer) (r C.int) {
	const fn = "nexar_rpc_register"
	defer recoverToResult(fn, &r)
	return register(fn, comm, id, handler, user, cHandler)
}

//export nxgo_rpc_register_lent
func nxgo_rpc_register_lent(comm C.uintptr_t, id C.uint32_t, handler C.uintptr_t, user unsafe.Pointer) (r C.int) {
	const fn = "nexar_rpc_register_lent"
	defer recoverToResult(fn, &r)
	return register(fn, comm, id, handler, user, cLentHandler)
}

// register installs adapt's wrapper of a C handler for id (both kinds run
// as lent handlers in core), or removes id's handler when handler is 0.
func register(fn string, comm C.uintptr_t, id C.uint32_t, handler C.uintptr_t, user unsafe.Pointer,
	adapt func(C.uintptr_t, C.uintptr_t, unsafe.Pointer, uint32) core.RPCLentHandler) C.int {
	a := args{fn: fn}
	c := a.comm(comm)
	if !a.ok() {
		return a.fail()
	}
	if handler == 0 {
		c.RegisterLent(uint32(id), nil)
		return resSuccess
	}
	c.RegisterLent(uint32(id), adapt(comm, handler, user, uint32(id)))
	return resSuccess
}

// cLentHandler adapts a nexar_rpc_lent_handler_t: the request is passed
// as it is, the reply sent from the handler's memory and released once
// sent. The reply descriptor lives in C memory (cgo may not keep a Go
// pointer to it across the call's end).
func cLentHandler(comm, handler C.uintptr_t, user unsafe.Pointer, id uint32) core.RPCLentHandler {
	return func(_ context.Context, from int, req []byte) ([]byte, func(), error) {
		var p unsafe.Pointer
		if len(req) > 0 {
			p = unsafe.Pointer(&req[0])
		}
		d := (*C.nexar_rpc_reply_t)(C.malloc(C.size_t(unsafe.Sizeof(C.nexar_rpc_reply_t{}))))
		if d == nil {
			return nil, nil, &core.Error{Code: core.CodeInternal, Op: "rpc", Rank: -1, Msg: "cannot allocate a reply descriptor"}
		}
		rc := C.nxcapi_call_lent(handler, comm, C.int(from), C.uint32_t(id), p, C.size_t(len(req)), d, user)
		release := func() {
			C.nxcapi_release(d)
			C.free(unsafe.Pointer(d))
		}
		data, n := d.data, uint64(d.len)
		if rc != resSuccess {
			defer release()
			msg := fmt.Sprintf("handler returned %s", core.Code(rc))
			if data != nil {
				msg = C.GoStringN((*C.char)(data), C.int(C.strnlen((*C.char)(data), 4096)))
			}
			code := core.Code(rc)
			if rc < 0 || rc >= abi.NumResults {
				code = core.CodeInternal
			}
			return nil, nil, &core.Error{Code: code, Op: "rpc", Rank: -1, Msg: msg}
		}
		if n > 0 && data == nil {
			release()
			return nil, nil, &core.Error{Code: core.CodeInternal, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("handler returned a NULL reply of %d bytes", n)}
		}
		if n > transport.MaxPayload {
			release()
			return nil, nil, &core.Error{Code: core.CodeInvalidArgument, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("handler's reply of %d bytes exceeds %d", n, transport.MaxPayload)}
		}
		if n == 0 {
			release()
			return nil, nil, nil
		}
		return unsafe.Slice((*byte)(data), int(n)), release, nil
	}
}

// cHandler adapts a nexar_rpc_handler_t: the request is passed as it is (C
// must not keep it: core reuses its buffer), the reply sent straight from
// the C memory the handler made and freed once sent.
func cHandler(comm, handler C.uintptr_t, user unsafe.Pointer, id uint32) core.RPCLentHandler {
	return func(_ context.Context, from int, req []byte) ([]byte, func(), error) {
		var reply unsafe.Pointer
		var n C.size_t
		var p unsafe.Pointer
		if len(req) > 0 {
			p = unsafe.Pointer(&req[0])
		}
		rc := C.nxcapi_call_rpc(handler, comm, C.int(from), C.uint32_t(id), p, C.size_t(len(req)), &reply, &n, user)
		release := func() { C.free(reply) }
		if rc != resSuccess {
			defer release()
			msg := fmt.Sprintf("handler returned %s", core.Code(rc))
			if reply != nil {
				msg = C.GoStringN((*C.char)(reply), C.int(C.strnlen((*C.char)(reply), 4096)))
			}
			code := core.Code(rc)
			if rc < 0 || rc >= abi.NumResults {
				code = core.CodeInternal
			}
			return nil, nil, &core.Error{Code: code, Op: "rpc", Rank: -1, Msg: msg}
		}
		if n > 0 && reply == nil {
			return nil, nil, &core.Error{Code: core.CodeInternal, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("handler returned a NULL reply of %d bytes", uint64(n))}
		}
		if uint64(n) > transport.MaxPayload {
			release()
			return nil, nil, &core.Error{Code: core.CodeInvalidArgument, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("handler's reply of %d bytes exceeds %d", uint64(n), transport.MaxPayload)}
		}
		if n == 0 {
			release()
			return nil, nil, nil
		}
		return unsafe.Slice((*byte)(reply), int(n)), release, nil
	}
}

//export nxgo_rpc_call
func nxgo_rpc_call(comm C.uintptr_t, peer C.int, id C.uint32_t, req unsafe.Pointer, reqLen C.size_t, timed C.int, timeoutMS C.int64_t, reply *unsafe.Pointer, replyLen *C.size_t) (r C.int) {
	fn := "nexar_rpc_call"
	if timed != 0 {
		fn = "nexar_rpc_call_timeout"
	}
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("reply", unsafe.Pointer(reply))
	a.out("reply_len", unsafe.Pointer(replyLen))
	b := a.rpcRequest(req, reqLen, timeoutMS)
	if !a.ok() {
		return a.fail()
	}
	*reply, *replyLen = nil, 0
	ctx, cancel := rpcDeadline(timeoutMS)
	defer cancel()
	err := c.CallRPCInto(ctx, int(peer), uint32(id), b, func(got []byte) error { return copyReply(got, reply, replyLen) })
	if err != nil {
		return result(fn, err)
	}
	return resSuccess
}

//export nxgo_rpc_call_into
func nxgo_rpc_call_into(comm C.uintptr_t, peer C.int, id C.uint32_t, req unsafe.Pointer, reqLen C.size_t, timeoutMS C.int64_t, alloc C.uintptr_t, user unsafe.Pointer, replyLen *C.size_t) (r C.int) {
	const fn = "nexar_rpc_call_into"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if alloc == 0 {
		a.failf(resInvalidArgument, "alloc is NULL")
	}
	a.out("reply_len", unsafe.Pointer(replyLen))
	b := a.rpcRequest(req, reqLen, timeoutMS)
	if !a.ok() {
		return a.fail()
	}
	*replyLen = 0
	ctx, cancel := rpcDeadline(timeoutMS)
	defer cancel()
	err := c.CallRPCInto(ctx, int(peer), uint32(id), b, func(got []byte) error {
		*replyLen = C.size_t(len(got))
		if len(got) == 0 {
			return nil
		}
		m := C.nxcapi_rpc_alloc(alloc, C.size_t(len(got)), user)
		if m == nil {
			return &core.Error{Code: core.CodeTruncated, Op: "rpc", Rank: int(peer),
				Msg: fmt.Sprintf("alloc gave no buffer for the %d-byte reply of rank %d, function %d", len(got), int(peer), uint32(id))}
		}
		copy(unsafe.Slice((*byte)(m), len(got)), got)
		return nil
	})
	if err != nil {
		return result(fn, err)
	}
	return resSuccess
}

// rpcRequest checks a call's request and deadline arguments and returns
// the request (C memory, not copied).
func (a *args) rpcRequest(req unsafe.Pointer, reqLen C.size_t, timeoutMS C.int64_t) []byte {
	if uint64(reqLen) > transport.MaxPayload {
		a.failf(resInvalidArgument, "req_len %d exceeds %d", uint64(reqLen), transport.MaxPayload)
	}
	if timeoutMS < 0 {
		a.failf(resInvalidArgument, "timeout_ms %d is negative", int64(timeoutMS))
	}
	return a.buf("req", req, int(reqLen))
}

// rpcDeadline is the context of a call with timeout_ms (0: none of its
// own, the communicator's timeout applies).
func rpcDeadline(timeoutMS C.int64_t) (context.Context, context.CancelFunc) {
	if timeoutMS == 0 {
		return bg, func() {}
	}
	return context.WithTimeout(bg, time.Duration(timeoutMS)*time.Millisecond)
}

// copyReply stores a reply in C memory from malloc (NULL when empty).
func copyReply(got []byte, reply *unsafe.Pointer, replyLen *C.size_t) error {
	*reply, *replyLen = nil, 0
	if len(got) == 0 {
		return nil
	}
	m := C.malloc(C.size_t(len(got)))
	if m == nil {
		return &core.Error{Code: core.CodeInternal, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("cannot allocate the %d-byte reply", len(got))}
	}
	copy(unsafe.Slice((*byte)(m), len(got)), got)
	*reply, *replyLen = m, C.size_t(len(got))
	return nil
}

// rpcCall is the request of a nexar_rpc_icall: the reply is copied into
// the caller's out-parameters once, when a wait or test first sees the call
// done (so a request freed unseen allocates nothing). Safe for concurrent
// use.
type rpcCall struct {
	call     *core.Call
	cancel   context.CancelFunc // the deadline's
	reply    *unsafe.Pointer    // C memory, the caller's
	replyLen *C.size_t
	once     sync.Once
	err      error
}

// deliver completes the request once the call is done: the reply goes to
// the caller's out-parameters; it returns the call's result.
func (rc *rpcCall) deliver() error {
	rc.once.Do(func() {
		rc.cancel()
		_, got, err := rc.call.Test()
		if err == nil {
			err = copyReply(got, rc.reply, rc.replyLen)
			rc.call.Recycle()
		}
		rc.err = err
	})
	return rc.err
}

// wait waits for the call; a wait that times out ends the call, so every
// later wait or test returns the same error.
func (rc *rpcCall) wait(ctx context.Context) error {
	rc.call.Wait(ctx)
	return rc.deliver()
}

func (rc *rpcCall) test() (bool, error) {
	if done, _, _ := rc.call.Test(); !done {
		return false, nil
	}
	return true, rc.deliver()
}

//export nxgo_rpc_icall
func nxgo_rpc_icall(comm C.uintptr_t, peer C.int, id C.uint32_t, req unsafe.Pointer, reqLen C.size_t, timeoutMS C.int64_t, reply *unsafe.Pointer, replyLen *C.size_t, out *C.uintptr_t) (r C.int) {
	const fn = "nexar_rpc_icall"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("reply", unsafe.Pointer(reply))
	a.out("reply_len", unsafe.Pointer(replyLen))
	a.out("request", unsafe.Pointer(out))
	b := a.rpcRequest(req, reqLen, timeoutMS)
	if !a.ok() {
		return a.fail()
	}
	*reply, *replyLen = nil, 0
	ctx, cancel := rpcDeadline(timeoutMS)
	rc := &rpcCall{cancel: cancel, reply: reply, replyLen: replyLen}
	rc.call = c.ICallContext(ctx, int(peer), uint32(id), b)
	*out = newRequest(&request{call: rc})
	return resSuccess
}
