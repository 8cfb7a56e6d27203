package core

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/core/internal/match"
	"github.com/nexar-go/nexar/transport"
)

// opContext bounds an operation: by ctx, by the configured Timeout (or
// ctx's earlier deadline), and by the communicator's failure or close.
func (c *Comm) opContext(ctx context.Context) (context.Context, func()) {
	o := c.newOpCtx(ctx)
	return o, o.release
}

// opError turns whatever an operation ran into into an *Error for op,
// preferring the communicator's sticky failure, which is the root cause.
func (c *Comm) opError(op string, ctx context.Context, err error) error {
	if f := c.failure(op); f != nil {
		return f
	}
	var e *Error
	if errors.As(err, &e) {
		return withOp(e, op)
	}
	var pd *transport.PeerDownError
	switch {
	case errors.As(err, &pd):
		r, _ := c.rankOfWorld(pd.Peer)
		if isDeparture(err) {
			e := withOp(c.departedError(r), op).(*Error)
			e.Cause = err
			return e
		}
		if stalled := c.n.stalledFor(time.Now()); stalled > 0 {
			// The transport's error can beat the detector here: after a
			// stop, the peers closed this rank's connections.
			c.mu.Lock()
			lost, ok := c.liveMemberNameLocked(pd.Peer)
			c.mu.Unlock()
			if !ok {
				lost = fmt.Sprintf("rank %d", r)
			}
			return &Error{Code: CodePeerDown, Op: op, Rank: c.rank, Cause: err, Msg: c.stalledMsg(stalled, lost, pd.Cause)}
		}
		return &Error{Code: CodePeerDown, Op: op, Rank: r, Msg: fmt.Sprintf("rank %d is unreachable: %v", r, pd.Cause), Cause: err}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return c.timeoutError(op, err)
	case errors.Is(err, context.Canceled):
		return &Error{Code: CodeAborted, Op: op, Rank: -1, Msg: "cancelled", Cause: err}
	case errors.Is(err, transport.ErrClosed):
		return &Error{Code: CodeClosed, Op: op, Rank: -1, Msg: "transport closed", Cause: err}
	}
	return &Error{Code: CodeInternal, Op: op, Rank: -1, Msg: err.Error(), Cause: err}
}

// sendChunked sends data to comm rank peer as one message, in chunks of at
// most transport.MaxPayload on one lane, so they arrive in order.
func (c *Comm) sendChunked(ctx context.Context, peer int, h header, data []byte) error {
	return c.sendMsg(ctx, peer, h, data, false)
}

// sendMsg is sendChunked of data in host memory, or in device memory
// (dev), which no host code here reads.
func (c *Comm) sendMsg(ctx context.Context, peer int, h header, data []byte, dev bool) error {
	h.comm = c.id
	h.total = uint64(len(data))
	th := c.n.header()
	defer c.n.putHeader(th)
	h.encode(th, c.gen)
	w := c.world[peer]
	if len(data) == 0 {
		return c.n.ep.Send(ctx, w, transport.LaneData, th, nil)
	}
	for off := 0; off < len(data); off += transport.MaxPayload {
		end := min(off+transport.MaxPayload, len(data))
		var err error
		if dev {
			err = c.sendDevice(ctx, w, th, data[off:end])
		} else {
			err = c.n.ep.Send(ctx, w, transport.LaneData, th, data[off:end])
		}
		if err != nil {
			if off > 0 {
				// The receiver holds a partial message; the stream from
				// here to peer can no longer be framed.
				c.fail(&Error{Code: CodeInternal, Op: "send", Rank: peer,
					Msg: fmt.Sprintf("message to rank %d cut after %d of %d bytes: %v", peer, off, len(data), err), Cause: err})
			}
			return err
		}
	}
	return nil
}

// sendDevice sends one chunk in device memory to world rank w: by the
// path itself where its channel moves device memory, else copied to host
// memory first with the GPU runtime (the path to w changed since the
// caller chose, or never carried device memory).
func (c *Comm) sendDevice(ctx context.Context, w int, th *transport.Header, p []byte) error {
	err := c.n.ep.SendDevice(ctx, w, th, p)
	if !errors.Is(err, transport.ErrNoDevicePath) {
		return err
	}
	host := make([]byte, len(p))
	if err := c.n.cfg.GPU.CopyToHost(host, uintptr(unsafe.Pointer(unsafe.SliceData(p)))); err != nil {
		return &Error{Code: CodeUnavailable, Op: "send", Rank: -1, Msg: fmt.Sprintf("copying %d bytes of device memory to the host: %v", len(p), err), Cause: err}
	}
	return c.n.ep.Send(ctx, w, transport.LaneData, th, host)
}

