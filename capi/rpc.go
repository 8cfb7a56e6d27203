package main

/*
#include <stdlib.h>
#include <string.h>

#include "capi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/internal/abi"
	"github.com/nexar-go/nexar/transport"
)

//export nxgo_rpc_register
func nxgo_rpc_register(comm C.uintptr_t, id C.uint32_t, handler C.uintptr_t, user unsafe.Pointer) (r C.int) {
	const fn = "nexar_rpc_register"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if !a.ok() {
		return a.fail()
	}
	if handler == 0 {
		c.Register(uint32(id), nil)
		return resSuccess
	}
	c.Register(uint32(id), cHandler(comm, handler, user, uint32(id)))
	return resSuccess
}

// cHandler adapts a nexar_rpc_handler_t: the request is passed as it is (C
// must not keep it), the reply copied out of C memory and freed.
func cHandler(comm, handler C.uintptr_t, user unsafe.Pointer, id uint32) core.RPCHandler {
	return func(_ context.Context, from int, req []byte) ([]byte, error) {
		var reply unsafe.Pointer
		var n C.size_t
		var p unsafe.Pointer
		if len(req) > 0 {
			p = unsafe.Pointer(&req[0])
		}
		rc := C.nxcapi_call_rpc(handler, comm, C.int(from), C.uint32_t(id), p, C.size_t(len(req)), &reply, &n, user)
		defer C.free(reply)
		if rc != resSuccess {
			msg := fmt.Sprintf("handler returned %s", core.Code(rc))
			if reply != nil {
				msg = C.GoStringN((*C.char)(reply), C.int(C.strnlen((*C.char)(reply), 4096)))
			}
			code := core.Code(rc)
			if rc < 0 || rc >= abi.NumResults {
				code = core.CodeInternal
			}
			return nil, &core.Error{Code: code, Op: "rpc", Rank: -1, Msg: msg}
		}
		if n > 0 && reply == nil {
			return nil, &core.Error{Code: core.CodeInternal, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("handler returned a NULL reply of %d bytes", uint64(n))}
		}
		if uint64(n) > transport.MaxPayload {
			return nil, &core.Error{Code: core.CodeInvalidArgument, Op: "rpc", Rank: -1, Msg: fmt.Sprintf("handler's reply of %d bytes exceeds %d", uint64(n), transport.MaxPayload)}
		}
		return C.GoBytes(reply, C.int(n)), nil
	}
}

//export nxgo_rpc_call
func nxgo_rpc_call(comm C.uintptr_t, peer C.int, id C.uint32_t, req unsafe.Pointer, reqLen C.size_t, reply *unsafe.Pointer, replyLen *C.size_t) (r C.int) {
	const fn = "nexar_rpc_call"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("reply", unsafe.Pointer(reply))
	a.out("reply_len", unsafe.Pointer(replyLen))
	if uint64(reqLen) > transport.MaxPayload {
		a.failf(resInvalidArgument, "req_len %d exceeds %d", uint64(reqLen), transport.MaxPayload)
	}
	b := a.buf("req", req, int(reqLen))
	if !a.ok() {
		return a.fail()
	}
	*reply, *replyLen = nil, 0
	got, err := c.CallRPC(bg, int(peer), uint32(id), b)
	if err != nil {
		return result(fn, err)
	}
	if len(got) > 0 {
		m := C.malloc(C.size_t(len(got)))
		if m == nil {
			return fail(fn, resInternal, "cannot allocate the %d-byte reply", len(got))
		}
		copy(unsafe.Slice((*byte)(m), len(got)), got)
		*reply, *replyLen = m, C.size_t(len(got))
	}
	return resSuccess
}
