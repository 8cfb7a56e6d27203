package bulk

import (
	"errors"
	"fmt"
	"io"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
)

// This file is how peers go down: a graceful departure, held back until
// the peer's inbound channels drained, and a loss, reported once.

// peerLost is the inner endpoint's DownHandler. A graceful departure is
// held back until the peer's inbound bulk channel has drained too, so that
// every message it sent is delivered before the notification.
func (e *Endpoint) peerLost(peer int, err error) {
	if peer < 0 || peer >= e.size {
		return
	}
	// Its connection is gone: it will not call this process's exit a death.
	e.settle(peer)
	if e.closed.Load() {
		return
	}
	if errors.Is(err, transport.ErrPeerClosed) {
		e.mu.Lock()
		if (e.in[peer] != nil && !e.byeSeen[peer]) || e.rpcPending(peer) {
			e.bye[peer] = err
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
	}
	e.report(peer, err)
}

// report tells the layer above, once, that peer is down and closes its
// bulk channels.
func (e *Endpoint) report(peer int, err error) {
	if e.closed.Load() {
		return
	}
	var pd *transport.PeerDownError
	if errors.As(err, &pd) {
		err = pd.Cause
	}
	// The cause is in place before the peer shows as down: a send that
	// sees it down names the cause (cause), never a placeholder.
	e.mu.Lock()
	if e.downed[peer].Load() {
		e.mu.Unlock()
		return
	}
	e.causes[peer] = err
	e.downed[peer].Store(true)
	e.settleLocked(peer)
	in := e.in[peer]
	e.mu.Unlock()
	for _, ch := range []*channel{e.out[peer].Load(), in} {
		if ch != nil {
			ch.quiet.Store(true)
			ch.close()
		}
	}
	e.rpcPeerDown(peer)
	// Sends and calls waiting for a channel to peer go to the inner
	// endpoint, which fails them.
	e.negotiate(e.ctx, evPeerDown{peer})
	e.log.Debug("nexar: bulk: peer down", "rank", e.self, "peer", peer, "err", err)
	if e.down != nil {
		e.down(peer, &transport.PeerDownError{Peer: peer, Cause: err})
	}
}

// Abandon gives up on peer, which the layer above declared down (cause
// says why): its bulk channels and, where the inner endpoint can, its inner
// connection are closed, so that a send or a receive blocked on a dead peer
// ends at once instead of at a transport timeout. The DownHandler is told,
// once, as for any loss. Safe for concurrent use.
func (e *Endpoint) Abandon(peer int, cause error) {
	if peer < 0 || peer >= e.size || peer == e.self {
		return
	}
	e.report(peer, &transport.PeerDownError{Peer: peer, Cause: cause})
	if a, ok := e.inner.(interface{ Abandon(int, error) }); ok {
		a.Abandon(peer, cause)
	}
}

func (e *Endpoint) cause(peer int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.causes[peer] == nil {
		return errors.New("bulk: peer is down")
	}
	return e.causes[peer]
}

// startReader installs an inbound channel and delivers its frames.
func (e *Endpoint) startReader(from int, ch *channel) {
	// Before the channel is published (e.in), so that a Close seeing it
	// sees its socket waiter too.
	var place func(h *transport.Header, n int) ([]byte, func(error))
	if e.opt.Place != nil {
		place = func(h *transport.Header, n int) ([]byte, func(error)) { return e.opt.Place(from, h, n) }
	}
	ch.startReading(func(h *transport.Header, p []byte) {
		if e.h != nil {
			e.h(from, transport.LaneData, h, p)
		}
	}, place)
	// A TCP channel that goroutines may poll (not a relaying rank's: its
	// read loop forwards what arrives, and nobody may keep it off the
	// socket, neither its pollers nor its process's, channel.aside).
	tcpPolled := ch.sock != nil && !e.opt.Forwards
	if tcpPolled {
		ch.proc = &e.pres
	}
	if ch.sock != nil {
		ch.unpollFn = func() {
			ch.stopPollTCP()
			e.unuseFn()
		}
	}
	e.mu.Lock()
	if !e.accepting || e.downed[from].Load() {
		e.mu.Unlock()
		ch.quiet.Store(true)
		ch.close()
		if ch.sock != nil {
			ch.sock.release() // no read loop runs to release it
		}
		return
	}
	old := e.in[from]
	e.in[from] = ch
	e.wg.Add(1)
	e.mu.Unlock()
	if old != nil {
		old.quiet.Store(true)
		old.close()
	}
	if ch.ring != nil {
		if e.opt.Forwards {
			ch.ring.setWaiting(1)
		}
		e.polled[from].Store(ch)
		e.blockedOn[from].moveTo(ch)
	} else if tcpPolled {
		e.polled[from].Store(ch)
	}
	if e.deviceChannel(ch) {
		e.devIn[from].Store(ch)
	}
	go func() {
		defer e.wg.Done()
		err := ch.readLoop()
		e.polled[from].CompareAndSwap(ch, nil)
		e.devIn[from].CompareAndSwap(ch, nil)
		ch.close()
		graceful := errors.Is(err, frame.ErrGoodbye)
		e.mu.Lock()
		if e.in[from] == ch {
			e.in[from] = nil
			e.byeSeen[from] = graceful
		}
		bye := e.bye[from]
		if e.rpcPending(from) {
			bye = nil // the RPC channel's reader reports the departure once it drained
		}
		e.mu.Unlock()
		_, tcp := ch.links[0].(connLink)
		switch {
		case ch.quiet.Load() || e.closed.Load():
		case tcp && errors.Is(err, io.EOF) && !ch.framed.Load():
			// Closed cleanly before its first frame: the dialer gave up
			// on the connections (our answer came after its authTimeout,
			// on a lossy link) and keeps its data on the inner path, so
			// nothing was lost. A dialer that died instead is found as
			// any silent or exited peer is (heartbeats, its process
			// watch). Anything else (a record that fails authentication)
			// is a loss.
			e.log.Info("nexar: bulk: TCP channel closed before its first frame; the peer's data stays on the inner path", "rank", e.self, "peer", from, "err", err)
		case graceful && bye != nil:
			e.report(from, bye)
		case graceful:
			// The inner endpoint reports the departure once its lanes drain.
		default:
			e.reportLost(from, fmt.Errorf("bulk: receive from rank %d over %s: %w", from, ch.desc, err))
		}
	}()
}

// reportLost reports peer lost: with the cause its process watcher
// recorded (its process exited), if any, else with err, the channel's.
func (e *Endpoint) reportLost(from int, err error) {
	e.mu.Lock()
	exited := e.exited[from]
	e.mu.Unlock()
	if exited == nil {
		exited = err
	}
	e.report(from, exited)
}
