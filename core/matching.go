package core

import (
	"context"
	"fmt"
	"time"

	"github.com/nexar-go/nexar/core/internal/match"
)

// This file drives the communicator's matching engine (core/internal/match)
// from the places events happen: inbound chunks from the transport's
// handler (deliver*) or placed by it straight into a posted buffer
// (place*), receives posted and withdrawn by operations, and the
// completions the engine reports, settled under c.mu (settleLocked).

// settleLocked acts on the engine's completions: it wakes the waiter of a
// collective receive and finishes a point-to-point receive's request.
// Called with c.mu held after every engine call that can complete one.
func (c *Comm) settleLocked() {
	for _, d := range c.match.Ready() {
		if d.Coll != nil {
			d.Coll.Done.Fire()
			continue
		}
		req := d.Recv.Owner.(*Request)
		if d.Err != nil {
			req.finish(Status{}, withOp(d.Err, "recv"))
			continue
		}
		var err error
		if d.Total > len(d.Recv.Buf) {
			err = &Error{Code: CodeTruncated, Op: "recv", Rank: d.Source,
				Msg: fmt.Sprintf("message of %d bytes from rank %d (tag %d) does not fit the %d-byte buffer", d.Total, d.Source, d.Tag, len(d.Recv.Buf))}
		}
		req.finish(Status{Source: d.Source, Tag: d.Tag, Count: d.Count}, err)
	}
}

// collMismatch is the failure of a collective message whose length
// differs from the receive posted for it.
func (c *Comm) collMismatch(mm *match.Mismatch) *Error {
	return &Error{Code: CodeMismatch, Op: "comm", Rank: mm.Src,
		Msg: fmt.Sprintf("rank %d sent %d bytes for step %d of call %d but rank %d expected %d",
			mm.Src, mm.Sent, mm.Step, mm.Seq, c.rank, mm.Want)}
}

// placeEarly is placeColl's and placeP2P's answer for a chunk whose
// receive cannot take it (not posted yet, as a collective's first chunks
// often are when a rank sends before its peer has left the previous
// call, and a send's when it comes before its receive): a buffer of c.early,
// which the engine gives back once it has copied the chunk into its
// receive, so that no call pays for a fresh buffer's zeroing and page
// faults. nil for chunks too small to pool (the Handler takes them).
// Called with c.mu held.
func (c *Comm) placeEarly(src int, h header, size int) ([]byte, func(error)) {
	if poolClass(size) < 0 {
		return nil, nil
	}
	b := c.early.get(size)
	return b, func(err error) {
		if err != nil { // the transport reports the peer down: c fails
			c.early.put(b)
			return
		}
		c.deliverData(src, h, b, false, true)
	}
}

// deliverData hands one inbound chunk of a collective or point-to-point
// message from src to the engine, waiting for room in the node's buffer
// budget when it must be held (pre: its bytes are already accounted;
// pooled: payload is c.early's, which the engine gives back).
func (c *Comm) deliverData(src int, h header, payload []byte, pre, pooled bool) {
	n := int64(len(payload))
	c.traffic.bytesRecv.Add(n)
	room := c.n.tryAcquire
	if pre {
		room = func(int64) bool { return true }
	}
	coll := h.kind == kindColl
	w := freedWaiter{n: c.n}
	defer w.end()
	for {
		c.mu.Lock()
		if coll {
			c.checkSigLocked(src, h.seqOrTag, h.sig) // may fail c
		}
		if c.err != nil || (coll && h.seqOrTag >= c.collLimit) { // no receive will come
			c.mu.Unlock()
			if pre {
				c.n.release(n)
			}
			return
		}
		var out match.Outcome
		var mm *match.Mismatch
		switch {
		case coll && pooled:
			out, mm = c.match.DeliverCollPooled(match.Key{Src: src, Seq: h.seqOrTag, Step: h.step}, int(h.total), payload, room)
		case coll:
			out, mm = c.match.DeliverColl(match.Key{Src: src, Seq: h.seqOrTag, Step: h.step}, int(h.total), payload, room)
		case pooled:
			out = c.match.DeliverP2PPooled(src, h.seqOrTag, int(h.total), payload, room)
		default:
			out = c.match.DeliverP2P(src, h.seqOrTag, int(h.total), payload, room)
		}
		c.settleLocked()
		if mm != nil {
			c.failAndTellLocked(c.collMismatch(mm))
		}
		c.mu.Unlock()
		switch out {
		case match.NoRoom: // never when pre
			if !w.wait(c.failed) {
				return
			}
			continue
		case match.Copied, match.Mismatched:
			if pre {
				c.n.release(n)
			}
		}
		return
	}
}

