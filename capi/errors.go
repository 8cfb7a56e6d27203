package main

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/internal/abi"
)

// nexar_result_t values; internal/abi is their one source.
const (
	resSuccess         C.int = abi.Success
	resInvalidArgument C.int = abi.ErrInvalidArgument
	resInvalidHandle   C.int = abi.ErrInvalidHandle
	resUnavailable     C.int = abi.ErrUnavailable
	resInternal        C.int = abi.ErrInternal
	resTruncated       C.int = abi.ErrTruncated
)

// resultOf maps err to a nexar_result_t: core.Code values are nexar_result_t
// values (both come from internal/abi); errors that are not a *core.Error
// are internal.
func resultOf(err error) C.int {
	return C.int(core.CodeOf(err))
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
