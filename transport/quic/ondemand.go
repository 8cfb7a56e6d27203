package quictransport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
)

// Connections on demand (Options.OnDemand = M, docs/scale.md). Connect
// dials nobody; a Send to a rank without a connection dials it (either rank
// of a pair may), and a rank holds at most M connections: the registered
// ones plus the dials it has under way. To open one more it closes the one
// least recently used (a hashicorp/golang-lru list, touched by every Send
// and, at most every touchEvery, by what arrives), and an incoming one
// finds no room is refused (the dialer tries again) while that close runs.
//
// Closing a pair's connection loses and reorders nothing. The lower rank of
// the pair closes (the higher one asks it to with an evict frame): it waits
// for its sends under way, ends every lane with a goodbye, and keeps
// reading; the higher rank, once it has read the goodbye of every lane,
// does the same; the lower rank, once it has read the higher's, closes the
// connection (code drained). By then each side has delivered everything
// the other sent on it, so the next connection of the pair, which either
// side dials only once its view of the old one has ended, needs no order
// with it. A connection is never replaced while the other side may still
// send on it: a second one for a pair is refused at its hello, but the
// lower rank's dial where the two dial each other at once and neither
// connection is there yet (the lower rank refuses the higher's from the
// moment it chose to dial).
//
// Failures: a connection that ends any other way is a loss, reported to the
// DownHandler as in the full mesh; a rank that cannot be reached within
// Options.DialTimeout is reported down too, and is not dialled again. A
// closed connection is not a failure, and nothing watches a rank without
// one: a rank that died meanwhile is found at the next dial. A departure
// (Close) is said on the connections open then (an odDepart frame before
// the goodbyes); a rank that had none to the departed learns nothing until
// it dials it, and is then told it is unreachable.

// ownerOnDemand is header byte 0 of the frames this transport sends for
// itself on the control lane of an on-demand connection (never delivered).
const ownerOnDemand = transport.OwnerTransport | 0x51

// Their header byte 1.
const (
	odEvict  = 1 // the higher rank of the pair asks the lower to close the connection
	odDepart = 2 // the sender closes its endpoint: the goodbyes that follow are a departure
)

// touchEvery bounds how often what arrives on a connection moves it to the
// front of the least-recently-used list (which takes the endpoint's lock).
const touchEvery = 50 * time.Millisecond

// errBusy refuses an incoming connection while the endpoint has no room.
var errBusy = errors.New("quic: no room for another connection yet (on demand)")

// onDemand is an endpoint's on-demand state, under endpoint.mu.
type onDemand struct {
	max      int
	lru      *simplelru.LRU[int, *peerConn] // usable connections by peer, least recently used first
	all      map[*peerConn]struct{}         // registered connections not ended yet
	held     int                            // len(all) plus attempts: at most max
	attempts int                            // dial attempts under way, each holding room
	most     int                            // the most connections registered at once
	freed    chan struct{}                  // closed and replaced when held drops or a connection registers
	dialing  map[int]chan struct{}          // per peer: closed when this rank's dial ends
	down     map[int]error                  // peers never dialled again, and why
}

// odConn is a connection's on-demand state. closing and closed are made
// with it; the flags are under peerConn.mu.
type odConn struct {
	dialer    int
	closing   chan struct{} // closed when the connection is being closed: sends go to the next one
	closed    chan struct{} // closed once it ended and its room is free
	shut      bool          // closing is closed (under endpoint.mu)
	wroteBye  bool          // this side ended its lanes with goodbyes
	departing bool          // the peer's goodbyes are its departure
	touched   time.Time
}

func newOnDemand(m int) *onDemand {
	lru, _ := simplelru.NewLRU[int, *peerConn](m, nil) // m >= 1: never fails
	return &onDemand{max: m, lru: lru, all: map[*peerConn]struct{}{}, freed: make(chan struct{}),
		dialing: map[int]chan struct{}{}, down: map[int]error{}}
}

// OpenConns returns how many connections the node's endpoint holds now and
// the most it held at once (on demand; 0, 0 otherwise or before Connect).
func (n *Node) OpenConns() (open, most int) {
	n.mu.Lock()
	e := n.ep
	n.mu.Unlock()
	if e == nil || e.od == nil {
		return 0, 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.od.all), e.od.most
}

