// Package device gives Go programs nexar's collectives and point-to-point
// calls on CUDA device memory, through the router the C ABI uses
// (hier.Router): the same classification of buffers, the same NCCL
// hierarchy within a host (Config.NCCLHier), the same staging through
// pinned host memory, and GPUDirect RDMA for Send and Recv where the path
// to the peer moves device memory. A call here does what the C entry point
// of the same name does (include/nexar.h, docs/device-memory.md); a zero
// Stream gives the blocking form, On(s) the _stream form.
//
//	r := hier.NewRouter()            // one per process is enough
//	d := device.New(c, r)            // c: a *core.Comm
//	defer d.Close()
//	err := d.Allreduce(ctx, send, recv, n, collective.Float32, collective.Sum, device.On(s))
//
// Buffers are cuda.DevicePtr values; the router also takes host memory
// behind them (pinned, managed or plain), as the C ABI does. Host code in
// this package never dereferences a device pointer.
package device

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
	"github.com/nexar-go/nexar/hw/cuda"
)

// Stream orders a call on a CUDA stream. The zero Stream is the blocking
// form: the call runs after the work on the legacy default stream and its
// results are in the buffers when it returns. On(s) is the _stream form.
type Stream struct {
	s  cuda.Stream
	on bool
}

// On orders a call on s (a cudaStream_t; 0 is the legacy default stream):
// the call waits for the work enqueued on s before it and returns once its
// host part is done; device results reach the buffers in stream order.
func On(s cuda.Stream) Stream { return Stream{s: s, on: true} }

// Comm is a core.Comm's collectives on device memory. Safe for concurrent
// use as far as the core.Comm is: collectives must still be called in the
// same order on every rank.
type Comm struct {
	c *core.Comm
	r *hier.Router
}

// New returns c's device calls through r (nil: a router of its own), which
// probes for the CUDA runtime c's configuration names (Config.CUDARuntime),
// else the one the process has loaded. Without a runtime every pointer is
// taken as host memory, as in the C ABI.
func New(c *core.Comm, r *hier.Router) *Comm {
	if r == nil {
		r = hier.NewRouter()
	}
	r.Probe(c.Config())
	return &Comm{c: c, r: r}
}

// Router is the router the calls go through.
func (d *Comm) Router() *hier.Router { return d.r }

// Close releases the NCCL hierarchy made for d, if any; c itself is the
// caller's to close, after.
func (d *Comm) Close() { d.r.Release(d) }

// comm is the communicator d stands for now: c or, under the shrink
// policy, its successor.
func (d *Comm) comm(ctx context.Context) (*core.Comm, error) { return d.c.Successor(ctx) }

// nbytes is count elements of dt times mult, or an error naming arg.
func nbytes(fn, arg string, count, mult int, dt collective.DType) (int, error) {
	if count < 0 {
		return 0, &hier.ArgError{Msg: fmt.Sprintf("%s: %s %d is negative", fn, arg, count)}
	}
	if !dt.Valid() {
		return 0, &hier.ArgError{Msg: fmt.Sprintf("%s: data type %d is not a nexar data type", fn, int(dt))}
	}
	const maxBytes = 1 << 46 // as the C ABI: beyond any real buffer
	if mult > 0 && count > maxBytes/dt.Size()/mult {
		return 0, &hier.ArgError{Msg: fmt.Sprintf("%s: %s %d of %v is too large", fn, arg, count, dt)}
	}
	return count * mult * dt.Size(), nil
}

// route returns the hierarchy for a device collective, nil for the usual
// path.
func (d *Comm) route(ctx context.Context, c *core.Comm, count int, dt collective.DType, op collective.Op, reduces bool, bufs ...cuda.DevicePtr) (*hier.Comm, error) {
	ptrs := make([]uintptr, len(bufs))
	for i, p := range bufs {
		ptrs[i] = uintptr(p)
	}
	return d.r.Route(ctx, d, c, hier.Collective{Count: count, DType: dt, Op: op, Reduces: reduces, Bufs: ptrs})
}

