package core

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core/internal/match"
	"github.com/nexar-go/nexar/transport"
)

// This file is the link: a communicator as one collective call's schedule
// sees it (collective.Link), with the call's steps scoped by its sequence
// number and every message carrying its signature.

// link adapts a Comm to collective.Link for one call: steps are scoped by
// (communicator id, sequence number) and every message carries the call's
// signature.
type link struct {
	c   *Comm
	seq uint64
	sig signature
	// checked: the ring successor has (or is being sent) this call's
	// signature, by a data message or a ctlSigCheck.
	checked atomic.Bool
	cc      *collCall // owns the transport send contexts (sendCtx)
}

// ringCheck tells the ring successor what this rank called, unless it
// already knows: every rank checks its predecessor's call, so calls whose
// data paths never meet (different roots) still fail instead of hanging.
// It runs before anything that can block, and at the end of the call.
func (l *link) ringCheck() {
	c := l.c
	if c.size == 1 || l.checked.Swap(true) {
		return
	}
	th := c.n.header()
	(&header{kind: kindControl, sub: ctlSigCheck, comm: c.id, seqOrTag: l.seq, sig: l.sig}).encode(th, c.gen)
	// On the data lane: on the fast path (shared memory) it costs a few
	// hundred ns, where the control lane is a QUIC stream.
	_ = c.n.ep.Send(l.sendCtx((c.rank+1)%c.size), c.world[(c.rank+1)%c.size], transport.LaneData, th, nil)
	c.n.putHeader(th)
}

func (l *link) successor() int { return (l.c.rank + 1) % l.c.size }

func (l *link) Rank() int { return l.c.rank }
func (l *link) Size() int { return l.c.size }

// Tuning is the communicator's (Config.Tuning, defaults filled in).
func (l *link) Tuning() *collective.Tuning { return &l.c.cfg.Tuning }

// Scratch is the communicator's scratch pool (collective.ScratchLink).
func (l *link) Scratch() *collective.ScratchPool { return l.c.scratch }

// Prepare hands a buffer the call moves in pieces to the data path's
// memory registration (collective.Preparer; transport.Registrar), which
// registers it whole where its channels register memory (RDMA).
func (l *link) Prepare(b []byte) {
	if r := l.c.n.reg; r != nil {
		r.Prepare(b)
	}
}

func (l *link) Send(ctx context.Context, peer int, step uint32, data []byte) error {
	return l.send(ctx, peer, step, data, nil)
}

// Exchange implements collective.Exchanger: it posts every receive first,
// so that the data lands in buf whoever reads it, then sends in this
// goroutine (while the send waits for room on a shared-memory ring it
// reads from's ring itself, so one goroutine moves both directions), then
// waits for the receives.
func (l *link) Exchange(ctx context.Context, to int, sbase uint32, data []byte, from int, rbase uint32, buf []byte, chunk int) error {
	c := l.c
	if to < 0 || to >= c.size || from < 0 || from >= c.size {
		return fmt.Errorf("collective exchange with ranks %d and %d of %d", to, from, c.size)
	}
	type posted struct {
		key match.Key
		m   *match.Msg
	}
	var ps []posted
	unpost := func() {
		for _, p := range ps {
			c.unpostColl(p.key, p.m)
			c.releaseColl(p.m)
		}
	}
	if to != l.successor() {
		l.ringCheck()
	}
	for i, off := uint32(0), 0; ; i++ {
		end := min(off+chunk, len(buf))
		key := match.Key{Src: from, Seq: l.seq, Step: rbase + i}
		m, err := c.postColl(key, buf[off:end])
		if err != nil {
			unpost()
			return err
		}
		if m != nil {
			ps = append(ps, posted{key, m})
		}
		if off = end; off >= len(buf) {
			break
		}
	}
	var progress func() bool
	stop := func() {}
	var pre polling // the send's poll of from, handed to the first wait
	if len(ps) > 0 && l.sharedMemory(to) {
		if poll, end := c.n.poll.StartPolling(c.world[from]); poll != nil {
			progress, stop = poll, end
			pre = polling{poll, end}
		}
	}
	for i, off := uint32(0), 0; ; i++ {
		end := min(off+chunk, len(data))
		if err := l.send(ctx, to, sbase+i, data[off:end], progress); err != nil {
			stop()
			unpost()
			return err
		}
		if off = end; off >= len(data) {
			break
		}
	}
	for i, p := range ps {
		// The first wait takes the send's poll over and ends it before it
		// blocks (a blocked wait must let the ring's reader work).
		err := c.waitCollPolled(ctx, p.key, p.m, pre)
		pre = polling{}
		if err != nil {
			ps = ps[i+1:]
			unpost()
			return err
		}
	}
	return nil
}

