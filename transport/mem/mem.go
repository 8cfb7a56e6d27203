// Package mem is an in-process transport.Endpoint mesh for tests: N ranks in
// one process, each (sender, lane) pair with its own bounded queue and
// delivery goroutine, so ordering and back-pressure behave as on the network.
// Kill simulates the death of a rank.
package mem

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/inbox"
)

// QueueDepth is the number of messages each (sender, lane) queue holds before
// Send blocks.
const QueueDepth = 16

// errKilled is the cause reported to the survivors of Kill.
var errKilled = errors.New("mem: rank killed")

// errPeerClosed is the cause reported when a peer closed its endpoint.
var errPeerClosed = errors.New("mem: peer closed its endpoint")

type mesh struct {
	eps []*Endpoint
}

// Endpoint is one rank of an in-memory mesh. All methods are safe for
// concurrent use. Handler and DownHandler calls run on goroutines owned by
// the endpoint; Close waits for them, so they must not call Close themselves.
type Endpoint struct {
	m    *mesh
	rank int
	down transport.DownHandler

	// in[from*NumLanes+lane] delivers what rank from sent on lane.
	in   []*inbox.Inbox
	done chan struct{} // closed by Close or Kill
	wg   sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	cause    error  // why this endpoint stopped
	peerDown []bool // peer already reported down
}

// NewMesh connects n endpoints; h[i] and down[i] serve rank i (either may be
// nil or shorter than n).
func NewMesh(n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
	m := &mesh{eps: make([]*Endpoint, n)}
	for i := range m.eps {
		e := &Endpoint{m: m, rank: i, done: make(chan struct{}), peerDown: make([]bool, n)}
		if i < len(down) {
			e.down = down[i]
		}
		var hi transport.Handler
		if i < len(h) {
			hi = h[i]
		}
		e.in = make([]*inbox.Inbox, n*int(transport.NumLanes))
		for j := range e.in {
			e.in[j] = inbox.Start(&e.wg, QueueDepth, e.done, j/int(transport.NumLanes), hi)
		}
		m.eps[i] = e
	}
	out := make([]transport.Endpoint, n)
	for i, e := range m.eps {
		out[i] = e
	}
	return out
}

// Rank returns this endpoint's rank.
func (e *Endpoint) Rank() int { return e.rank }

// Size returns the number of ranks in the mesh.
func (e *Endpoint) Size() int { return len(e.m.eps) }

// Send copies the message into peer's queue for (e.Rank(), lane), blocking
// while that queue is full.
func (e *Endpoint) Send(ctx context.Context, peer int, lane transport.Lane, h *transport.Header, payload []byte) error {
	if peer < 0 || peer >= len(e.m.eps) {
		return fmt.Errorf("mem: send to rank %d: out of range [0,%d)", peer, len(e.m.eps))
	}
	if lane >= transport.NumLanes {
		return fmt.Errorf("mem: send on lane %d: unknown lane", lane)
	}
	if len(payload) > transport.MaxPayload {
		return fmt.Errorf("mem: payload of %d bytes exceeds %d", len(payload), transport.MaxPayload)
	}
	if err := e.stopped(); err != nil {
		return err
	}
	dst := e.m.eps[peer]
	if err := dst.stopped(); err != nil {
		return &transport.PeerDownError{Peer: peer, Cause: err}
	}
	q := dst.in[e.rank*int(transport.NumLanes)+int(lane)]
	return q.Put(ctx, lane, h, payload, e.done, func() error {
		if err := e.stopped(); err != nil {
			return err
		}
		return &transport.PeerDownError{Peer: peer, Cause: dst.stopped()}
	})
}

// stopped returns nil while the endpoint runs, transport.ErrClosed after
// Close, and the kill cause after Kill.
func (e *Endpoint) stopped() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed {
		return nil
	}
	return e.cause
}

// Close stops this endpoint and tells the other ranks it is down. It is
// idempotent.
func (e *Endpoint) Close() error {
	e.stop(transport.ErrClosed, errPeerClosed)
	e.wg.Wait()
	return nil
}

// Kill simulates the death of ep's process: the other ranks' DownHandlers
// fire for it, sends to it fail with *transport.PeerDownError and its own
// Sends fail. ep must come from NewMesh. Kill does not wait for ep's handler
// goroutines; Close does.
func Kill(ep transport.Endpoint) {
	ep.(*Endpoint).stop(errKilled, errKilled)
}

func (e *Endpoint) stop(self, others error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed, e.cause = true, self
	close(e.done)
	e.mu.Unlock()
	for _, o := range e.m.eps {
		if o != e {
			o.notifyDown(e.rank, others)
		}
	}
}

// notifyDown reports peer down once, unless e itself has stopped.
func (e *Endpoint) notifyDown(peer int, cause error) {
	e.mu.Lock()
	if e.closed || e.peerDown[peer] || e.down == nil {
		e.peerDown[peer] = true
		e.mu.Unlock()
		return
	}
	e.peerDown[peer] = true
	e.wg.Add(1)
	e.mu.Unlock()
	// Asynchronous, so a DownHandler may take locks its caller holds.
	go func() {
		defer e.wg.Done()
		e.down(peer, &transport.PeerDownError{Peer: peer, Cause: cause})
	}()
}
