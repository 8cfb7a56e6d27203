package bulk

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// This file is the negotiation's IO: the control lane in and out, and the
// actions the negotiator (negotiate.go) asks for, whose outcomes go back
// to it as events.

func (e *Endpoint) sendCtl(ctx context.Context, peer int, m message) error {
	b, err := encodeCtl(m)
	if err != nil {
		return err
	}
	var h transport.Header
	h[0] = ctlMagic
	return e.inner.Send(ctx, peer, transport.LaneControl, &h, b)
}

// handle takes the negotiation messages off the control lane and passes
// everything else up.
func (e *Endpoint) handle(from int, lane transport.Lane, h *transport.Header, p []byte) {
	if lane != transport.LaneControl || h == nil || h[0] != ctlMagic {
		if e.h != nil {
			e.h(from, lane, h, p)
		}
		return
	}
	if from < 0 || from >= e.size || from == e.self {
		e.log.Warn("nexar: bulk: dropping a negotiation message from an unknown rank", "rank", e.self, "from", from)
		return
	}
	m, err := decodeCtl(p)
	if err != nil {
		e.log.Warn("nexar: bulk: dropping malformed negotiation message", "rank", e.self, "from", from, "err", err)
		return
	}
	// In the handler, in order: a peer's process is known before its
	// offer is acted on (Start then returns knowing every local peer),
	// and its bye before its exit.
	switch m := m.(type) {
	case helloMsg:
		e.notePeerProc(from, m.Proc)
	case offerMsg:
		if !m.RPC {
			e.notePeerProc(from, m.Proc)
		}
	case byeMsg:
		e.peerBye(from)
		return
	case byeAckMsg:
		e.settle(from)
		return
	}
	e.afterStart(func() { e.negotiate(e.ctx, evRecv{from, m}) })
}

// afterStart runs f in a goroutine of e once Start has run, unless e
// closes first; nothing when e takes no more control work (accepting off).
func (e *Endpoint) afterStart(f func()) {
	e.mu.Lock()
	if !e.accepting {
		e.mu.Unlock()
		return
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		select {
		case <-e.started:
		case <-e.ctx.Done():
			return
		}
		f()
	}()
}

