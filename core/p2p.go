package core

import (
	"context"
	"errors"
	"fmt"
	"time"

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
		r := c.of[pd.Peer]
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
		return &Error{Code: CodeTimeout, Op: op, Rank: -1, Msg: "Timed out before the operation completed (deadline exceeded)", Cause: err}
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
		if err := c.n.ep.Send(ctx, w, transport.LaneData, th, data[off:end]); err != nil {
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

// ISend starts sending buf to peer with tag. Messages from one rank to
// another with the same tag are received in the order the sends were
// called. The request completes when buf may be reused.
func (c *Comm) ISend(buf []byte, peer int, tag uint64) *Request {
	return c.isend(context.Background(), buf, peer, tag).start()
}

// Send sends buf to peer with tag and returns once buf may be reused.
func (c *Comm) Send(ctx context.Context, buf []byte, peer int, tag uint64) error {
	return c.isend(ctx, buf, peer, tag).wait()
}

func (c *Comm) isend(ctx context.Context, buf []byte, peer int, tag uint64) *Request {
	if peer < 0 || peer >= c.size {
		return doneRequest(c, "send", invalidArg("send", "peer %d is out of range [0, %d)", peer, c.size))
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
	req.run = func() {
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
		if err = c.sendChunked(ctx, peer, header{kind: kindP2P, seqOrTag: tag}, buf); err != nil {
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
	req, _ := c.irecv(buf, peer, tag)
	return req
}

// Recv receives a message from peer (or AnySource) with tag into buf. When
// ctx ends first, the receive is withdrawn and a CodeTimeout error returned.
func (c *Comm) Recv(ctx context.Context, buf []byte, peer int, tag uint64) (Status, error) {
	req, r := c.irecv(buf, peer, tag)
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

func (c *Comm) irecv(buf []byte, peer int, tag uint64) (*Request, *match.Recv) {
	if peer != AnySource && (peer < 0 || peer >= c.size) {
		return doneRequest(c, "recv", invalidArg("recv", "peer %d is out of range [0, %d) and not AnySource", peer, c.size)), nil
	}
	req := newRequest(c, "recv", false)
	req.src = peer
	r := &match.Recv{Src: peer, Tag: tag, Buf: buf, Owner: req}
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