// Connected reports whether the endpoint holds a usable connection to peer
// now (always true in the full mesh once formed, for a linked peer).
func (n *Node) Connected(peer int) bool {
	n.mu.Lock()
	e := n.ep
	n.mu.Unlock()
	if e == nil || peer < 0 || peer >= len(e.peers) {
		return false
	}
	return e.usable(peer)
}

// releaseLocked gives back one unit of room.
func (od *onDemand) releaseLocked() {
	od.held--
	od.kickLocked()
}

// kickLocked wakes the sends that wait for room, to look again: room was
// given back, or a dial's room became a connection that can be closed (a
// wait that found only dials under way had nothing to close).
func (od *onDemand) kickLocked() {
	close(od.freed)
	od.freed = make(chan struct{})
}

// odConn returns the connection to peer, dialling it when there is none;
// a connection being closed is waited for first.
func (e *endpoint) odConn(ctx context.Context, peer int) (*peerConn, error) {
	od := e.od
	for {
		e.mu.Lock()
		if err := od.down[peer]; err != nil {
			e.mu.Unlock()
			return nil, &transport.PeerDownError{Peer: peer, Cause: err}
		}
		var wait <-chan struct{}
		pc := e.conns[peer]
		switch {
		case e.usableLocked(peer):
			od.lru.Get(peer)
			e.mu.Unlock()
			return pc, nil
		case pc != nil:
			wait = pc.od.closed // the next connection follows this one
		case od.dialing[peer] != nil:
			wait = od.dialing[peer]
		}
		if wait == nil {
			done := make(chan struct{})
			od.dialing[peer] = done
			e.mu.Unlock()
			err := e.odDial(ctx, peer)
			e.mu.Lock()
			delete(od.dialing, peer)
			close(done)
			e.mu.Unlock()
			if err != nil {
				return nil, err
			}
			continue
		}
		e.mu.Unlock()
		if err := e.odWait(ctx, peer, wait); err != nil {
			return nil, err
		}
	}
}

// odWait waits for ch, ctx or the endpoint's Close.
func (e *endpoint) odWait(ctx context.Context, peer int, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("quic: send to rank %d: waiting for a connection: %w", peer, ctx.Err())
	case <-e.ctx.Done():
		return transport.ErrClosed
	}
}

