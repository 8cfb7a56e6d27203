package main

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

// nexar_result_t values (include/nexar.h); append, never renumber.
const (
	resSuccess         C.int = 0
	resInvalidArgument C.int = 1
	resInvalidHandle   C.int = 2
	resMismatch        C.int = 3
	resPeerDown        C.int = 4
	resTimeout         C.int = 5
	resAborted         C.int = 6
	resClosed          C.int = 7
	resAuth            C.int = 8
	resTruncated       C.int = 9
	resUnavailable     C.int = 10
	resInternal        C.int = 11
	resForked          C.int = 12 // returned only by the C guard in entry.c
)

// codeResults is the one table from core.Code to nexar_result_t.
var codeResults = map[core.Code]C.int{
	core.CodeOK:              resSuccess,
	core.CodeInvalidArgument: resInvalidArgument,
	core.CodeMismatch:        resMismatch,
	core.CodePeerDown:        resPeerDown,
	core.CodeTimeout:         resTimeout,
	core.CodeAborted:         resAborted,
	core.CodeClosed:          resClosed,
	core.CodeAuth:            resAuth,
	core.CodeInternal:        resInternal,
	core.CodeTruncated:       resTruncated,
}

// resultOf maps err to a nexar_result_t; errors that are not a *core.Error
// (or whose code is unknown here) are internal.
func resultOf(err error) C.int {
	if r, ok := codeResults[core.CodeOf(err)]; ok {
		return r
	}
	return resInternal
}

// setLastError stores "fn: msg" as the calling thread's last error.
func setLastError(fn, msg string) {
	s := fn + ": " + msg
	C.nxcapi_set_last_error((*C.char)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s)))
}

// fail sets the last error and returns code.
func fail(fn string, code C.int, format string, args ...any) C.int {
	setLastError(fn, fmt.Sprintf(format, args...))
	return code
}

// result returns the nexar_result_t of err, setting the last error if it
// is not nil.
func result(fn string, err error) C.int {
	if err == nil {
		return resSuccess
	}
	setLastError(fn, err.Error())
	return resultOf(err)
}
