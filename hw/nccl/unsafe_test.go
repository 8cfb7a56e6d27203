package nccl

import (
	"errors"
	"unsafe"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func asError(err error, e **Error) bool { return errors.As(err, e) }
