package hier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
)

// Router is the one policy for CUDA device buffers given to nexar's calls,
// shared by Go programs and the C ABI (capi calls nothing else for them):
//
//   - where a buffer lives (Kinds: asked of the CUDA runtime once per
//     buffer, not per call; see Kinds for the rule on reused addresses);
//   - which device collectives go to NCCL within a host (Route: the
//     communicator's Config.NCCLHier, read when it was made, never the
//     environment of the moment; a hierarchy per caller's handle, made by
//     the first such call and remade for a successor under the shrink
//     policy);
//   - how the other calls take device memory (Begin: staged through pinned
//     host memory, or handed to core as it is where the path to the peer
//     moves device memory).
//
// A program without a CUDA runtime pays one atomic load per call. Safe for
// concurrent use.
//
// From Go, for an allreduce on buffers that may be device memory:
//
//	r.Probe(c.Config())                  // once, when c is made
//	if h, err := r.Route(ctx, c, c, hier.Collective{...}); err != nil || h != nil {
//		... h.Allreduce(...) when h != nil
//	}
//	call, err := r.Begin(true, false, 0) // a Call value, kept by the caller
//	send, err := call.Buf("sendbuf", p, n, true, false)
//	... err = call.Run(func() error { return c.Allreduce(ctx, send, recv, dt, op) })
type Router struct {
	dev atomic.Pointer[devices] // nil: no CUDA device in this process
	// none classifies buffers while dev is nil: host memory if the host
	// can read it, through the CUDA driver where one is loaded (Probe).
	none atomic.Pointer[hostCheck]

	mu    sync.Mutex // probing
	why   string     // why dev is nil
	tried bool

	ncclOnce sync.Once
	lib      *nccl.Library
	libWhy   string

	hmu   sync.Mutex
	hiers map[any]*routed // by the caller's handle

	direct Directs // GPUDirect collectives by the caller's handle (gpudirect.go)
}

// devices is what a process with a CUDA device has.
type devices struct {
	rt    *cuda.Runtime
	st    *stage.Stager
	kinds *Kinds
}

// routed is a handle's hierarchy: set up for comm, the communicator the
// handle stood for then.
type routed struct {
	mu   sync.Mutex
	comm *core.Comm
	h    *Comm
	err  error // the setup's failure: every later device call reports it
}

// NewRouter returns a router that has found no CUDA runtime yet (Probe).
func NewRouter() *Router {
	r := &Router{hiers: map[any]*routed{}}
	r.none.Store(newHostCheck(nil))
	return r
}

// noRuntime classifies pointers where no device runtime was found: what
// the CUDA driver says, where the process has one loaded, else host memory
// (which Kinds then checks the host can read).
type noRuntime struct{ drv *cuda.Driver }

func (n noRuntime) PointerType(p uintptr) (cuda.MemoryType, int, error) {
	if n.drv == nil {
		return cuda.Unregistered, -1, nil
	}
	t, dev, err := n.drv.PointerType(p)
	if err == nil && t == cuda.Device {
		return t, dev, &UnknownPointerError{Ptr: p, Driver: true, Device: dev}
	}
	return t, dev, err
}

// InstallError is an adapter that Install cannot take: a runtime is in use
// already, or it sees no device.
type InstallError struct{ Msg string }

func (e *InstallError) Error() string { return "hier: device adapter: " + e.Msg }

// Install makes rt (a GPU runtime's adapter, cuda.FromAdapter) the device
// runtime of the communicators made from now on, in place of the CUDA
// runtime Probe would look for. Once per process, before any communicator
// found a runtime: an *InstallError otherwise, and where rt sees no device.
func (r *Router) Install(rt *cuda.Runtime) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.dev.Load(); d != nil {
		if d.rt.IsCUDA() {
			return &InstallError{fmt.Sprintf("a communicator uses the CUDA runtime %s already: install the adapter before creating communicators", d.rt.Path())}
		}
		return &InstallError{fmt.Sprintf("the adapter %q is installed already (one per process)", d.rt.Name())}
	}
	n, err := rt.DeviceCount()
	if err != nil {
		return &InstallError{fmt.Sprintf("%s: device_count: %v", rt.Name(), err)}
	}
	if n == 0 {
		return &InstallError{fmt.Sprintf("%s: device_count says 0 devices", rt.Name())}
	}
	r.tried = true
	r.dev.Store(&devices{rt: rt, st: stage.New(rt, stage.Options{}), kinds: NewKinds(rt)})
	return nil
}