// negotiate steps the negotiator with ev, applies its bookkeeping under
// e.mu and then performs the rest in order, each outcome a further step.
// The messages are sent on ctx; it returns the first send's error.
func (e *Endpoint) negotiate(ctx context.Context, ev event) error {
	e.mu.Lock()
	acts := e.neg.step(ev)
	for _, a := range acts {
		e.applyLocked(a)
	}
	e.mu.Unlock()
	var first error
	for _, a := range acts {
		if err := e.perform(ctx, a); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// applyLocked applies a bookkeeping action. Called with e.mu held.
func (e *Endpoint) applyLocked(a action) {
	switch a := a.(type) {
	case actInstall:
		ch := a.ch
		if ch != nil && (e.closed.Load() || e.downed[a.peer].Load()) {
			discard(ch) // too late: nothing would close it
			ch = nil
		}
		if a.rpc {
			e.installRPC(a.peer, ch)
		} else {
			e.installLocked(a.peer, ch, a.lazy)
		}
	case actDiscard:
		discard(a.ch)
	case actLater:
		e.lazy[a.peer].Store(true)
		e.paths[a.peer] = "shm ring on first use"
	case actReady:
		close(e.ready)
	}
}

// installLocked fixes the outbound data path to peer (ch nil: the inner
// endpoint); lazy: wake the sends waiting for it.
func (e *Endpoint) installLocked(peer int, ch any, lazy bool) {
	if c, ok := ch.(*channel); ok {
		e.out[peer].Store(c)
		e.paths[peer] = c.desc
	} else if lazy {
		e.paths[peer] = "quic"
	}
	if lazy {
		e.lazy[peer].Store(false)
		if e.waits[peer] == nil {
			e.waits[peer] = make(chan struct{})
		}
		close(e.waits[peer])
	}
}

// installRPC fixes the outbound RPC path to peer (ch nil: the inner
// endpoint) and wakes the calls waiting for it.
func (e *Endpoint) installRPC(peer int, ch any) {
	s := e.rpc
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := ch.(*rpcChan); ok {
		s.out[peer].Store(c)
		s.outs = append(s.outs, c)
		s.paths[peer] = c.desc
	}
	if s.waits[peer] == nil {
		s.waits[peer] = make(chan struct{})
	}
	close(s.waits[peer])
}

// discard closes a channel made for nothing, quietly.
func discard(ch any) {
	switch c := ch.(type) {
	case *channel:
		c.quiet.Store(true)
		c.close()
	case *rpcChan:
		c.quiet.Store(true)
		c.close()
	}
}

// perform carries out an IO action (bookkeeping ones were applied) and
// feeds its outcome back. It returns a send's error.
func (e *Endpoint) perform(ctx context.Context, a action) error {
	switch a := a.(type) {
	case actSend:
		err := e.sendCtl(ctx, a.to, a.m)
		if t := a.m.msgType(); err != nil && (t == msgWant || t == msgRPCWant) {
			e.negotiate(e.ctx, evSendFailed{a.to, t})
		}
		return err
	case actMakeRing:
		if a.rpc {
			e.negotiate(e.ctx, e.makeRPCRing(a.peer))
		} else {
			e.negotiate(e.ctx, e.makeRing(a.peer, a.size))
		}
	case actListenRDMA:
		if ev, ok := e.listenRDMA(a.peer); ok {
			e.negotiate(e.ctx, ev)
		}
	case actArmTCP:
		e.negotiate(e.ctx, e.armTCP(a.peer, a.rpc, a.conns))
	case actOpenRing:
		e.negotiate(e.ctx, e.attachRing(a.peer, a.rpc, a.ring))
	case actDial:
		e.negotiate(e.ctx, e.dialChannel(a.peer, a.rpc, a.dial))
	case actDialRDMA:
		e.negotiate(e.ctx, e.dialRDMA(a.peer, a.qp))
	case actAcceptRDMA:
		e.acceptRDMA(a.peer, a.qp)
	case actTestRemote:
		e.testRemote(a.peer, a.rpc, a.probe)
	case actDropInbound:
		e.dropInbound(a.peer, a.rpc, a.kind)
	case actUnlinkBell:
		s := e.rpc
		s.mu.Lock()
		if ch := s.in[a.peer]; ch != nil && ch.b != nil {
			ch.b.unlink() // the producer has it open, or never will
		}
		s.mu.Unlock()
	case actInstall:
		if c, ok := a.ch.(*channel); ok && !a.rpc {
			if end, ok := rdmaChannel(c); ok {
				e.watchRDMA(a.peer, c, end)
			}
		}
	case actTimer:
		time.AfterFunc(rpcConnectTimeout, func() {
			if !e.closed.Load() {
				e.negotiate(e.ctx, evRPCTimeout{a.peer})
			}
		})
	case actNote:
		if a.warn {
			e.log.Warn("nexar: bulk: "+a.why, "rank", e.self, "peer", a.peer)
		} else {
			e.log.Debug("nexar: bulk: "+a.why, "rank", e.self, "peer", a.peer)
		}
	}
	return nil
}

// makeRing makes the data ring from peer (about want bytes, from the
// budget) and starts reading it.
func (e *Endpoint) makeRing(from, want int) evRingMade {
	ev := evRingMade{peer: from}
	size := e.chargeRing(want)
	if size == 0 {
		ev.err = fmt.Errorf("the budget of %d MiB for rings is spent", e.opt.RingBudget>>20)
		return ev
	}
	r, path, cookie, err := createRing(size)
	if err != nil {
		e.refundRing(size)
		ev.err = err
		return ev
	}
	e.addRing(r)
	e.pres.add(r) // this process's presence, for the peer (presence.go)
	e.startReader(from, newChannel(from, ringDesc(size), []link{ringLink{r}}))
	ev.ring = ringSpec{Path: path, Cookie: cookie, Size: size}
	return ev
}

// makeRPCRing makes the RPC ring from peer and its doorbell, from the
// RPC allowance, and starts reading it.
func (e *Endpoint) makeRPCRing(from int) evRingMade {
	ev := evRingMade{peer: from, rpc: true}
	size := e.chargeRPCRing()
	if size == 0 {
		ev.err = fmt.Errorf("the allowance of %d KiB for RPC rings is spent", e.opt.RingBudget/4>>10)
		return ev
	}
	r, path, cookie, err := createRing(size)
	if err == nil {
		var b *bell
		if b, err = createBell(path); err == nil {
			e.addRing(r)
			e.startRPCReader(from, newRPCRing(from, size, r, b))
			ev.ring = ringSpec{Path: path, Cookie: cookie, Size: size, Bell: b.path}
			return ev
		}
		r.Close()
		r.release()
	}
	e.refundRPCRing(size)
	ev.err = err
	return ev
}

// armTCP arms a TCP offer to peer: the listener, bound on first use, and
// a one-time nonce its connections must prove they know.
func (e *Endpoint) armTCP(from int, rpc bool, conns int) evTCPArmed {
	ev := evTCPArmed{peer: from, rpc: rpc}
	ln := e.listener()
	if ln == nil {
		ev.err = errors.New("no TCP listener")
		return ev
	}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	off := &tcpOffer{nonce: nonce, conns: make([]net.Conn, conns), raws: make([]net.Conn, conns)}
	mu, offers := &e.mu, &e.offers
	if rpc {
		mu, offers = &e.rpc.mu, &e.rpc.offers
	}
	mu.Lock()
	if *offers != nil {
		(*offers)[from] = off
	}
	mu.Unlock()
	port := ln.Addr().(*net.TCPAddr).Port
	ev.dial = dialSpec{Addr: net.JoinHostPort(e.opt.AdvertiseHost, fmt.Sprint(port)), Nonce: nonce, Conns: conns, TLS: !e.opt.Plaintext}
	return ev
}

// attachRing opens the ring peer to offered (rpc: and its doorbell).
func (e *Endpoint) attachRing(to int, rpc bool, spec ringSpec) evAttached {
	ev := evAttached{peer: to, rpc: rpc, kind: pathSHM}
	r, err := openRing(spec.Path, spec.Size, spec.Cookie)
	var b *bell
	if err == nil && rpc {
		if b, err = openBell(spec.Bell); err != nil {
			r.Close()
			r.release()
		}
	}
	if err != nil {
		ev.err = err
		return ev
	}
	e.addRing(r)
	if rpc {
		ch := newRPCRing(to, spec.Size, r, b)
		ch.remoteMin = rpcRemoteMin(e.opt.RemoteMin)
		ev.ch = ch
		return ev
	}
	ch := newChannel(to, ringDesc(spec.Size), []link{ringLink{r}})
	ch.remoteMin = max(e.opt.RemoteMin, 0)
	ev.ch = ch
	return ev
}

// dialChannel dials the TCP offer of peer to.
func (e *Endpoint) dialChannel(to int, rpc bool, d dialSpec) evAttached {
	ev := evAttached{peer: to, rpc: rpc, kind: pathTCP}
	magic := "NXB1"
	if rpc {
		magic = rpcMagic
	}
	links, err := e.dialTCP(e.ctx, to, d.Addr, d.Nonce, d.Conns, d.TLS, magic)
	switch {
	case err != nil:
		ev.err = err
	case rpc:
		ev.ch = newRPCChan(to, "rpc "+e.tcpDesc(links), links[0])
	default:
		ev.ch = newChannel(to, e.tcpDesc(links), links)
	}
	return ev
}

// testRemote tests, on the receiving side of a ring, whether this process
// may copy straight out of the sender's memory (it reads the probe the
// sender named), and if so tells the ring, which lets the sender use
// remote frames.
func (e *Endpoint) testRemote(from int, rpc bool, p probe) {
	var r *ring
	var pid *atomic.Int64
	if rpc {
		e.rpc.mu.Lock()
		if ch := e.rpc.in[from]; ch != nil && ch.r != nil {
			r, pid = ch.r, &ch.remotePID
		}
		e.rpc.mu.Unlock()
	} else {
		e.mu.Lock()
		if ch := e.in[from]; ch != nil && ch.ring != nil {
			r, pid = ch.ring, &ch.remotePID
		}
		e.mu.Unlock()
	}
	if r == nil {
		return
	}
	got := make([]byte, len(p.Data))
	if err := readRemote(p.PID, p.Addr, got); err != nil || !bytes.Equal(got, p.Data) {
		e.log.Debug("nexar: bulk: no cross-memory attach; payloads go through the ring", "rank", e.self, "peer", from, "rpc", rpc, "err", err)
		return
	}
	pid.Store(int64(p.PID))
	r.setRemoteOK()
	e.log.Debug("nexar: bulk: cross-memory attach from peer", "rank", e.self, "peer", from, "rpc", rpc)
}

// dropInbound closes what this rank offered peer that peer did not take:
// a ring it could not open, an RDMA end it could not connect to.
func (e *Endpoint) dropInbound(from int, rpc bool, kind pathKind) {
	switch {
	case rpc:
		s := e.rpc
		s.mu.Lock()
		ch := s.in[from]
		s.in[from] = nil
		s.mu.Unlock()
		if ch != nil {
			discard(ch)
		}
	case kind == pathRDMA:
		e.mu.Lock()
		end := e.rdmaPending[from]
		delete(e.rdmaPending, from)
		e.mu.Unlock()
		if end != nil {
			end.Close()
		}
	default:
		e.mu.Lock()
		ch := e.in[from]
		e.in[from] = nil
		e.mu.Unlock()
		if ch != nil {
			discard(ch)
		}
	}
}
