package main

/*
#include "capi.h"
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	trdma "github.com/nexar-go/nexar/transport/rdma"
)

// router holds the process's policy for CUDA device buffers (hier.Router):
// where a buffer lives (asked once per buffer), which device collectives go
// to NCCL, staging. capi only converts C values for it and maps its errors.
var router = hier.NewRouter()

// gpu is the runtime for core's device paths (Config.GPU), nil without
// one: the RDMA data path registers device memory with the NIC through it.
func gpu() trdma.GPUMemory {
	if rt := router.Runtime(); rt != nil {
		return trdma.CUDA(rt)
	}
	return nil
}

// allowDevice marks the call as one that stages device buffers; stream is
// its cudaStream_t for a _stream variant.
func (a *args) allowDevice(streamVariant bool, stream unsafe.Pointer) {
	var err error
	a.dev, err = router.Begin(true, streamVariant, cuda.Stream(uintptr(stream)))
	a.devSet = true
	a.devErr(err)
}

// call is the device side of the call: one that takes device memory only
// where a point-to-point path moves it, unless allowDevice said otherwise.
func (a *args) call() *hier.Call {
	if !a.devSet {
		a.dev, _ = router.Begin(false, false, 0)
		a.devSet = true
	}
	return &a.dev
}

// devErr records err of the device side as the call's failure.
func (a *args) devErr(err error) {
	if err == nil {
		return
	}
	var ae *hier.ArgError
	code := resUnavailable // a CUDA runtime error: the message names the call
	switch {
	case errors.As(err, &ae):
		code = resInvalidArgument
	case errors.Is(err, stage.ErrTimeout):
		code = C.int(core.CodeTimeout)
	}
	a.failf(code, "%v", err)
}

// dbuf is buf for memory that may be on a device: in and out say whether
// the call reads and writes it (what staging must copy in and back).
func (a *args) dbuf(name string, p unsafe.Pointer, n int, in, out bool) []byte {
	return a.p2pBuf(name, p, n, in, out, nil)
}

// p2pBuf is dbuf for the one buffer of a point-to-point call, which goes
// to core as it is where direct says the path moves device memory
// (hier.Call.P2PBuf).
func (a *args) p2pBuf(name string, p unsafe.Pointer, n int, in, out bool, direct func() bool) []byte {
	if !a.ok() {
		return nil
	}
	b, err := a.call().P2PBuf(name, p, n, in, out, direct)
	a.devErr(err)
	return b
}

// callWithBuffers makes the call around its device buffers (hier.Call.Run):
// staged, or given device memory as it is, per the router.
func (a *args) callWithBuffers(call func() error) C.int {
	return a.result(a.call().Run(call))
}

// result maps the error of a call that may have used CUDA to its result.
func (a *args) result(err error) C.int {
	if err == nil {
		return resSuccess
	}
	var ce *core.Error
	if errors.As(err, &ce) {
		return result(a.fn, err)
	}
	code := resUnavailable // a CUDA runtime error: the message names the call
	if errors.Is(err, stage.ErrTimeout) {
		code = C.int(core.CodeTimeout)
	}
	return fail(a.fn, code, "%v", err)
}

//export nxgo_device_adapter_install
func nxgo_device_adapter_install(adapter unsafe.Pointer) (r C.int) {
	const fn = "nexar_device_adapter_install"
	defer recoverToResult(fn, &r)
	if adapter == nil {
		return fail(fn, resInvalidArgument, "adapter is NULL")
	}
	rt, err := cuda.FromAdapter(adapter)
	if err != nil {
		return fail(fn, resInvalidArgument, "%v", err)
	}
	if err := router.Install(rt); err != nil {
		return fail(fn, resUnavailable, "%v", err)
	}
	return resSuccess
}