// Probe looks for the CUDA runtime that cfg names (Config.CUDARuntime),
// else the one the process has loaded, and a device it sees. Cheap once one
// was found; a runtime loaded after a failed probe is found by the next.
// Communicator creation calls it.
func (r *Router) Probe(cfg core.Config) {
	if r.dev.Load() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dev.Load() != nil {
		return
	}
	r.tried = true
	rt, err := cuda.InProcess(cfg.CUDARuntime)
	switch {
	case err != nil:
		r.why = err.Error()
		return
	case rt == nil:
		r.why = "no CUDA runtime is loaded in this process (set NEXAR_CUDART, or load libcudart before creating the communicator)"
		if drv := cuda.LoadedDriver(); drv != nil {
			r.why = "the CUDA driver is loaded but no CUDA runtime libnexar can use (a statically linked one exports none): set NEXAR_CUDART"
			r.none.Store(newHostCheck(NewKinds(noRuntime{drv: drv})))
		}
		return
	}
	n, err := rt.DeviceCount()
	if err != nil || n == 0 {
		r.why = fmt.Sprintf("the CUDA runtime %s sees no device (%v)", rt.Path(), err)
		return
	}
	r.dev.Store(&devices{rt: rt, st: stage.New(rt, stage.Options{}), kinds: NewKinds(rt)})
}

// Runtime is the CUDA runtime Probe found, nil without one.
func (r *Router) Runtime() *cuda.Runtime {
	if d := r.dev.Load(); d != nil {
		return d.rt
	}
	return nil
}

// Stager is the staging over Runtime, nil without one.
func (r *Router) Stager() *stage.Stager {
	if d := r.dev.Load(); d != nil {
		return d.st
	}
	return nil
}

// Kinds is the cache of buffer kinds, nil without a device.
func (r *Router) Kinds() *Kinds {
	if d := r.dev.Load(); d != nil {
		return d.kinds
	}
	return nil
}

// Reason says why device memory and streams cannot be served.
func (r *Router) Reason() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.tried {
		return "no communicator was created yet"
	}
	return r.why
}

// Forget drops what is remembered of the buffer at p (see Kinds).
func (r *Router) Forget(p uintptr) {
	if k := r.Kinds(); k != nil {
		k.Forget(p)
	}
	r.none.Load().forget(p)
}

// Purge drops every remembered buffer kind.
func (r *Router) Purge() {
	if k := r.Kinds(); k != nil {
		k.Purge()
	}
	r.none.Load().purge()
}

// hostCheck says whether a buffer is host memory the host may read, where
// no device runtime was found. The common case (no GPU at all) must stay
// cheap: addresses found readable are remembered in a direct-mapped table
// of atomics (no lock; a collision only costs another probe), so a buffer
// passed again costs a load and a compare. With the CUDA driver loaded its
// answers go through a Kinds instead. Safe for concurrent use.
type hostCheck struct {
	kinds    *Kinds // nil: no driver
	readable func(p uintptr) bool
	seen     [hostCheckSlots]atomic.Uintptr
}

const hostCheckSlots = 1024 // a power of two

func newHostCheck(k *Kinds) *hostCheck { return &hostCheck{kinds: k, readable: cuda.Readable} }

func (h *hostCheck) slot(p uintptr) *atomic.Uintptr {
	return &h.seen[(uint64(p)>>3)*0x9e3779b97f4a7c15>>(64-10)]
}

