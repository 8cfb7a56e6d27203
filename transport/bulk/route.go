package bulk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// This file routes each message to its path (a peer's channel or the
// inner endpoint) and lets a waiting goroutine poll, or sleep on, a
// peer's ring.

// Send routes LaneData to the peer's bulk channel and the rest to inner.
func (e *Endpoint) Send(ctx context.Context, peer int, lane transport.Lane, h *transport.Header, payload []byte) error {
	return e.send(ctx, peer, lane, h, payload, nil, false)
}

// SendProgress is Send for LaneData that, while it waits for room on a
// shared-memory ring, runs progress (a poll function from StartPolling):
// one goroutine can then keep both directions of an exchange moving, which
// on few cores beats a goroutine per direction. On other paths it is Send.
func (e *Endpoint) SendProgress(ctx context.Context, peer int, h *transport.Header, payload []byte, progress func() bool) error {
	return e.send(ctx, peer, transport.LaneData, h, payload, progress, false)
}

// send sends one message; dev: its payload is device memory (SendDevice),
// which only a device channel (rdmachan.go) may carry.
func (e *Endpoint) send(ctx context.Context, peer int, lane transport.Lane, h *transport.Header, payload []byte, progress func() bool, dev bool) error {
	// Counted before the closed check: Close waits for every send it did
	// not turn away before it unmaps the rings.
	e.using.Add(1)
	defer e.using.Add(-1)
	if e.closed.Load() {
		return transport.ErrClosed
	}
	if e.inner == nil {
		return errors.New("bulk: Send before Start")
	}
	if lane == transport.LaneRPC {
		if handled, err := e.sendRPC(ctx, peer, h, payload); handled {
			return err
		}
	}
	if dev && (lane != transport.LaneData || peer < 0 || peer >= e.size || !e.deviceChannel(e.out[peer].Load())) {
		// Nothing else may see device memory: the inner endpoint copies it.
		return fmt.Errorf("bulk: send to rank %d: %w", peer, transport.ErrNoDevicePath)
	}
	if lane == transport.LaneData && peer >= 0 && peer < e.size {
		ch := e.out[peer].Load()
		if ch == nil && e.lazy[peer].Load() {
			if err := e.connect(ctx, peer); err != nil {
				return err
			}
			ch = e.out[peer].Load()
		}
		if ch != nil {
			if e.downed[peer].Load() {
				return &transport.PeerDownError{Peer: peer, Cause: e.cause(peer)}
			}
			if len(payload) > transport.MaxPayload {
				return fmt.Errorf("bulk: payload of %d bytes exceeds %d", len(payload), transport.MaxPayload)
			}
			broken, err := ch.send(ctx, h, payload, progress, dev)
			if err == nil {
				return nil
			}
			if e.closed.Load() {
				return transport.ErrClosed
			}
			if broken {
				if e.downed[peer].Load() {
					return &transport.PeerDownError{Peer: peer, Cause: e.cause(peer)}
				}
				e.rdmaBroken(peer, ch, err)
				err = fmt.Errorf("bulk: send to rank %d over %s: %w", peer, ch.desc, err)
				if ctx.Err() != nil {
					// We cut a frame: the peer sees an abrupt loss, so do we.
					e.report(peer, err)
				}
				// Otherwise the peer went away; the inner endpoint or the
				// inbound channel tells how.
				return &transport.PeerDownError{Peer: peer, Cause: err}
			}
			return fmt.Errorf("bulk: send to rank %d: %w", peer, err)
		}
	}
	return e.inner.Send(ctx, peer, lane, h, payload)
}

var _ transport.DataPath = (*Endpoint)(nil)

// Caps declares what the endpoint can do (transport.DataPath): rings can
// be polled by a waiting goroutine and progressed while a send waits for
// room, and are made on first use, where the mode allows shared memory;
// TCP channels can be polled where the mode allows TCP; RDMA channels move
// device memory where the device was given a GPU runtime.
func (e *Endpoint) Caps() transport.Caps {
	shm := e.opt.Mode.shm()
	dev := false
	if e.opt.RDMA != nil {
		dev, _ = e.opt.RDMA.GPU()
	}
	return transport.Caps{Poll: shm || e.opt.Mode.tcp(), ProgressSend: shm, LazyData: shm, Presence: shm, Device: dev}
}

// SharedMemory reports whether this rank's data to peer goes over a
// shared-memory ring.
func (e *Endpoint) SharedMemory(peer int) bool {
	if peer < 0 || peer >= e.size {
		return false
	}
	ch := e.out[peer].Load()
	if ch == nil {
		return false
	}
	_, ok := ch.links[0].(ringLink)
	return ok
}

// Oversubscribed reports whether more ranks than cores share this rank's
// CPUs, as decided at Start (the ranks on this machine's kernel whose CPU
// sets overlap this one's, network namespaces included; docs/bulk-path.md):
// waiters on its rings then yield the core between polls, and so should
// the caller's. Safe for concurrent use.
func (e *Endpoint) Oversubscribed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.oversubscribed
}