// ISend starts sending buf to peer with tag. Messages from one rank to
// another with the same tag are received in the order the sends were
// called. The request completes when buf may be reused.
func (c *Comm) ISend(buf []byte, peer int, tag uint64) *Request {
	return c.isend(context.Background(), buf, peer, tag, false).start()
}

// Send sends buf to peer with tag and returns once buf may be reused.
func (c *Comm) Send(ctx context.Context, buf []byte, peer int, tag uint64) error {
	return c.isend(ctx, buf, peer, tag, false).wait()
}

// ISendDevice is ISend of buf in GPU device memory (Config.GPU must be
// set), which no host code reads: the path's channel reads it (the NIC
// itself, by GPUDirect RDMA, where it can) when it moves device memory
// (DevicePath), else it is copied to host memory with Config.GPU first.
// The request completes when buf may be reused. Safe for concurrent use.
func (c *Comm) ISendDevice(buf []byte, peer int, tag uint64) *Request {
	return c.isend(context.Background(), buf, peer, tag, true).start()
}

// SendDevice is Send of buf in GPU device memory (see ISendDevice).
func (c *Comm) SendDevice(ctx context.Context, buf []byte, peer int, tag uint64) error {
	return c.isend(ctx, buf, peer, tag, true).wait()
}

// noGPU refuses a device buffer when no GPU runtime was configured.
func (c *Comm) noGPU(op string) error {
	if c.n.cfg.GPU != nil {
		return nil
	}
	return invalidArg(op, "a device buffer, but the communicator was made without a GPU runtime (Config.GPU)")
}

// DevicePath reports whether a device buffer of a send to peer (send) or
// of a receive from peer (!send; AnySource: from any other member) would
// move between the NIC and device memory: a GPU runtime is configured and
// the path declares (transport.DataPath.DeviceData) that its channel moves
// device memory and that GPUDirect RDMA is not ruled out. Otherwise a
// caller with a better way to stage (pinned memory, its stream) should
// use it. Decided anew at every call: it changes as paths are set up and
// once the NIC refused device memory for good. Safe for concurrent use.
func (c *Comm) DevicePath(peer int, send bool) bool {
	if c.n.cfg.GPU == nil || !c.n.ep.Caps().Device {
		return false
	}
	for r, w := range c.world {
		if w == c.n.rank || (r != peer && (send || peer != AnySource)) {
			continue
		}
		s, rv := c.n.ep.DeviceData(w)
		if send && s || !send && rv {
			return true
		}
	}
	return false
}

func (c *Comm) isend(ctx context.Context, buf []byte, peer int, tag uint64, dev bool) *Request {
	if peer < 0 || peer >= c.size {
		return doneRequest(c, "send", invalidArg("send", "peer %d is out of range [0, %d)", peer, c.size))
	}
	if err := c.noGPU("send"); dev && err != nil {
		return doneRequest(c, "send", err)
	}
	req := newRequest(c, "send", true)
	c.mu.Lock()
	if c.err != nil {
		err := withOp(c.err, "send")
		c.mu.Unlock()
		req.finish(Status{}, err)
		return req
	}
	if err := c.departedLocked("send", peer); err != nil {
		c.mu.Unlock()
		req.finish(Status{}, err)
		return req
	}
	prev := c.sendTail[peer]
	done := make(chan struct{})
	c.sendTail[peer] = done
	c.ops.Add(1)
	req.fr = c.flight.startP2P(flightSend, peer, tag, len(buf))
	c.mu.Unlock()
	req.pendingOp = func() {
		defer c.ops.Done()
		defer close(done)
		ctx, cancel := c.opContext(ctx)
		defer cancel()
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
				req.finish(Status{}, c.opError("send", ctx, ctx.Err()))
				return
			}
		}
		var err error
		if err = c.sendMsg(ctx, peer, header{kind: kindP2P, seqOrTag: tag}, buf, dev); err != nil {
			err = c.opError("send", ctx, err)
		} else {
			c.traffic.sent(len(buf))
		}
		req.finish(Status{Source: c.rank, Tag: tag, Count: len(buf)}, err)
	}
	return req
}