// check returns nil for host memory the host may read, else an
// *UnknownPointerError.
func (h *hostCheck) check(p uintptr) error {
	if p == 0 {
		return nil
	}
	if h.kinds != nil {
		_, err := h.kinds.Of(p)
		return err
	}
	s := h.slot(p)
	if s.Load() == p {
		return nil
	}
	if !h.readable(p) {
		return &UnknownPointerError{Ptr: p}
	}
	s.Store(p)
	return nil
}

func (h *hostCheck) forget(p uintptr) {
	if h.kinds != nil {
		h.kinds.Forget(p)
	}
	h.slot(p).CompareAndSwap(p, 0)
}

func (h *hostCheck) purge() {
	if h.kinds != nil {
		h.kinds.Purge()
	}
	for i := range h.seen {
		h.seen[i].Store(0)
	}
}

// Place reports where the buffer at p lives (an *UnknownPointerError for
// one that is not host memory the host can read and no runtime claims).
func (r *Router) Place(p uintptr) (Place, error) {
	d := r.dev.Load()
	if d == nil {
		return Host, r.none.Load().check(p)
	}
	return d.kinds.Of(p)
}

// nccl loads the process's NCCL once: the library the first communicator
// that needs it names (Config.NCCLLibrary), else libnccl.so.2 or
// libnccl.so. When the configuration names the CUDA runtime but no NCCL,
// none is loaded: an NCCL found on the loader's path would not be built
// for that runtime.
func (r *Router) nccl(cfg core.Config, rt *cuda.Runtime) (*nccl.Library, string) {
	r.ncclOnce.Do(func() { r.lib, r.libWhy = loadNCCL(cfg, rt) })
	return r.lib, r.libWhy
}