// DataUnused reports whether no LaneData message was ever sent, or is
// being sent, to peer: a local peer whose ring (made on first use) nobody
// asked for yet. A message for which only the order behind LaneData
// matters may then take another lane, instead of making a ring for it (a
// goodbye to every member at Close would otherwise make one for every
// pair). Safe for concurrent use.
func (e *Endpoint) DataUnused(peer int) bool {
	if peer < 0 || peer >= e.size {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lazy[peer].Load() && e.waits[peer] == nil
}

// connect waits until the path to local peer, whose ring is made on first
// use, is fixed; the first caller asks the peer for the ring. Until then no
// data went to peer, so whichever path is fixed keeps the order.
func (e *Endpoint) connect(ctx context.Context, peer int) error {
	e.mu.Lock()
	if !e.lazy[peer].Load() {
		e.mu.Unlock()
		return nil
	}
	w := e.waits[peer]
	ask := w == nil
	if ask {
		w = make(chan struct{})
		e.waits[peer] = w
	}
	e.mu.Unlock()
	if ask {
		// On e.ctx, not ctx: a caller giving up must not lose the request
		// that later sends wait on (evConnect sends want).
		e.negotiate(e.ctx, evConnect{peer})
	}
	wait := e.opt.RingTimeout
	if wait <= 0 {
		wait = DefaultRingTimeout
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bulk: send to rank %d: %w", peer, ctx.Err())
	case <-e.ctx.Done():
		return transport.ErrClosed
	case <-t.C:
		return fmt.Errorf("bulk: send to rank %d: no shared-memory ring from it within %v", peer, wait)
	}
}

// StartPolling lets the calling goroutine, which is about to wait for data
// from peer, progress peer's shared-memory ring or TCP channel itself:
// poll consumes, in the caller, what has arrived (a bounded amount of a
// ring, one frame of TCP, whose rest follows its first bytes), delivers
// the frames it completes and reports whether it consumed anything,
// without waiting for more; stop ends the polling (call it exactly once).
// Both are nil when peer's data comes over neither. Safe for concurrent
// use.
func (e *Endpoint) StartPolling(peer int) (poll func() bool, stop func()) {
	if peer < 0 || peer >= e.size {
		return nil, nil
	}
	ch := e.polled[peer].Load()
	if ch == nil {
		return nil, nil
	}
	// Counted like a send, so that Close does not unmap the ring under it.
	e.using.Add(1)
	if e.closed.Load() {
		e.using.Add(-1)
		return nil, nil
	}
	e.pres.enter()
	if ch.sock != nil {
		ch.startPollTCP()
		return ch.pollFn, ch.unpollFn
	}
	return ch.pollFn, e.unuseFn
}

// Waiting tells peer's shared-memory ring that the calling goroutine is
// about to block until data from peer is delivered: the producer then wakes
// the ring's read loop for every write, instead of leaving the data to a
// goroutine that polls. Call done when the wait ends. Both are no-ops when
// peer's data does not come over a ring. A TCP channel's read loop, which
// stays off the socket while goroutines poll it, is woken to read.
//
// A wait that begins before peer's ring exists is counted on the ring once
// startReader installs it (waitCount).
func (e *Endpoint) Waiting(peer int) (done func()) {
	if peer < 0 || peer >= e.size {
		return func() {}
	}
	if ch := e.polled[peer].Load(); ch != nil && ch.sock != nil {
		ch.blocked.Add(1)
		ch.sock.wake()
		return func() { ch.blocked.Add(-1) }
	}
	e.using.Add(1) // as StartPolling: Close does not unmap a ring counted on
	if e.closed.Load() {
		e.using.Add(-1)
		return func() {}
	}
	w := &e.blockedOn[peer]
	w.add(1, e.ringPolled(peer))
	return func() {
		w.add(-1, nil)
		e.using.Add(-1)
	}
}

// ringPolled is peer's polled channel if it is a ring, else nil.
func (e *Endpoint) ringPolled(peer int) *channel {
	if ch := e.polled[peer].Load(); ch != nil && ch.ring != nil {
		return ch
	}
	return nil
}

// waitCount is the number of goroutines blocked until one peer's data is
// delivered, and the ring channel they are counted on (the producer wakes
// its reader for every write while the count there is not zero).
type waitCount struct {
	// mu guards the fields below.
	mu sync.Mutex
	n  int
	on *channel // nil: none (no ring yet, or n is 0)
}

// add changes the count by delta (+1, -1); ch is the peer's ring channel
// as the caller sees it, counted on if none is yet.
func (w *waitCount) add(delta int, ch *channel) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += delta
	switch {
	case w.on != nil:
		w.on.ring.setWaiting(delta)
	case ch != nil && w.n > 0:
		w.on = ch
		ch.ring.setWaiting(w.n)
	}
	if w.n == 0 {
		w.on = nil
	}
}

// moveTo counts the waiters on ch, the peer's new ring channel, instead of
// the one they were counted on (if any).
func (w *waitCount) moveTo(ch *channel) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on == ch || w.n == 0 {
		return
	}
	if w.on != nil {
		w.on.ring.setWaiting(-w.n)
	}
	w.on = ch
	ch.ring.setWaiting(w.n)
}

// Await sleeps until data from peer arrives on its shared-memory ring, d
// passes or done is closed, then consumes what arrived in the calling
// goroutine (see channel.await): the producer wakes this thread itself, so
// a waiter whose peer is late is back within microseconds. It reports
// false at once when peer's data does not come over an open ring (TCP
// peers: sleeping on the socket doubled large transfers' tail, and core
// stopped using it at stop 40; docs/bulk-path.md).
func (e *Endpoint) Await(peer int, done func() bool, d time.Duration) bool {
	if peer < 0 || peer >= e.size {
		return false
	}
	ch := e.ringPolled(peer)
	if ch == nil {
		return false
	}
	e.using.Add(1) // as StartPolling: Close does not unmap the ring under it
	defer e.using.Add(-1)
	if e.closed.Load() {
		return false
	}
	return ch.await(done, d)
}