// pointer is p as the unsafe.Pointer the router takes; never dereferenced
// here.
func pointer(p cuda.DevicePtr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// staged runs call with its buffers as the router gives them (host memory
// as it is, device memory staged); bufs adds each buffer to the call.
func (d *Comm) staged(s Stream, bufs func(call *hier.Call) error, call func() error) error {
	dc, err := d.r.Begin(true, s.on, s.s)
	if err != nil {
		return err
	}
	if err := bufs(&dc); err != nil {
		dc.Release()
		return err
	}
	return dc.Run(call)
}

// Allreduce combines send of every rank with op into recv (count elements
// of dt); send == recv is in place.
func (d *Comm) Allreduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op, s Stream) error {
	c, err := d.comm(ctx)
	if err != nil {
		return err
	}
	n, err := nbytes("allreduce", "count", count, 1, dt)
	if err != nil {
		return err
	}
	if h, err := d.route(ctx, c, count, dt, op, true, send, recv); err != nil || h != nil {
		if err != nil {
			return err
		}
		return h.Allreduce(ctx, send, recv, count, dt, op, s.s, !s.on)
	}
	var sb, rb []byte
	return d.staged(s, func(call *hier.Call) (err error) {
		if send != recv {
			if sb, err = call.Buf("allreduce: send", pointer(send), n, true, false); err != nil {
				return err
			}
		}
		rb, err = call.Buf("allreduce: recv", pointer(recv), n, send == recv, true)
		return err
	}, func() error { return c.Allreduce(ctx, sb, rb, dt, op) })
}

// Broadcast copies root's buf (count elements of dt) to every rank's buf.
func (d *Comm) Broadcast(ctx context.Context, buf cuda.DevicePtr, count int, dt collective.DType, root int, s Stream) error {
	c, err := d.comm(ctx)
	if err != nil {
		return err
	}
	n, err := nbytes("broadcast", "count", count, 1, dt)
	if err != nil {
		return err
	}
	if h, err := d.route(ctx, c, count, dt, 0, false, buf); err != nil || h != nil {
		if err != nil {
			return err
		}
		return h.Broadcast(ctx, buf, count, dt, root, s.s, !s.on)
	}
	var b []byte
	isRoot := c.Rank() == root
	return d.staged(s, func(call *hier.Call) (err error) {
		b, err = call.Buf("broadcast: buf", pointer(buf), n, isRoot, !isRoot)
		return err
	}, func() error { return c.Broadcast(ctx, b, dt, root) })
}

// Allgather puts every rank's send (count elements of dt) into recv, in
// rank order (Size()*count elements). send == recv is in place: this
// rank's block is already at its place in recv.
func (d *Comm) Allgather(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, s Stream) error {
	c, err := d.comm(ctx)
	if err != nil {
		return err
	}
	ns, err := nbytes("allgather", "count", count, 1, dt)
	if err != nil {
		return err
	}
	nr, err := nbytes("allgather", "count", count, c.Size(), dt)
	if err != nil {
		return err
	}
	if h, err := d.route(ctx, c, count, dt, 0, false, send, recv); err != nil || h != nil {
		if err != nil {
			return err
		}
		return h.Allgather(ctx, send, recv, count, dt, s.s, !s.on)
	}
	var sb, rb []byte
	return d.staged(s, func(call *hier.Call) (err error) {
		if send != recv {
			if sb, err = call.Buf("allgather: send", pointer(send), ns, true, false); err != nil {
				return err
			}
		}
		rb, err = call.Buf("allgather: recv", pointer(recv), nr, send == recv, true)
		return err
	}, func() error { return c.Allgather(ctx, sb, rb, dt) })
}

