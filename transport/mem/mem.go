// Package mem is an in-process transport.Endpoint mesh for tests: N ranks in
// one process, each (sender, lane) pair with its own bounded queue and
// delivery goroutine, so ordering and back-pressure behave as on the network.
// Close is graceful as on QUIC: what the closing rank had queued is still
// delivered, then its peers are told with cause transport.ErrPeerClosed.
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

type mesh struct {
	eps    []*Endpoint
	linked func(a, b int) bool // nil: every pair
}

// links reports whether ranks a and b of the mesh talk.
func (m *mesh) links(a, b int) bool { return a != b && (m.linked == nil || m.linked(a, b)) }

// Endpoint is one rank of an in-memory mesh. All methods are safe for
// concurrent use. Handler and DownHandler calls run on goroutines owned by
// the endpoint; Close waits for them, so they must not call Close themselves.
type Endpoint struct {
	m    *mesh
	rank int
	down transport.DownHandler

	// in[from*NumLanes+lane] delivers what rank from sent on lane; made
	// on the first message (under mu), so that a world of many ranks
	// that talk to few others runs few goroutines.
	in   []*inbox.Inbox
	h    transport.Handler
	done chan struct{} // closed by Close or Kill
	wg   sync.WaitGroup

	mu       sync.Mutex
	idle     sync.Cond // signalled when sending drops to 0
	sending  int       // Sends in progress
	closed   bool
	graceful bool   // stopped by Close, not Kill
	cause    error  // why this endpoint stopped
	peerDown []bool // peer already reported down
	lanesOut []int  // per peer: lanes still draining after its Close
}

var _ transport.DataPath = (*Endpoint)(nil)

// NewMesh connects n endpoints; h[i] and down[i] serve rank i (either may be
// nil or shorter than n).
func NewMesh(n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath {
	return NewMeshLinked(n, h, down, nil)
}

// NewMeshLinked is NewMesh for a sparse topology: only the pairs for which
// linked reports true (nil: every pair) talk, as a QUIC mesh with
// Options.Neighbors connects only those. A Send to another rank fails with
// a *transport.PeerDownError, and a rank's Close or Kill is told to its
// linked peers only (where a full mesh of N ranks tells N-1 each).
func NewMeshLinked(n int, h []transport.Handler, down []transport.DownHandler, linked func(a, b int) bool) []transport.DataPath {
	m := &mesh{eps: make([]*Endpoint, n), linked: linked}
	for i := range m.eps {
		e := &Endpoint{m: m, rank: i, done: make(chan struct{}), peerDown: make([]bool, n), lanesOut: make([]int, n)}
		e.idle.L = &e.mu
		if i < len(down) {
			e.down = down[i]
		}
		if i < len(h) {
			e.h = h[i]
		}
		e.in = make([]*inbox.Inbox, n*int(transport.NumLanes))
		m.eps[i] = e
	}
	out := make([]transport.DataPath, n)
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
// while that queue is full. Like a network transport, it accepts and drops
// messages for a peer that has closed but is still being drained here.
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
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return e.cause
	}
	e.sending++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.sending--
		if e.sending == 0 {
			e.idle.Broadcast()
		}
		e.mu.Unlock()
	}()
	if peer != e.rank && !e.m.links(e.rank, peer) {
		return &transport.PeerDownError{Peer: peer, Cause: errors.New("mem: not linked")}
	}
	dst := e.m.eps[peer]
	if err := e.sendErr(dst); err != nil || dst.stopped() != nil {
		return err
	}
	q := dst.inbox(e.rank, lane)
	if q == nil {
		return e.sendErr(dst)
	}
	return q.Put(ctx, lane, h, payload, e.done, func() error {
		if err := e.stopped(); err != nil {
			return err
		}
		return e.sendErr(dst)
	})
}

// inbox returns the queue for what from sends on lane, made on first use;
// nil once e has stopped.
func (e *Endpoint) inbox(from int, lane transport.Lane) *inbox.Inbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := from*int(transport.NumLanes) + int(lane)
	if e.in[k] == nil {
		if e.closed {
			return nil
		}
		e.in[k] = inbox.Start(&e.wg, QueueDepth, e.done, from, e.h)
	}
	return e.in[k]
}