// recvColl receives the collective message (src, seq, step) into buf.
func (c *Comm) recvColl(ctx context.Context, src int, seq uint64, step uint32, buf []byte) error {
	key := match.Key{Src: src, Seq: seq, Step: step}
	m, err := c.postColl(key, buf)
	if err != nil || m == nil {
		return err
	}
	return c.waitColl(ctx, key, m)
}

// postColl makes buf the destination of collective message key. It returns
// the message to wait for, or nil when it had already arrived whole (and
// is now in buf).
func (c *Comm) postColl(key match.Key, buf []byte) (*match.Msg, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	if !c.match.Arrived(key) {
		err := c.departedLocked("comm", key.Src)
		if err == nil {
			err = c.collDepartedLocked("comm", key.Seq)
		}
		if err != nil {
			return nil, err
		}
	}
	m, held, mm := c.match.PostColl(key, buf)
	if mm != nil {
		e := c.collMismatch(mm)
		c.failAndTellLocked(e)
		return nil, e
	}
	c.n.release(held)
	return m, nil
}

// waitColl waits for the posted message m (key) to complete. When it gives
// up (ctx, failure) it withdraws the receive, so that buf is not written
// after it returns.
//
// m is released to the engine when it returns: the caller must not use it.
func (c *Comm) waitColl(ctx context.Context, key match.Key, m *match.Msg) error {
	return c.waitCollPolled(ctx, key, m, polling{})
}

// waitCollPolled is waitColl, whose spin takes over pre, a poll of
// key.Src's ring already begun (zero: none); pre ends before it blocks.
func (c *Comm) waitCollPolled(ctx context.Context, key match.Key, m *match.Msg, pre polling) error {
	if c.spinPolled(key.Src, postedDone{m}, pre) || c.await(ctx, key.Src, postedDone{m}) {
		err := m.Err
		c.releaseColl(m)
		return err
	}
	done := c.blocking(key.Src)
	select {
	case <-m.Done.C():
		err := m.Err
		done()
		c.releaseColl(m)
		return err
	case <-c.failed:
	case <-ctx.Done():
	}
	done()
	c.unpostColl(key, m)
	select {
	case <-m.Done.C():
		err := m.Err
		c.releaseColl(m)
		return err
	default:
	}
	c.releaseColl(m)
	if err := c.Err(); err != nil {
		return err
	}
	return &awaitedError{src: key.Src, seq: key.Seq, step: key.Step, err: ctx.Err()}
}

// awaitedError is a collective receive that gave up (ctx's error, which it
// wraps): it names the message it waited for, so that a timeout says whom
// the call was waiting on (timeoutError).
type awaitedError struct {
	src  int // comm rank
	seq  uint64
	step uint32
	err  error
}

func (e *awaitedError) Error() string {
	return fmt.Sprintf("waiting for rank %d's message (collective %d, step %d): %v", e.src, e.seq, e.step, e.err)
}

func (e *awaitedError) Unwrap() error { return e.err }

// unpostColl withdraws a posted receive, waiting for a placed chunk in
// flight to land first (cutFill bounds that wait).
func (c *Comm) unpostColl(key match.Key, m *match.Msg) {
	c.cutFill(key.Src, m)
	c.mu.Lock()
	c.waitFilledLocked(m)
	c.match.UnpostColl(key, m)
	c.mu.Unlock()
}