// Stream implements collective.Streamer: a path other than a shared-memory
// ring moves data into a posted buffer without its waiter's help. Either
// answer is safe (the streaming schedule sends the same messages), and it
// may change once a ring is made on first use.
func (l *link) Stream(peer int) bool {
	return peer >= 0 && peer < l.c.size && !l.sharedMemory(peer)
}

// sharedMemory reports whether this rank's data to comm rank peer goes
// over a shared-memory ring (where a send can progress a receive).
func (l *link) sharedMemory(peer int) bool {
	caps := l.c.n.caps
	return caps.Poll && caps.ProgressSend && l.c.n.ep.SharedMemory(l.c.world[peer])
}

func (l *link) send(ctx context.Context, peer int, step uint32, data []byte, progress func() bool) error {
	if peer < 0 || peer >= l.c.size {
		return fmt.Errorf("collective sent to rank %d of %d", peer, l.c.size)
	}
	op := l.sig.kind.String()
	if skip, err := l.c.collSendSkip(peer, l.seq, op); skip || err != nil {
		return err
	}
	if peer != l.successor() || l.checked.Swap(true) {
		l.ringCheck()
	} // else this message, which carries the signature, is the check
	if err := ctx.Err(); err != nil {
		return err // the algorithm gave up: start nothing new
	}
	h := header{kind: kindColl, seqOrTag: l.seq, step: step, sig: l.sig, comm: l.c.id, total: uint64(len(data))}
	var err error
	if progress != nil {
		// One chunk (<= transport.MaxPayload), sent by the caller while
		// it progresses the receive of an exchange.
		th := l.c.n.header()
		h.encode(th, l.c.gen)
		err = l.c.n.ep.SendProgress(l.sendCtx(peer), l.c.world[peer], th, data, progress)
		l.c.n.putHeader(th)
	} else {
		err = l.c.sendChunked(l.sendCtx(peer), peer, h, data)
	}
	if err == nil {
		l.c.traffic.sent(len(data))
	}
	if err != nil && isDeparture(err) {
		if skip, _ := l.c.collSendSkip(peer, l.seq, op); skip {
			return nil
		}
	}
	return err
}

// Post implements collective.Poster: buf is the destination of message
// (peer, step) of this call from now on, whoever reads it; wait waits for
// it (as Recv does) and must be called, once, whatever happens: a wait that
// ends early withdraws the receive, so that buf is not written after it.
func (l *link) Post(ctx context.Context, peer int, step uint32, buf []byte) (wait func() error, err error) {
	if peer < 0 || peer >= l.c.size {
		return nil, fmt.Errorf("collective received from rank %d of %d", peer, l.c.size)
	}
	l.ringCheck()
	key := match.Key{Src: peer, Seq: l.seq, Step: step}
	m, err := l.c.postColl(key, buf)
	if err != nil {
		return nil, err
	}
	if m == nil { // it had arrived whole: it is in buf
		return func() error { return nil }, nil
	}
	return func() error { return l.c.waitColl(ctx, key, m) }, nil
}

func (l *link) Recv(ctx context.Context, peer int, step uint32, buf []byte) error {
	if peer < 0 || peer >= l.c.size {
		return fmt.Errorf("collective received from rank %d of %d", peer, l.c.size)
	}
	l.ringCheck()
	return l.c.recvColl(ctx, peer, l.seq, step, buf)
}

// sendCtx returns the context that bounds transport sends to comm rank
// peer in this call: the call's deadline, and the detector declaring peer
// down. Not the call's own context: an algorithm cancels its sends when a
// receive fails, and a frame cut short would break the connection to a peer
// that may be healthy (e.g. when another member left); the peer drains what
// it gets. A dead peer drains nothing, so its sends end when it is declared
// down, not at the transport's own timeout. Safe for concurrent use.
func (l *link) sendCtx(peer int) context.Context {
	cc, w := l.cc, l.c.world[peer]
	cc.smu.Lock()
	defer cc.smu.Unlock()
	for i := range cc.nsend {
		if cc.sends[i].peer == w {
			return &cc.sends[i]
		}
	}
	for _, s := range cc.more {
		if s.peer == w {
			return s
		}
	}
	var s *deadlineCtx
	if cc.nsend < len(cc.sends) {
		s = &cc.sends[cc.nsend]
		cc.nsend++
	} else if n := len(cc.more); n < cap(cc.more) && cc.more[:n+1][n] != nil {
		cc.more = cc.more[:n+1] // one a recycled call kept
		s = cc.more[n]
	} else {
		s = new(deadlineCtx)
		cc.more = append(cc.more, s)
	}
	s.d, s.peer, s.down = cc.op.d, w, &l.c.n.downSig[w]
	return s
}