// sendErr is what a Send from e to the stopped dst returns: nil (dropped)
// while e still drains dst's graceful departure, else a PeerDownError.
func (e *Endpoint) sendErr(dst *Endpoint) error {
	dst.mu.Lock()
	closed, graceful, cause := dst.closed, dst.graceful, dst.cause
	dst.mu.Unlock()
	if !closed {
		return nil
	}
	if !graceful {
		return &transport.PeerDownError{Peer: dst.rank, Cause: cause}
	}
	e.mu.Lock()
	told := e.peerDown[dst.rank]
	e.mu.Unlock()
	if !told {
		return nil
	}
	return &transport.PeerDownError{Peer: dst.rank, Cause: fmt.Errorf("mem: rank %d closed its endpoint: %w", dst.rank, transport.ErrPeerClosed)}
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

// Close stops this endpoint: what it has queued for the other ranks is
// still delivered, after which each is told, with cause
// transport.ErrPeerClosed. Messages queued for this endpoint are dropped.
// Close does not wait for the peers to drain. It is idempotent.
func (e *Endpoint) Close() error {
	e.stop(transport.ErrClosed, true)
	e.wg.Wait()
	return nil
}

// Kill simulates the death of ep's process: the other ranks' DownHandlers
// fire for it, sends to it fail with *transport.PeerDownError and its own
// Sends fail. ep must come from NewMesh. Kill does not wait for ep's handler
// goroutines; Close does.
func Kill(ep transport.Endpoint) {
	ep.(*Endpoint).stop(errKilled, false)
}

func (e *Endpoint) stop(cause error, graceful bool) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed, e.cause, e.graceful = true, cause, graceful
	close(e.done)
	// Sends blocked on a full queue return now (e.done); once none is in
	// progress nothing more can be queued, and the queues can be sealed.
	for e.sending > 0 {
		e.idle.Wait()
	}
	e.mu.Unlock()
	for _, o := range e.m.eps {
		if !e.m.links(e.rank, o.rank) {
			continue
		}
		if !graceful {
			o.notifyDown(e.rank, cause)
			continue
		}
		// Seal the lanes e used (none is made after: e sends no more);
		// with none, the departure is reported at once.
		var qs []*inbox.Inbox
		o.mu.Lock()
		for l := range int(transport.NumLanes) {
			if q := o.in[e.rank*int(transport.NumLanes)+l]; q != nil {
				qs = append(qs, q)
			}
		}
		o.lanesOut[e.rank] = len(qs) + 1
		o.mu.Unlock()
		for _, q := range qs {
			q.Seal(func() { o.laneDrained(e.rank) })
		}
		o.laneDrained(e.rank)
	}
}

// laneDrained runs when one lane from the closed peer has delivered its
// last message; with the last lane the departure is reported.
func (e *Endpoint) laneDrained(peer int) {
	e.mu.Lock()
	e.lanesOut[peer]--
	last := e.lanesOut[peer] == 0
	e.mu.Unlock()
	if last {
		e.notifyDown(peer, fmt.Errorf("mem: rank %d closed its endpoint: %w", peer, transport.ErrPeerClosed))
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

// The rest of transport.DataPath: an in-memory mesh has no shared-memory
// rings to poll, sends never wait for ring room, and every path exists
// from the start.

// Caps declares none of the optional behaviours; the endpoint is no
// transport.Poller (its Handler delivers every message).
func (e *Endpoint) Caps() transport.Caps { return transport.Caps{} }

// SendProgress is Send on LaneData; progress is not run.
func (e *Endpoint) SendProgress(ctx context.Context, peer int, h *transport.Header, payload []byte, _ func() bool) error {
	return e.Send(ctx, peer, transport.LaneData, h, payload)
}

// PeerAlive: the ranks of a mesh in one process watch no processes.
func (e *Endpoint) PeerAlive(int) bool { return false }

// SharedMemory reports false: messages are handed over in process.
func (e *Endpoint) SharedMemory(int) bool { return false }

// DeviceData reports false: nothing here reads device memory.
func (e *Endpoint) DeviceData(int) (send, recv bool) { return false, false }

// SendDevice refuses: nothing here reads device memory.
func (e *Endpoint) SendDevice(context.Context, int, *transport.Header, []byte) error {
	return fmt.Errorf("mem: %w", transport.ErrNoDevicePath)
}

// Paths names the path to every linked rank "mem".
func (e *Endpoint) Paths() map[int]string {
	m := make(map[int]string, len(e.m.eps))
	for r := range e.m.eps {
		if e.m.links(e.rank, r) {
			m[r] = "mem"
		}
	}
	return m
}

// DataUnused reports false: every path exists from the start.
func (e *Endpoint) DataUnused(int) bool { return false }

// Abandon tells e's DownHandler, once, that peer is down (cause). An
// in-memory pair has no connection to close: the layer above ends its own
// sends to a peer it declared down, and tells that peer itself. Safe for
// concurrent use.
func (e *Endpoint) Abandon(peer int, cause error) {
	if peer < 0 || peer >= len(e.m.eps) || peer == e.rank {
		return
	}
	if cause == nil {
		cause = errors.New("mem: abandoned")
	}
	e.notifyDown(peer, cause)
}