// odDial dials peer until a connection of the pair registers (this rank's,
// or the peer's that won a crossed dial), for up to Options.DialTimeout.
// Each attempt holds one unit of room, made if need be by closing the
// least recently used connection, and gives it back when it fails: a rank
// whose attempts wait on ranks that have no room themselves holds none
// meanwhile, so that they can take its connection (no circular wait). The
// waits between attempts grow, with jitter, so that ranks that all dial at
// once spread out. A peer not reached in time is reported down.
func (e *endpoint) odDial(ctx context.Context, peer int) error {
	od := e.od
	addr, tlsConf, err := e.target(peer)
	if err != nil {
		return &transport.PeerDownError{Peer: peer, Cause: err}
	}
	// The time to reach peer counts from the first attempt: waiting for
	// room here says nothing about it.
	var dctx context.Context
	backoff := 10 * time.Millisecond
	for {
		if e.usable(peer) {
			return nil // the peer dialled this rank meanwhile
		}
		e.mu.Lock()
		for od.held >= od.max {
			e.evictLocked()
			freed := od.freed
			e.mu.Unlock()
			if err := e.odWait(ctx, peer, freed); err != nil {
				return err
			}
			e.mu.Lock()
		}
		if dctx == nil {
			var cancel context.CancelFunc
			dctx, cancel = context.WithTimeout(ctx, e.node.opt.DialTimeout)
			defer cancel()
		}
		od.held++
		od.attempts++
		e.mu.Unlock()
		err := e.dialOnce(dctx, peer, addr, tlsConf, 0, 1) // registers, taking over the room held for it
		e.mu.Lock()
		od.attempts--
		if err != nil {
			od.releaseLocked()
		}
		e.mu.Unlock()
		if err == nil {
			return nil
		}
		switch {
		case e.usable(peer):
			return nil // the peer's connection won a crossed dial
		case ctx.Err() != nil:
			return fmt.Errorf("quic: send to rank %d: %w", peer, ctx.Err())
		case e.ctx.Err() != nil:
			return transport.ErrClosed
		case dctx.Err() != nil:
			return e.odUnreachable(peer, err)
		}
		jitter := time.Duration(rand.Int64N(int64(backoff)))
		select {
		case <-time.After(backoff/2 + jitter):
		case <-dctx.Done():
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// odUnreachable records that peer could not be reached (err: the last
// attempt's error), tells the DownHandler, and returns the error for Send.
func (e *endpoint) odUnreachable(peer int, err error) error {
	e.mu.Lock()
	if e.od.down[peer] == nil {
		e.od.down[peer] = fmt.Errorf("quic: rank %d is unreachable: no connection within %v (last attempt: %w)", peer, e.node.opt.DialTimeout, err)
	}
	cause := e.od.down[peer]
	e.mu.Unlock()
	if e.down != nil {
		e.down(peer, &transport.PeerDownError{Peer: peer, Cause: cause})
	}
	return &transport.PeerDownError{Peer: peer, Cause: cause}
}

// usable reports whether the pair with peer has a connection to send on.
func (e *endpoint) usable(peer int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.usableLocked(peer)
}

func (e *endpoint) usableLocked(peer int) bool {
	pc := e.conns[peer]
	return pc != nil && (pc.od == nil || !pc.od.shut) && pc.conn.Context().Err() == nil
}

// Open makes the connection to peer now rather than at the first Send (on
// demand; in the full mesh every connection exists once Connect returned).
func (n *Node) Open(ctx context.Context, peer int) error {
	n.mu.Lock()
	e := n.ep
	n.mu.Unlock()
	if e == nil || e.od == nil {
		return nil
	}
	if peer < 0 || peer >= len(e.peers) || peer == e.self {
		return fmt.Errorf("quic: open a connection to rank %d: out of range or this rank", peer)
	}
	_, err := e.odConn(ctx, peer)
	return err
}

// evictLocked starts closing the least recently used connection, unless
// one is being closed already (its room is on the way) or dials under way
// hold the room (each ends soon: its connection registers, which wakes the
// waiters to look again, or it fails and gives the room back).
func (e *endpoint) evictLocked() {
	if len(e.od.all) > e.od.lru.Len() || len(e.od.all) < e.od.max {
		return
	}
	if _, pc, ok := e.od.lru.RemoveOldest(); ok {
		e.closeConnLocked(pc)
	}
}

// closeConnLocked starts closing pc gracefully: the lower rank of the pair
// ends its lanes, the higher asks it to.
func (e *endpoint) closeConnLocked(pc *peerConn) {
	if pc.od.shut {
		return
	}
	pc.od.shut = true
	close(pc.od.closing)
	e.od.lru.Remove(pc.rank)
	if e.self < pc.rank {
		e.wg.Go(func() { e.writeGoodbyes(pc, time.Time{}, false) })
		return
	}
	e.wg.Go(func() {
		var h transport.Header
		h[0], h[1] = ownerOnDemand, odEvict
		_ = e.writeOwn(pc, &h)
	})
}

// writeOwn writes one of this transport's frames on pc's control lane.
func (e *endpoint) writeOwn(pc *peerConn, h *transport.Header) error {
	sl := &pc.lanes[transport.LaneControl]
	select {
	case sl.sem <- struct{}{}:
	case <-pc.conn.Context().Done():
		return context.Cause(pc.conn.Context())
	}
	defer func() { <-sl.sem }()
	if sl.s == nil {
		s, err := pc.conn.OpenUniStream()
		if err != nil {
			return err
		}
		sl.s = s
	}
	sl.buf = frame.AppendPrefix(sl.buf[:0], transport.LaneControl, h, 0)
	_, err := sl.s.Write(sl.buf)
	return err
}

// odRegister installs a verified connection of the pair with r that dialer
// dialled, under e.mu; it refuses one that loses a crossed dial or finds no
// room (an incoming one; a dial holds its room already).
func (e *endpoint) odRegisterLocked(r int, conn *quic.Conn, dialer int) error {
	od := e.od
	incoming := dialer != e.self
	if err := od.down[r]; err != nil {
		return err
	}
	// A connection that may have carried messages is never replaced
	// while the other side may still use it: the pair's next connection
	// would not be ordered after it. Only its dialer, which dials again
	// only once its view of it has ended (drained: everything on it was
	// delivered both ways), replaces it; a crossed dial loses to the
	// connection there is, or, where neither registered yet, to the lower
	// rank's dial (decided here, by the lower rank, from the moment it
	// chose to dial).
	cur := e.conns[r]
	if e.usableLocked(r) && cur.od.dialer != dialer {
		return fmt.Errorf("rank %d and rank %d are connected already", e.self, r)
	}
	if incoming && od.dialing[r] != nil && e.self < r {
		return fmt.Errorf("rank %d dials rank %d too (the lower rank's connection wins)", e.self, r)
	}
	if incoming {
		if od.held >= od.max {
			e.evictLocked()
			return errBusy
		}
		od.held++
	}
	if cur != nil {
		e.closeConnLocked(cur) // its dialer has moved on: it ended there
	}
	pc := e.addConnLocked(r, conn, 1, &odConn{dialer: dialer, closing: make(chan struct{}), closed: make(chan struct{}), touched: time.Now()})
	od.all[pc] = struct{}{}
	od.most = max(od.most, len(od.all))
	od.lru.Add(r, pc)
	od.kickLocked()
	return nil
}

// odControl takes one of this transport's frames from pc.
func (e *endpoint) odControl(pc *peerConn, h *transport.Header) {
	switch h[1] {
	case odEvict:
		e.mu.Lock()
		if e.self < pc.rank {
			e.closeConnLocked(pc)
		}
		e.mu.Unlock()
	case odDepart:
		pc.mu.Lock()
		pc.od.departing = true
		pc.mu.Unlock()
	}
}

// odTouch moves pc to the front of the list on arrivals, now and then.
func (e *endpoint) odTouch(pc *peerConn) {
	now := time.Now()
	pc.mu.Lock()
	stale := now.Sub(pc.od.touched) > touchEvery
	if stale {
		pc.od.touched = now
	}
	pc.mu.Unlock()
	if stale {
		e.mu.Lock()
		e.od.lru.Get(pc.rank)
		e.mu.Unlock()
	}
}

// odDrained handles the goodbye of every lane of pc when it is no
// departure: the lower rank (which said its goodbyes first) closes the
// connection; the higher says its goodbyes now.
func (e *endpoint) odDrained(pc *peerConn) {
	if e.self < pc.rank {
		pc.conn.CloseWithError(codeDrained, "drained")
		return
	}
	e.mu.Lock()
	if !pc.od.shut {
		pc.od.shut = true
		close(pc.od.closing)
		e.od.lru.Remove(pc.rank)
	}
	e.mu.Unlock()
	e.wg.Go(func() { e.writeGoodbyes(pc, time.Time{}, false) })
}

// odEnded releases pc's room once its connection ended and reports whether
// that end was graceful: every lane of both directions ended with a
// goodbye, so nothing was lost.
func (e *endpoint) odEnded(pc *peerConn) bool {
	e.mu.Lock()
	if _, ok := e.od.all[pc]; ok {
		delete(e.od.all, pc)
		e.od.releaseLocked()
		if e.conns[pc.rank] == pc {
			e.conns[pc.rank] = nil
			e.od.lru.Remove(pc.rank)
		}
		if !pc.od.shut {
			pc.od.shut = true
			close(pc.od.closing)
		}
		close(pc.od.closed)
	}
	e.mu.Unlock()
	return pc.odGraceful()
}

// odGraceful reports whether pc's connection, once ended, ended
// gracefully: every lane of both directions with a goodbye, and no
// departure. Its flags are final once the connection's context has ended.
func (pc *peerConn) odGraceful() bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.bye == int(transport.NumLanes) && pc.od.wroteBye && !pc.od.departing
}

// odNext says what a Send does with pc, whose connection has ended or is
// ending: next, when pc is an on-demand connection that ended gracefully
// (closed to make room, or after a crossed dial): nothing was lost on it,
// and a Send that wrote nothing on it goes to the pair's next one. It
// waits for the end to be settled (odEnded, run as the connection's
// context ends); err, when ctx ended first. Neither: the end is a loss.
func (e *endpoint) odNext(ctx context.Context, pc *peerConn) (next bool, err error) {
	if pc.od == nil {
		return false, nil
	}
	select {
	case <-pc.od.closed:
	case <-ctx.Done():
		return false, fmt.Errorf("quic: send to rank %d: waiting for the end of a connection: %w", pc.rank, ctx.Err())
	case <-e.ctx.Done():
		return false, nil
	}
	return pc.odGraceful(), nil
}

// odClosing is the channel closed when pc is being closed (nil, never
// ready, in the full mesh).
func odClosing(pc *peerConn) <-chan struct{} {
	if pc.od == nil {
		return nil
	}
	return pc.od.closing
}

// Kill closes the node's socket at once, without a goodbye, as the death
// of its process would (tests); Close still releases the rest.
func (n *Node) Kill() { n.closeSocket() }
