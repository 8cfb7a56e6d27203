package core

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	var th transport.Header
	h.encode(&th)
	w := c.world[peer]
	if len(data) == 0 {
		return c.n.ep.Send(ctx, w, transport.LaneData, &th, nil)
	}
	for off := 0; off < len(data); off += transport.MaxPayload {
		end := min(off+transport.MaxPayload, len(data))
		if err := c.n.ep.Send(ctx, w, transport.LaneData, &th, data[off:end]); err != nil {
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
	if peer == AnySource || !c.spin(peer, req.done) {
		defer c.blocking(peer)()
	}
	select {
	case <-req.done:
	case <-req.failedCh():
	case <-ctx.Done():
		c.mu.Lock()
		for i, p := range c.posted {
			if p == r {
				c.posted = append(c.posted[:i], c.posted[i+1:]...)
				break
			}
		}
		r.cancel = true
		c.waitFilledLocked(r.msg)
		c.mu.Unlock()
		req.finish(Status{}, c.opError("recv", ctx, ctx.Err()))
	}
	err := req.wait()
	return req.Status(), err
}

func (c *Comm) irecv(buf []byte, peer int, tag uint64) (*Request, *p2pRecv) {
	if peer != AnySource && (peer < 0 || peer >= c.size) {
		return doneRequest(c, "recv", invalidArg("recv", "peer %d is out of range [0, %d) and not AnySource", peer, c.size)), nil
	}
	req := newRequest(c, "recv", false)
	req.src = peer
	r := &p2pRecv{src: peer, tag: tag, buf: buf, req: req}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		req.finish(Status{}, withOp(c.err, "recv"))
		return req, nil
	}
	for i, m := range c.unexpected {
		if (peer == AnySource || peer == m.src) && tag == m.tag {
			c.unexpected = append(c.unexpected[:i], c.unexpected[i+1:]...)
			m.recv, r.msg = r, m
			off := 0
			for _, ch := range m.chunks {
				if off < len(buf) {
					copy(buf[off:], ch)
				}
				off += len(ch)
			}
			held := m.held
			m.chunks, m.held = nil, 0
			c.n.release(held)
			if m.complete {
				c.completeRecvLocked(m)
			}
			return req, r
		}
	}
	if peer != AnySource {
		if err := c.departedLocked("recv", peer); err != nil {
			req.finish(Status{}, err) // what it sent was delivered: nothing will match
			return req, nil
		}
	}
	c.posted = append(c.posted, r)
	return req, r
}

func (c *Comm) completeRecvLocked(m *inMsg) {
	r := m.recv
	if r.cancel {
		return
	}
	st := Status{Source: m.src, Tag: m.tag, Count: min(m.total, len(r.buf))}
	var err error
	if m.total > len(r.buf) {
		err = &Error{Code: CodeTruncated, Op: "recv", Rank: m.src,
			Msg: fmt.Sprintf("message of %d bytes from rank %d (tag %d) does not fit the %d-byte buffer", m.total, m.src, m.tag, len(r.buf))}
	}
	r.req.finish(st, err)
}

// deliverP2P takes one chunk of a point-to-point message from src.
func (c *Comm) deliverP2P(src int, h header, payload []byte, pre bool) {
	n := int64(len(payload))
	for {
		freed := c.n.freedCh()
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			if pre {
				c.n.release(n)
			}
			return
		}
		m := c.cur[src]
		if m == nil {
			m = &inMsg{src: src, tag: h.seqOrTag, total: int(h.total)}
			for i, r := range c.posted {
				if (r.src == AnySource || r.src == src) && r.tag == m.tag {
					c.posted = append(c.posted[:i], c.posted[i+1:]...)
					m.recv, r.msg = r, m
					break
				}
			}
			if m.recv == nil {
				c.unexpected = append(c.unexpected, m)
			}
			c.cur[src] = m
		}
		if m.recv != nil {
			if !m.recv.cancel && m.got < len(m.recv.buf) {
				copy(m.recv.buf[m.got:], payload)
			}
			if pre {
				c.n.release(n)
			}
		} else {
			if !pre && !c.n.tryAcquire(n) {
				c.mu.Unlock()
				select {
				case <-freed:
				case <-c.failed:
				case <-c.n.done:
				}
				continue
			}
			m.chunks = append(m.chunks, payload)
			m.held += n
		}
		m.got += len(payload)
		if m.got >= m.total {
			c.cur[src] = nil
			if m.recv != nil {
				c.completeRecvLocked(m)
			} else {
				m.complete = true
			}
		}
		c.mu.Unlock()
		return
	}
}

