package main

/*
#include "capi.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/nccl"
)

// The hierarchical device collectives (package hier) in the C ABI: an
// allreduce, broadcast, allgather or reduce-scatter whose buffers are all
// device memory, blocking or _stream, goes through NCCL within a host and
// nexar between hosts when NEXAR_NCCL_HIER allows it (auto, the default:
// when this process loads NCCL; on; off). The first such call on a
// communicator sets the hierarchy up, collectively: every rank must make
// it with device buffers. Whether NCCL is then used is decided alike on
// every rank (hier.New); when it is not, and for calls NCCL cannot take
// (bitwise reductions), device buffers are staged as before
// (capi/devmem.go). Safe for concurrent use.

// hierState is a communicator handle's hierarchy: set up for comm, the
// communicator the handle stood for then (under the shrink policy a
// successor gets its own).
type hierState struct {
	mu   sync.Mutex
	comm *core.Comm
	h    *hier.Comm
	err  error // the setup's failure: every later device call reports it
}

// hierTable holds the states by communicator handle.
type hierTable struct {
	mu sync.Mutex
	m  map[uintptr]*hierState
}

var hiers hierTable

func (t *hierTable) get(h uintptr) *hierState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[uintptr]*hierState{}
	}
	s := t.m[h]
	if s == nil {
		s = &hierState{}
		t.m[h] = s
	}
	return s
}

// remove closes and forgets h's hierarchy (nexar_comm_destroy).
func (t *hierTable) remove(h uintptr) {
	t.mu.Lock()
	s := t.m[h]
	delete(t.m, h)
	t.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		if s.h != nil {
			s.h.Close()
		}
		s.mu.Unlock()
	}
}

// ncclLoader loads the process's NCCL once: the library the first
// communicator that needs it names (NEXAR_NCCL, Config.NCCLLibrary), else
// libnccl.so.2 or libnccl.so. When the configuration names the CUDA
// runtime (NEXAR_CUDART) but no NCCL, none is loaded: an NCCL found on the
// loader's path would not be built for that runtime. Safe for concurrent use.
type ncclLoader struct {
	once sync.Once
	lib  *nccl.Library
	why  string // why there is none
}

var nccls ncclLoader

func (l *ncclLoader) get(cfg core.Config) (*nccl.Library, string) {
	l.once.Do(func() { l.lib, l.why = loadNCCL(cfg) })
	return l.lib, l.why
}

func loadNCCL(cfg core.Config) (*nccl.Library, string) {
	if p := cfg.NCCLLibrary; p != "" {
		l, err := nccl.Open(p)
		if err != nil {
			return nil, err.Error()
		}
		return l, ""
	}
	if cfg.CUDARuntime != "" {
		return nil, "NEXAR_CUDART names the CUDA runtime but NEXAR_NCCL names no NCCL to go with it"
	}
	var last error
	for _, name := range []string{"libnccl.so.2", "libnccl.so"} {
		l, err := nccl.Open(name)
		if err == nil {
			return l, ""
		}
		last = err
	}
	return nil, last.Error()
}

// hier returns the hierarchical communicator for a call of a.fn whose
// buffers are bufs (all must be device memory of one device), or nil when
// the call takes the usual path: no device buffers, a NULL or host buffer,
// an empty call, arguments the usual path reports, an op NCCL lacks, the
// mode off, or a hierarchy that decided against NCCL.
func (a *args) hier(handle C.uintptr_t, count C.size_t, dt, op C.int, reduces bool, bufs ...unsafe.Pointer) *hier.Comm {
	st := devices.st.Load()
	if st == nil || count == 0 || !a.ok() {
		return nil
	}
	c := a.comm(handle)
	if !a.ok() {
		return nil
	}
	// The mode and host are the communicator's configuration (knobs read
	// once, when it was made), never the environment of the moment.
	cfg := c.Config()
	mode, err := hier.ParseMode(cfg.NCCLHier)
	if err != nil {
		a.failf(resInvalidArgument, "%v", err)
		return nil
	}
	if mode == hier.Off {
		return nil
	}
	dev := -1
	for _, p := range bufs {
		if p == nil {
			return nil
		}
		isDev, d, err := st.Device(uintptr(p))
		if err != nil || !isDev || (dev >= 0 && d != dev) {
			return nil
		}
		dev = d
	}
	t := collective.DType(dt)
	o := collective.Op(op)
	if dt < 0 || !t.Valid() || op < 0 || !o.Valid() {
		return nil
	}
	if reduces && collective.Check(t, o) != nil || !hier.Supports(t, o, reduces) {
		return nil
	}
	lib, why := nccls.get(cfg)
	if lib == nil && mode == hier.Auto {
		return nil // this process has no NCCL: the staged path
	}
	s := hiers.get(uintptr(handle))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.comm != c { // first use, or a successor (shrink policy)
		if s.h != nil {
			s.h.Close()
		}
		s.comm, s.h, s.err = c, nil, nil
		deps := hier.Deps{Runtime: devices.rt, Stager: st, NCCL: lib, Unusable: why}
		s.h, s.err = hier.New(bg, c, deps, hier.Options{Mode: mode, HostID: cfg.HierHostID, Device: dev})
	}
	if s.err != nil {
		a.failf(resultOf(s.err), "setting up NCCL (NEXAR_NCCL_HIER=%v): %v", mode, s.err)
		return nil
	}
	if !s.h.Active() {
		return nil
	}
	if dev != s.h.Device() {
		a.failf(resInvalidArgument, "the buffers are on CUDA device %d but this communicator's NCCL is on device %d", dev, s.h.Device())
		return nil
	}
	return s.h
}

func devPtr(p unsafe.Pointer) cuda.DevicePtr { return cuda.DevicePtr(uintptr(p)) }

// hierCall makes call through the handle's hierarchy, on the call's stream
// and blocking unless a _stream variant, when a.hier says so; ok is false
// when the call takes the usual path. countName and perRank describe the
// count argument (perRank: it counts one rank's block of a buffer of
// Size() blocks).
func hierCall(a *args, comm C.uintptr_t, countName string, count C.size_t, perRank bool, dt, op C.int, reduces bool,
	bufs []unsafe.Pointer, call func(h *hier.Comm, stream cuda.Stream, blocking bool) error) (r C.int, ok bool) {
	h := a.hier(comm, count, dt, op, reduces, bufs...)
	if !a.ok() {
		return a.fail(), true
	}
	if h == nil {
		return 0, false
	}
	mult := 1
	if perRank {
		mult = h.Size()
	}
	if a.bytes(countName, count, mult, collective.DType(dt)); !a.ok() {
		return a.fail(), true
	}
	err := call(h, cuda.Stream(a.dev.stream), !a.dev.isStrm)
	var ce *core.Error
	if err != nil && !errors.As(err, &ce) {
		return fail(a.fn, resUnavailable, "%v", err), true
	}
	return result(a.fn, err), true
}

// hierAllreduce serves nexar_allreduce and nexar_allreduce_stream.
func hierAllreduce(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (C.int, bool) {
	return hierCall(a, comm, "count", count, false, dt, op, true, []unsafe.Pointer{sendbuf, recvbuf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.Allreduce(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), collective.Op(op), s, blocking)
		})
}

// hierBroadcast serves nexar_broadcast and nexar_broadcast_stream.
func hierBroadcast(a *args, buf unsafe.Pointer, count C.size_t, dt, root C.int, comm C.uintptr_t) (C.int, bool) {
	return hierCall(a, comm, "count", count, false, dt, 0, false, []unsafe.Pointer{buf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.Broadcast(bg, devPtr(buf), int(count), collective.DType(dt), int(root), s, blocking)
		})
}

// hierAllgather serves nexar_allgather and nexar_allgather_stream.
func hierAllgather(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt C.int, comm C.uintptr_t) (C.int, bool) {
	return hierCall(a, comm, "count", count, true, dt, 0, false, []unsafe.Pointer{sendbuf, recvbuf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.Allgather(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), s, blocking)
		})
}

// hierReduceScatter serves nexar_reduce_scatter and nexar_reduce_scatter_stream.
func hierReduceScatter(a *args, sendbuf, recvbuf unsafe.Pointer, count C.size_t, dt, op C.int, comm C.uintptr_t) (C.int, bool) {
	return hierCall(a, comm, "recvcount", count, true, dt, op, true, []unsafe.Pointer{sendbuf, recvbuf},
		func(h *hier.Comm, s cuda.Stream, blocking bool) error {
			return h.ReduceScatter(bg, devPtr(sendbuf), devPtr(recvbuf), int(count), collective.DType(dt), collective.Op(op), s, blocking)
		})
}