// IRecv posts a receive of a message from peer (or AnySource) with tag into
// buf. Messages are matched in the order they were sent per (source, tag);
// a message longer than buf fills it and fails with CodeTruncated.
func (c *Comm) IRecv(buf []byte, peer int, tag uint64) *Request {
	req, _ := c.irecv(buf, peer, tag, false)
	return req
}

// Recv receives a message from peer (or AnySource) with tag into buf. When
// ctx ends first, the receive is withdrawn and a CodeTimeout error returned.
func (c *Comm) Recv(ctx context.Context, buf []byte, peer int, tag uint64) (Status, error) {
	return c.recv(ctx, buf, peer, tag, false)
}

// IRecvDevice is IRecv into buf in GPU device memory (Config.GPU must be
// set), which no host code writes: a message from a peer whose channel
// moves device memory (DevicePath) is written there by the channel (the
// NIC itself, by GPUDirect RDMA, where it can); one that arrived before
// the receive, or over another path, is copied there from host memory
// with Config.GPU (synchronously, under the communicator's lock). A
// longer message fills buf and fails with CodeTruncated, as IRecv's.
// Safe for concurrent use.
func (c *Comm) IRecvDevice(buf []byte, peer int, tag uint64) *Request {
	req, _ := c.irecv(buf, peer, tag, true)
	return req
}

// RecvDevice is Recv into buf in GPU device memory (see IRecvDevice).
func (c *Comm) RecvDevice(ctx context.Context, buf []byte, peer int, tag uint64) (Status, error) {
	return c.recv(ctx, buf, peer, tag, true)
}

func (c *Comm) recv(ctx context.Context, buf []byte, peer int, tag uint64, dev bool) (Status, error) {
	req, r := c.irecv(buf, peer, tag, dev)
	if r == nil {
		return req.Status(), req.wait()
	}
	ctx, cancel := c.opContext(ctx)
	defer cancel()
	if peer == AnySource || !c.spin(peer, req) {
		defer c.blocking(peer)()
	}
	select {
	case <-req.doneCh():
	case <-req.failedCh():
	case <-ctx.Done():
		c.mu.Lock()
		c.waitFilledLocked(c.match.Cancel(r))
		c.mu.Unlock()
		req.finish(Status{}, c.opError("recv", ctx, ctx.Err()))
	}
	err := req.wait()
	return req.Status(), err
}

func (c *Comm) irecv(buf []byte, peer int, tag uint64, dev bool) (*Request, *match.Recv) {
	if peer != AnySource && (peer < 0 || peer >= c.size) {
		return doneRequest(c, "recv", invalidArg("recv", "peer %d is out of range [0, %d) and not AnySource", peer, c.size)), nil
	}
	if err := c.noGPU("recv"); dev && err != nil {
		return doneRequest(c, "recv", err), nil
	}
	req := newRequest(c, "recv", false)
	req.src = peer
	r := &match.Recv{Src: peer, Tag: tag, Buf: buf, Owner: req}
	if dev {
		r.Put = c.putDevice
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		req.finish(Status{}, withOp(c.err, "recv"))
		return req, nil
	}
	req.fr = c.flight.startP2P(flightRecv, peer, tag, len(buf))
	if matched, held := c.match.TakeUnexpected(r); matched {
		c.n.release(held)
		c.settleLocked()
		return req, r
	}
	if peer != AnySource {
		if err := c.departedLocked("recv", peer); err != nil {
			req.finish(Status{}, err) // what it sent was delivered: nothing will match
			return req, nil
		}
	}
	c.match.Post(r)
	return req, r
}

// putDevice is the Put of a device receive (match.Recv): it copies bytes
// that arrived in host memory into device memory with the GPU runtime,
// synchronously (called under c.mu).
func (c *Comm) putDevice(dst, src []byte) error {
	if err := c.n.cfg.GPU.CopyToDevice(uintptr(unsafe.Pointer(unsafe.SliceData(dst))), src); err != nil {
		return &Error{Code: CodeUnavailable, Op: "recv", Rank: -1, Msg: fmt.Sprintf("copying %d bytes into device memory: %v", len(src), err), Cause: err}
	}
	return nil
}