// deliverColl takes one chunk of a collective message from src.
func (c *Comm) deliverColl(src int, h header, payload []byte, pre bool) {
	n := int64(len(payload))
	key := collKey{src: src, seq: h.seqOrTag, step: h.step}
	for {
		freed := c.n.freedCh()
		c.mu.Lock()
		c.checkSigLocked(src, h.seqOrTag, h.sig)
		if c.err != nil || h.seqOrTag >= c.collLimit { // no receive will come
			c.mu.Unlock()
			if pre {
				c.n.release(n)
			}
			return
		}
		m := c.coll[key]
		if m != nil && m.buf != nil {
			if m.total < 0 {
				m.total = int(h.total)
				if m.total != len(m.buf) {
					c.failAndTellLocked(&Error{Code: CodeMismatch, Op: "comm", Rank: src,
						Msg: fmt.Sprintf("rank %d sent %d bytes for step %d of call %d but rank %d expected %d",
							src, m.total, h.step, h.seqOrTag, c.rank, len(m.buf))})
					c.mu.Unlock()
					if pre {
						c.n.release(n)
					}
					return
				}
			}
			copy(m.buf[m.got:], payload)
			m.got += len(payload)
			if m.got >= m.total {
				delete(c.coll, key)
				close(m.done)
			}
			c.mu.Unlock()
			if pre {
				c.n.release(n)
			}
			return
		}
		if !pre && !c.n.tryAcquire(n) {
			c.mu.Unlock()
			select {
			case <-freed:
			case <-c.failed:
			case <-c.n.done:
			}
			continue
		}
		if m == nil {
			m = &inMsg{src: src, total: int(h.total)}
			c.coll[key] = m
		}
		m.chunks = append(m.chunks, payload)
		m.held += n
		m.got += len(payload)
		c.mu.Unlock()
		return
	}
}

// recvColl receives the collective message (src, seq, step) into buf.
func (c *Comm) recvColl(ctx context.Context, src int, seq uint64, step uint32, buf []byte) error {
	key := collKey{src: src, seq: seq, step: step}
	m, err := c.postColl(key, buf)
	if err != nil || m == nil {
		return err
	}
	return c.waitColl(ctx, key, m)
}

// postColl makes buf the destination of collective message key. It returns
// the message to wait for, or nil when it had already arrived whole (and
// is now in buf).
func (c *Comm) postColl(key collKey, buf []byte) (*inMsg, error) {
	if buf == nil {
		// A posted receive is one whose buf is not nil (deliverColl,
		// placeColl): an empty one must still count as posted.
		buf = []byte{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	m := c.coll[key]
	if m == nil {
		err := c.departedLocked("comm", key.src)
		if err == nil {
			err = c.collDepartedLocked("comm", key.seq)
		}
		if err != nil {
			return nil, err
		}
		m = &inMsg{src: key.src, total: -1, buf: buf, done: make(chan struct{})}
		c.coll[key] = m
		return m, nil
	}
	if m.total != len(buf) {
		e := &Error{Code: CodeMismatch, Op: "comm", Rank: key.src,
			Msg: fmt.Sprintf("rank %d sent %d bytes for step %d of call %d but rank %d expected %d",
				key.src, m.total, key.step, key.seq, c.rank, len(buf))}
		c.failAndTellLocked(e)
		return nil, e
	}
	off := 0
	for _, ch := range m.chunks {
		copy(buf[off:], ch)
		off += len(ch)
	}
	held := m.held
	m.chunks, m.held, m.buf = nil, 0, buf
	m.done = make(chan struct{})
	c.n.release(held)
	if m.got >= m.total {
		delete(c.coll, key)
		return nil, nil
	}
	return m, nil
}

// waitColl waits for the posted message m (key) to complete. When it gives
// up (ctx, failure) it withdraws the receive, so that buf is not written
// after it returns.
func (c *Comm) waitColl(ctx context.Context, key collKey, m *inMsg) error {
	if c.spin(key.src, m.done) {
		return m.err
	}
	defer c.blocking(key.src)()
	select {
	case <-m.done:
		return m.err
	case <-c.failed:
	case <-ctx.Done():
	}
	c.unpostColl(key, m)
	select {
	case <-m.done:
		return m.err
	default:
	}
	if err := c.Err(); err != nil {
		return err
	}
	return ctx.Err()
}

// unpostColl withdraws a posted receive, waiting for a placed chunk in
// flight to land first.
func (c *Comm) unpostColl(key collKey, m *inMsg) {
	c.mu.Lock()
	c.waitFilledLocked(m)
	if c.coll[key] == m {
		delete(c.coll, key)
	}
	c.mu.Unlock()
}
