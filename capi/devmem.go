package main

/*
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	trdma "github.com/nexar-go/nexar/transport/rdma"
)

// devMem is the process's CUDA staging (hw/cuda/stage): present once a
// communicator was created in a process that has a CUDA runtime loaded
// (or names one: NEXAR_CUDART, Config.CUDARuntime) and sees a device. Without it no pointer
// the process holds can be device memory, and buffers cost one atomic load.
// Safe for concurrent use.
type devMem struct {
	mu    sync.Mutex
	st    atomic.Pointer[stage.Stager]
	rt    *cuda.Runtime // the runtime st stages with; set with st (under mu), read after st.Load()
	why   string        // why there is no stager, for errors
	tried bool
}

var devices devMem

// probe looks for a CUDA runtime (comm creation calls it, with the
// runtime its configuration names, if any; cheap after the first success).
// A runtime loaded after the last communicator was created is found by the
// next creation.
func (d *devMem) probe(override string) {
	if d.st.Load() != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st.Load() != nil {
		return
	}
	d.tried = true
	rt, err := cuda.InProcess(override)
	switch {
	case err != nil:
		d.why = err.Error()
		return
	case rt == nil:
		d.why = "no CUDA runtime is loaded in this process (set NEXAR_CUDART, or load libcudart before creating the communicator)"
		return
	}
	n, err := rt.DeviceCount()
	if err != nil || n == 0 {
		d.why = fmt.Sprintf("the CUDA runtime %s sees no device (%v)", rt.Path(), err)
		return
	}
	d.rt = rt
	d.st.Store(stage.New(rt, stage.Options{}))
}

// gpu is the runtime for core's device paths (Config.GPU), nil without
// one: the RDMA data path registers device memory with the NIC through it.
func (d *devMem) gpu() trdma.GPUMemory {
	if d.st.Load() == nil {
		return nil
	}
	return trdma.CUDA(d.rt)
}

// reason says why device memory and streams cannot be served.
func (d *devMem) reason() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.tried {
		return "no communicator was created yet"
	}
	return d.why
}

// devCall is the device use of one call. ok: the entry point stages device buffers
// (blocking calls and the _stream variants); the others refuse them, but
// for what a point-to-point call may pass to the path as it is (direct).
type devCall struct {
	ok     bool
	stream uintptr // the caller's cudaStream_t (0: legacy default)
	isStrm bool    // a _stream variant: completion chained to stream
	call   *stage.Call
	direct bool // a device buffer goes to core as it is (GPUDirect RDMA path)
}

// allowDevice marks the call as one that stages device buffers; stream is
// its cudaStream_t for a _stream variant.
func (a *args) allowDevice(streamVariant bool, stream unsafe.Pointer) {
	a.dev.ok = true
	a.dev.isStrm = streamVariant
	a.dev.stream = uintptr(stream)
	if streamVariant && stream != nil && devices.st.Load() == nil {
		a.failf(resInvalidArgument, "stream %p given but CUDA is not usable: %s", stream, devices.reason())
	}
}

// dbuf is buf for memory that may be on a device: in and out say whether
// the call reads and writes it (what staging must copy in and back).
func (a *args) dbuf(name string, p unsafe.Pointer, n int, in, out bool) []byte {
	return a.p2pBuf(name, p, n, in, out, nil)
}

// p2pBuf is dbuf for the one buffer of a point-to-point call: a device
// buffer goes to core as it is (a.dev.direct; no staging) where direct
// reports that the path to the peer moves device memory between the NIC
// and the device (core's DevicePath), decided anew at every call. A call
// that does not stage (!a.dev.ok: isend, irecv) takes device memory only
// that way.
func (a *args) p2pBuf(name string, p unsafe.Pointer, n int, in, out bool, direct func() bool) []byte {
	if !a.ok() {
		return nil
	}
	if n == 0 {
		return []byte{}
	}
	if p == nil {
		a.failf(resInvalidArgument, "%s is NULL but must hold %d bytes", name, n)
		return nil
	}
	st := devices.st.Load()
	if st == nil {
		return unsafe.Slice((*byte)(p), n)
	}
	isDev, dev, err := st.Device(uintptr(p))
	if err != nil {
		a.failf(resUnavailable, "%s %p: %v", name, p, err)
		return nil
	}
	if !isDev {
		return unsafe.Slice((*byte)(p), n)
	}
	if direct != nil && direct() {
		a.dev.direct = true
		return unsafe.Slice((*byte)(p), n)
	}
	if direct != nil && !a.dev.ok {
		a.failf(resInvalidArgument, "%s %p is CUDA device memory, which %s takes only where the path to the peer moves device memory (GPUDirect RDMA; docs/device-memory.md): the blocking and _stream forms take it everywhere", name, p, a.fn)
		return nil
	}
	if !a.dev.ok {
		a.failf(resInvalidArgument, "%s %p is CUDA device memory, which %s does not take (the blocking collectives, send/recv and the _stream variants do)", name, p, a.fn)
		return nil
	}
	if a.dev.call == nil {
		a.dev.call = st.Begin()
	}
	h, err := a.dev.call.Add(stage.Buf{Name: name, Ptr: uintptr(p), Len: n, In: in, Out: out}, dev)
	if err != nil {
		code := resUnavailable
		if errors.Is(err, stage.ErrTimeout) {
			code = C.int(core.CodeTimeout)
		}
		a.failf(code, "%v", err)
		return nil
	}
	return h
}

// waitStream runs call, which gives device memory to the NIC, once the
// work enqueued on the caller's stream so far is done (the legacy default
// stream for the blocking and non-blocking forms): that work may still
// write or read the buffer. Nothing is left on the stream: the transfer
// is over when call returns (a non-blocking call's request says when).
func (a *args) waitStream(call func() error) error {
	if err := devices.st.Load().WaitStream(cuda.Stream(a.dev.stream)); err != nil {
		return err
	}
	return call()
}

// run makes the call, staging its device buffers if it has any. A
// _stream variant with host buffers only still waits for the work on its
// stream first (its host buffers may be the target of copies queued there).
func (a *args) run(call func() error) C.int {
	var err error
	switch {
	case a.dev.direct:
		err = a.waitStream(call)
	case a.dev.call != nil:
		err = a.dev.call.Run(cuda.Stream(a.dev.stream), !a.dev.isStrm, call)
	case a.dev.isStrm && a.dev.stream != 0:
		if err = devices.st.Load().WaitStream(cuda.Stream(a.dev.stream)); err == nil {
			err = call()
		}
	default:
		err = call()
	}
	return a.result(err)
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