// placeColl places a chunk of collective message (src, seq, step) whose
// receive is posted. Anything unusual (a size mismatch to report, a failed
// communicator) takes the Handler's path.
func (c *Comm) placeColl(src int, h header, size int) ([]byte, func(error)) {
	key := match.Key{Src: src, Seq: h.seqOrTag, Step: h.step}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkSigLocked(src, h.seqOrTag, h.sig)
	if c.err != nil || h.seqOrTag >= c.collLimit {
		return nil, nil
	}
	m, dst, whole := c.match.PlaceColl(key, int(h.total), size)
	if m == nil {
		return c.placeEarly(src, h, size)
	}
	c.traffic.bytesRecv.Add(int64(size))
	if whole {
		// The engine forgot m: its completion is ours, without c.mu.
		// Done fires before the fill ends, so that a waiter that gives
		// up (unpostColl) finds it fired once the fill is over, and the
		// waiter that sees it fire waits for the end (releaseColl)
		// before m is reused; m is not touched after EndFill.
		if m.FillWhole == nil { // made once per Msg, which the engine reuses
			m.FillWhole = func(err error) {
				if err == nil { // else the transport reports the peer down: c fails
					m.Done.Fire()
				}
				m.EndFill()
				if c.fillWaiters.Load() > 0 {
					c.mu.Lock()
					c.filled.Broadcast()
					c.mu.Unlock()
				}
			}
		}
		return dst, m.FillWhole
	}
	m.FillSize = size
	if m.Fill == nil { // made once per Msg, which the engine reuses
		m.Fill = func(err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.match.FilledColl(m.Key(), m, m.FillSize, err == nil) // on error the transport reports the peer down: c fails
			c.settleLocked()
			c.filled.Broadcast()
		}
	}
	return dst, m.Fill
}

// placeP2P places a chunk of a point-to-point message from src when a
// matching receive is posted (or the message already matched one).
func (c *Comm) placeP2P(src int, h header, size int) ([]byte, func(error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, nil
	}
	m, dst := c.match.PlaceP2P(src, h.seqOrTag, int(h.total), size, c.deviceIn)
	if m == nil {
		return c.placeEarly(src, h, size)
	}
	c.traffic.bytesRecv.Add(int64(size))
	return dst, func(err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.match.FilledP2P(src, m, size, err == nil)
		c.settleLocked()
		c.filled.Broadcast()
	}
}

// deviceIn reports whether the channel from comm rank src writes device
// memory itself (a device receive may then be placed there). The path
// answers without a lock of its own.
func (c *Comm) deviceIn(src int) bool {
	_, in := c.n.ep.DeviceData(c.world[src])
	return in
}

// waitFilledLocked waits, with c.mu held, until the transport has finished
// writing into m's buffer, so that a receive given up on no longer has its
// buffer written behind the caller's back.
func (c *Comm) waitFilledLocked(m *match.Msg) {
	if !m.Filling() {
		return
	}
	// A fill that ends without c.mu (placed whole) broadcasts only while
	// someone is counted here: counted before Filling is read again, so
	// either this sees the end or that fill sees the count.
	c.fillWaiters.Add(1)
	for m.Filling() {
		c.filled.Wait()
	}
	c.fillWaiters.Add(-1)
}

// cutFill ends the wait for a chunk in flight into m from comm rank src
// that its receiver gave up on (its deadline passed, or c failed). A peer
// that is talking finishes its frame; one that the detector reports
// stalled (its process known to run, silent: never declared dead
// for that) may never, and its stream cannot carry on from the middle of a
// frame. So such a peer is declared unreachable, which closes its
// connections and ends the fill with an error, as a send cut mid-frame
// does: otherwise the call would outlive its deadline.
func (c *Comm) cutFill(src int, m *match.Msg) {
	if src < 0 || src >= len(c.world) {
		return
	}
	w := c.world[src]
	for m.Filling() {
		if c.n.quiet[w].Load() != 0 {
			c.n.peerDown(w, "deadline exceeded while its message was arriving: it is stalled mid-frame, so its stream was cut", nil)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// releaseColl gives a posted collective message back to the engine once
// its receive is over, after the write that completed it has ended (a
// message placed whole fires Done just before its fill ends).
func (c *Comm) releaseColl(m *match.Msg) {
	for m.Filling() {
		osYield()
	}
	c.match.Release(m)
}
