package bulk

import (
	"context"
	"fmt"
	"time"

	"github.com/nexar-go/nexar/internal/procwatch"
)

// Same-host deaths in milliseconds. Every hello and offer carries the
// sender's host id and process identity (pid, start time, PID namespace),
// so each rank learns at mesh formation, before any data flows and whether
// or not a ring is ever made, the process of every peer on its host. It
// watches those processes (internal/procwatch: a pidfd each, one goroutine) and
// reports an exit through the DownHandler, the path a lost connection
// takes, with a cause that says the process exited.
//
// A graceful Close is a departure, not a death: before it closes its
// connections, a closing rank sends bye to each peer that may watch it and
// waits (up to CloseTimeout) for that peer's byeack; a peer that got the
// bye takes the exit that follows for the end of a departure.

// notePeerProc records, from a hello or offer, the process of peer from
// when it is proven to run on this host in this PID namespace (equal host
// ids, which include the boot id, and equal namespaces), and watches it.
// The pidfd is opened now, with the start time checked against the
// peer's claim, so a pid reused since is not watched in its place.
func (e *Endpoint) notePeerProc(from int, m procClaim) {
	if e.me.PID <= 0 || m.PID <= 0 || m.Start == 0 || m.Host != e.opt.HostID || m.PIDNS != e.me.PIDNS {
		return
	}
	if m.PID == e.me.PID {
		e.inProc[from].Store(m.Start == e.me.Start) // a rank of this process: nothing to watch
		return
	}
	e.mu.Lock()
	if e.sameProc[from] || !e.accepting {
		e.mu.Unlock()
		return
	}
	e.sameProc[from] = true
	if e.watch == nil && e.watchErr == nil {
		e.watch, e.watchErr = procwatch.New(e.procExited)
		if e.watchErr != nil {
			e.log.Debug("nexar: bulk: local peers' processes are not watched", "rank", e.self, "err", e.watchErr)
		}
	}
	w := e.watch
	e.mu.Unlock()
	if w == nil {
		return
	}
	if err := w.Add(from, procwatch.ID{PID: m.PID, Start: m.Start, PIDNS: m.PIDNS}); err != nil {
		e.log.Debug("nexar: bulk: not watching a local peer's process", "rank", e.self, "peer", from, "pid", m.PID, "err", err)
		return
	}
	e.log.Debug("nexar: bulk: watching a local peer's process", "rank", e.self, "peer", from, "pid", m.PID)
}

// drainMax bounds how long the death of a local peer waits for its ring to
// drain: delivery can be held up by the layer above (no room to buffer).
const drainMax = time.Second

// procExited is the watch's report that peer's process exited: a death,
// unless peer said goodbye first. What the process wrote into its ring
// before it died is delivered first (a rank that finished a collective and
// then died must not fail the others' same collective): the ring is marked
// closed by its producer, so its reader delivers what it holds, ends, and
// reports the death (startReader), or, at the latest after drainMax, the
// death is reported here.
func (e *Endpoint) procExited(peer, pid int) {
	e.settle(peer)
	cause := fmt.Errorf("its process (pid %d) on this host exited", pid)
	e.mu.Lock()
	departing := e.departing[peer]
	in := e.in[peer]
	if !departing {
		e.exited[peer] = cause
	}
	e.mu.Unlock()
	if departing {
		e.log.Debug("nexar: bulk: a departed peer's process exited", "rank", e.self, "peer", peer, "pid", pid)
		return
	}
	if in != nil && in.ring != nil {
		in.ring.producerGone()
		time.AfterFunc(e.drainMax, func() { e.report(peer, cause) })
		return
	}
	e.report(peer, cause)
}

// peerBye handles a peer's goodbye: its exit from now on is a departure.
// The acknowledgement lets the peer exit.
func (e *Endpoint) peerBye(from int) {
	e.mu.Lock()
	e.departing[from] = true
	e.mu.Unlock()
	// A closing peer reports no death of this process either.
	e.settle(from)
	e.afterStart(func() { e.sendCtl(e.ctx, from, byeAckMsg{}) })
}

// settle records that peer will not call this process's exit a death:
// it acknowledged the goodbye, said its own, or is gone.
func (e *Endpoint) settle(peer int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.settleLocked(peer)
}

// settleLocked is settle with e.mu held.
func (e *Endpoint) settleLocked(peer int) {
	if !e.settledOK[peer] {
		e.settledOK[peer] = true
		close(e.settled[peer])
	}
}

// watchers lists the peers that may watch this process and are not down:
// those Close says goodbye to.
func (e *Endpoint) watchers() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ps []int
	for p, s := range e.sameProc {
		if s && !e.downed[p].Load() && !e.settledOK[p] {
			ps = append(ps, p)
		}
	}
	return ps
}

// sayBye tells peer that this process is leaving and waits, until
// deadline, for the acknowledgement.
func (e *Endpoint) sayBye(peer int, deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := e.sendCtl(ctx, peer, byeMsg{}); err != nil {
		return
	}
	select {
	case <-e.settled[peer]:
	case <-ctx.Done():
		e.log.Debug("nexar: bulk: no acknowledgement of the goodbye", "rank", e.self, "peer", peer)
	}
}

// PeerAlive reports whether peer's process is known to run
// (transport.DataPath), so that its silence is a stall, not a death:
//   - it runs on this host and is watched: its exit would be reported at
//     once;
//   - or a TCP connection to or from it is established and its kernel
//     answered on it within kernelFresh (keepalives answer every second,
//     whatever its process does). A process that dies has its connections
//     closed by its kernel (FIN, or RST to what comes next), which ends
//     them here; a host that dies or is cut off stops answering.
//
// False once it exited or was reported down, and where neither holds (a
// rank of this process, no pidfds, no TCP channel: QUIC or shared memory
// only).
func (e *Endpoint) PeerAlive(peer int) bool {
	if peer < 0 || peer >= e.size || e.closed.Load() || e.downed[peer].Load() {
		return false
	}
	e.mu.Lock()
	w, exited, in := e.watch, e.exited[peer] != nil, e.in[peer]
	e.mu.Unlock()
	if exited {
		return false
	}
	return w != nil && w.Watching(peer) || kernelAlive(e.out[peer].Load()) || kernelAlive(in)
}

// kernelAlive reports whether ch runs over TCP connections one of which
// the peer's kernel answered on within kernelFresh.
func kernelAlive(ch *channel) bool {
	if ch == nil || ch.broken.Load() {
		return false
	}
	for _, l := range ch.links {
		if c, ok := l.(connLink); ok {
			if age, ok := kernelAnswered(c.raw); ok && age <= kernelFresh {
				return true
			}
		}
	}
	if ch.sock != nil { // link 0, out of Go's poller (its raw closed)
		if age, ok := ch.sock.answered(); ok && age <= kernelFresh {
			return true
		}
	}
	return false
}