// ReduceScatter combines send (Size() blocks of recvcount elements of dt)
// of every rank with op and leaves block r in rank r's recv. send == recv
// is in place, as in the C ABI: the result is left in the first block.
func (d *Comm) ReduceScatter(ctx context.Context, send, recv cuda.DevicePtr, recvcount int, dt collective.DType, op collective.Op, s Stream) error {
	c, err := d.comm(ctx)
	if err != nil {
		return err
	}
	ns, err := nbytes("reduce_scatter", "recvcount", recvcount, c.Size(), dt)
	if err != nil {
		return err
	}
	nr, _ := nbytes("reduce_scatter", "recvcount", recvcount, 1, dt)
	if h, err := d.route(ctx, c, recvcount, dt, op, true, send, recv); err != nil || h != nil {
		if err != nil {
			return err
		}
		return h.ReduceScatter(ctx, send, recv, recvcount, dt, op, s.s, !s.on)
	}
	var sb, rb []byte
	return d.staged(s, func(call *hier.Call) (err error) {
		if send == recv {
			// In place: the input is the whole buffer, the result its first
			// block (core's own in-place form leaves it in block Rank()).
			rb, err = call.Buf("reduce_scatter: recv", pointer(recv), ns, true, true)
			return err
		}
		if sb, err = call.Buf("reduce_scatter: send", pointer(send), ns, true, false); err != nil {
			return err
		}
		rb, err = call.Buf("reduce_scatter: recv", pointer(recv), nr, false, true)
		return err
	}, func() error {
		if send == recv {
			sb, rb = append([]byte(nil), rb...), rb[:nr:nr]
		}
		return c.ReduceScatter(ctx, sb, rb, dt, op)
	})
}

// Send sends count elements of dt at buf to peer with tag.
func (d *Comm) Send(ctx context.Context, buf cuda.DevicePtr, count int, dt collective.DType, peer int, tag uint64, s Stream) error {
	c, err := d.comm(ctx)
	if err != nil {
		return err
	}
	n, err := nbytes("send", "count", count, 1, dt)
	if err != nil {
		return err
	}
	if peer < 0 || peer >= c.Size() {
		return &hier.ArgError{Msg: fmt.Sprintf("send: peer %d is not a rank of this communicator of %d", peer, c.Size())}
	}
	dc, err := d.r.Begin(true, s.on, s.s)
	if err != nil {
		return err
	}
	b, err := dc.P2PBuf("send: buf", pointer(buf), n, true, false, func() bool { return c.DevicePath(peer, true) })
	if err != nil {
		dc.Release()
		return err
	}
	send := c.Send
	if dc.Direct() {
		send = c.SendDevice
	}
	return dc.Run(func() error { return send(ctx, b, peer, tag) })
}

// Recv receives into buf (room for count elements of dt) from peer
// (core.AnySource: any) with tag. A staged receive that fails leaves buf as
// it was.
func (d *Comm) Recv(ctx context.Context, buf cuda.DevicePtr, count int, dt collective.DType, peer int, tag uint64, s Stream) (core.Status, error) {
	c, err := d.comm(ctx)
	if err != nil {
		return core.Status{}, err
	}
	n, err := nbytes("recv", "count", count, 1, dt)
	if err != nil {
		return core.Status{}, err
	}
	if peer != core.AnySource && (peer < 0 || peer >= c.Size()) {
		return core.Status{}, &hier.ArgError{Msg: fmt.Sprintf("recv: peer %d is not a rank of this communicator of %d", peer, c.Size())}
	}
	dc, err := d.r.Begin(true, s.on, s.s)
	if err != nil {
		return core.Status{}, err
	}
	// Read as well as written when staged: a shorter message leaves the
	// tail as it was.
	b, err := dc.P2PBuf("recv: buf", pointer(buf), n, true, true, func() bool { return c.DevicePath(peer, false) })
	if err != nil {
		dc.Release()
		return core.Status{}, err
	}
	recv := c.Recv
	if dc.Direct() {
		recv = c.RecvDevice
	}
	var st core.Status
	err = dc.Run(func() (err error) { st, err = recv(ctx, b, peer, tag); return err })
	return st, err
}