func loadNCCL(cfg core.Config, rt *cuda.Runtime) (*nccl.Library, string) {
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
	if !rt.IsCUDA() {
		return nil, fmt.Sprintf("the device runtime is the adapter %q: NEXAR_NCCL names no NCCL built for it (RCCL for HIP)", rt.Name())
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

// Collective describes a device collective for Route.
type Collective struct {
	Count   int // elements; 0 takes the usual path
	DType   collective.DType
	Op      collective.Op
	Reduces bool      // an allreduce or reduce-scatter: Op applies
	Bufs    []uintptr // every buffer of the call
}

// ArgError is a call's argument that the router refuses (capi reports it
// as an invalid argument).
type ArgError struct{ Msg string }

func (e *ArgError) Error() string { return e.Msg }

// SetupError is the failure of a hierarchy's setup, reported by every
// device collective on the handle afterwards.
type SetupError struct {
	Mode Mode
	Err  error
}

func (e *SetupError) Error() string {
	return fmt.Sprintf("setting up NCCL (NEXAR_NCCL_HIER=%v): %v", e.Mode, e.Err)
}

func (e *SetupError) Unwrap() error { return e.Err }

// Route returns the hierarchical communicator that carries x on c, or nil
// when the call takes the usual path: no CUDA device, an empty call, a
// host buffer among x.Bufs, buffers on different devices, an invalid
// type or an op NCCL lacks (the usual path reports those), the mode off,
// no NCCL under Auto, or a hierarchy that decided against NCCL. key names
// the caller's handle (capi: the C handle; Go: the *core.Comm it holds),
// c the communicator that handle stands for now (a successor under the
// shrink policy gets a hierarchy of its own). The first routed call on a
// handle sets the hierarchy up, collectively: every rank makes it with
// device buffers.
func (r *Router) Route(ctx context.Context, key any, c *core.Comm, x Collective) (*Comm, error) {
	d := r.dev.Load()
	if d == nil || x.Count == 0 {
		return nil, nil
	}
	cfg := c.Config()
	mode, err := ParseMode(cfg.NCCLHier)
	if err != nil {
		return nil, &ArgError{err.Error()}
	}
	if mode == Off {
		return nil, nil
	}
	dev := -1
	for _, p := range x.Bufs {
		if p == 0 {
			return nil, nil
		}
		pl, err := d.kinds.Of(p)
		if err != nil || !pl.OnDevice || (dev >= 0 && pl.Device != dev) {
			return nil, nil
		}
		dev = pl.Device
	}
	if !x.DType.Valid() || !x.Op.Valid() {
		return nil, nil
	}
	if x.Reduces && collective.Check(x.DType, x.Op) != nil || !Supports(x.DType, x.Op, x.Reduces) {
		return nil, nil
	}
	lib, why := r.nccl(cfg, d.rt)
	if lib == nil && mode == Auto {
		return nil, nil // this process has no NCCL: the staged path
	}
	s := r.routedFor(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.comm != c { // first use, or a successor (shrink policy)
		if s.h != nil {
			s.h.Close()
		}
		s.comm, s.h, s.err = c, nil, nil
		deps := Deps{Runtime: d.rt, Stager: d.st, NCCL: lib, Unusable: why}
		s.h, s.err = New(ctx, c, deps, Options{Mode: mode, HostID: cfg.HierHostID, Device: dev})
		if s.err != nil {
			s.err = &SetupError{Mode: mode, Err: s.err}
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	if !s.h.Active() {
		return nil, nil
	}
	if dev != s.h.Device() {
		return nil, &ArgError{fmt.Sprintf("the buffers are on CUDA device %d but this communicator's NCCL is on device %d", dev, s.h.Device())}
	}
	return s.h, nil
}

func (r *Router) routedFor(key any) *routed {
	r.hmu.Lock()
	defer r.hmu.Unlock()
	s := r.hiers[key]
	if s == nil {
		s = &routed{}
		r.hiers[key] = s
	}
	return s
}

// Release closes and forgets key's hierarchy (before the communicators it
// was made over are closed), and purges the kinds of buffers remembered.
func (r *Router) Release(key any) {
	r.hmu.Lock()
	s := r.hiers[key]
	delete(r.hiers, key)
	r.hmu.Unlock()
	if s != nil {
		s.mu.Lock()
		if s.h != nil {
			s.h.Close()
		}
		s.mu.Unlock()
	}
	r.direct.Release(key)
	r.Purge()
}

// Call is the device side of one call that is not routed to NCCL: its
// buffers are host memory (used as they are), device memory staged through
// pinned host memory, or device memory handed to core as it is (Direct).
// A Call belongs to one goroutine; Run or Release ends it. The zero Call
// takes host memory only: start one with Router.Begin.
type Call struct {
	d       *devices   // nil: no CUDA device
	none    *hostCheck // with d nil: what the host may read
	stages  bool
	stream  cuda.Stream
	isStrm  bool
	sc      *stage.Call
	direct  bool
	devPtrs []uintptr // the device buffers, forgotten if the call fails
}

// Begin starts a call. stages: the entry point stages device buffers (the
// blocking forms and the _stream variants; the non-blocking ones take
// device memory only where the path moves it). streamVariant: a _stream
// form, whose completion is chained to stream (its cudaStream_t; 0 is the
// legacy default stream).
func (r *Router) Begin(stages, streamVariant bool, stream cuda.Stream) (Call, error) {
	d := r.dev.Load()
	if streamVariant && stream != 0 && d == nil {
		return Call{}, &ArgError{fmt.Sprintf("stream %#x given but CUDA is not usable: %s", uintptr(stream), r.Reason())}
	}
	return Call{d: d, none: r.none.Load(), stages: stages, stream: stream, isStrm: streamVariant}, nil
}

// Direct reports whether a device buffer of the call goes to core as it is.
func (c *Call) Direct() bool { return c.direct }

// Buf returns the n bytes at p as the call uses them: host memory as it
// is, device memory staged (in and out say whether the call reads and
// writes it: what staging copies in and back). p must not be NULL when n
// is not 0; an empty buffer is a non-nil empty slice.
func (c *Call) Buf(name string, p unsafe.Pointer, n int, in, out bool) ([]byte, error) {
	return c.P2PBuf(name, p, n, in, out, nil)
}

// P2PBuf is Buf for the one buffer of a point-to-point call: device memory
// goes to core as it is (Direct; no staging) where direct reports that
// the path to the peer moves device memory between the NIC and the device
// (core's Comm.DevicePath). A call that does not stage takes device
// memory only that way.
func (c *Call) P2PBuf(name string, p unsafe.Pointer, n int, in, out bool, direct func() bool) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	if p == nil {
		return nil, &ArgError{fmt.Sprintf("%s is NULL but must hold %d bytes", name, n)}
	}
	if c.d == nil {
		if c.none != nil {
			if err := c.none.check(uintptr(p)); err != nil {
				return nil, &ArgError{fmt.Sprintf("%s %v", name, err)}
			}
		}
		return unsafe.Slice((*byte)(p), n), nil
	}
	pl, err := c.d.kinds.Of(uintptr(p))
	var u *UnknownPointerError
	if errors.As(err, &u) {
		return nil, &ArgError{fmt.Sprintf("%s %v", name, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("%s %p: %w", name, p, err)
	}
	if !pl.OnDevice {
		return unsafe.Slice((*byte)(p), n), nil
	}
	c.devPtrs = append(c.devPtrs, uintptr(p))
	if direct != nil && direct() {
		c.direct = true
		return unsafe.Slice((*byte)(p), n), nil
	}
	if !c.stages {
		if direct != nil {
			return nil, &ArgError{fmt.Sprintf("%s %p is CUDA device memory, which this call takes only where the path to the peer moves device memory (GPUDirect RDMA; docs/device-memory.md): the blocking and _stream forms take it everywhere", name, p)}
		}
		return nil, &ArgError{fmt.Sprintf("%s %p is CUDA device memory, which this call does not take (the blocking collectives, send/recv and the _stream variants do)", name, p)}
	}
	if c.sc == nil {
		c.sc = c.d.st.Begin()
	}
	return c.sc.Add(stage.Buf{Name: name, Ptr: uintptr(p), Len: n, In: in, Out: out}, pl.Device)
}

// WaitStream waits for the work enqueued so far on the call's stream (the
// legacy default stream for the blocking and non-blocking forms): a
// buffer given to the NIC as it is may still be written by it.
func (c *Call) WaitStream() error {
	if c.d == nil {
		return nil
	}
	return c.d.st.WaitStream(c.stream)
}

// Run makes the call: after the caller's stream where a buffer goes to core
// as it is, around staging where one is staged; a _stream variant with
// host buffers only still waits for its stream first (its host buffers
// may be the target of copies queued there). A failed call forgets its
// device buffers' kinds.
func (c *Call) Run(call func() error) error {
	var err error
	switch {
	case c.direct:
		if err = c.WaitStream(); err == nil {
			err = call()
		}
	case c.sc != nil:
		err = c.sc.Run(c.stream, !c.isStrm, call)
	case c.isStrm && c.stream != 0 && c.d != nil:
		if err = c.d.st.WaitStream(c.stream); err == nil {
			err = call()
		}
	default:
		err = call()
	}
	if err != nil && c.d != nil {
		var ce *core.Error
		if !errors.As(err, &ce) {
			for _, p := range c.devPtrs {
				c.d.kinds.Forget(p)
			}
		}
	}
	return err
}

// Release ends a call that will not run (a later argument failed),
// returning any staging buffers it holds.
func (c *Call) Release() {
	if c.sc != nil {
		c.sc.Release()
	}
}

// Stream is the call's cudaStream_t (0: the legacy default stream).
func (c *Call) Stream() cuda.Stream { return c.stream }

// StreamVariant reports whether the call is a _stream form, whose
// completion is chained to Stream.
func (c *Call) StreamVariant() bool { return c.isStrm }
