package bulk

import (
	"context"
	"errors"
	"fmt"

	"github.com/nexar-go/nexar/transport"
)

// RDMA is an RDMA device on which the endpoint makes LaneData channels
// (transport/rdma.Device implements it; core opens it). The endpoint owns
// it: Close closes it. Safe for concurrent use.
type RDMA interface {
	// Describe names the device, port and addressing ("mlx5_0:1 roce v2").
	Describe() string
	// Listen makes the receiving end of a channel from peer and returns
	// the parameters to offer it.
	Listen(peer int) (RDMAEnd, []byte, error)
	// Dial makes the sending end of a channel to peer from the
	// parameters peer offered and returns this end's, for the result.
	Dial(peer int, offer []byte) (RDMAEnd, []byte, error)
	// GPU reports whether the channels read and write GPU device memory
	// themselves (moves: constant for the device's life), and whether the
	// NIC may still reach it directly (direct: GPUDirect RDMA not ruled
	// out).
	GPU() (moves, direct bool)
	// Prepare registers host buffer b whole where registrations last
	// across operations, so that the pieces of it sent and received next
	// share one registration; a hint (nothing happens where it would not
	// help), safe for concurrent use.
	Prepare(b []byte)
	// Forget drops the registrations of b's range (those in use go when
	// their operation ends): its memory is about to be given back. Safe
	// for concurrent use.
	Forget(b []byte)
	Close() error
}

// RDMAEnd is one end of an RDMA channel: an ordered byte stream (Read on
// the receiving end, Write on the sending end) that a channel frames as
// it frames a TCP connection. An alias of an interface literal, so that
// transport/rdma implements RDMA without importing this package.
type RDMAEnd = interface {
	Read(p []byte) (int, error)
	// ReadOnce is Read into a buffer used once (a frame nobody placed):
	// the end does not keep its registration.
	ReadOnce(p []byte) (int, error)
	// Write writes bufs in order; it returns once no buffer is read any
	// more, n > 0 with an error when the stream was cut inside them.
	Write(ctx context.Context, bufs ...[]byte) (int, error)
	// Accept completes a receiving end with the sending end's parameters.
	Accept(params []byte) error
	// Detail adds to the path's description ("" for nothing).
	Detail() string
	// Failed is closed when the end fails, Err saying why, also where no
	// Read or Write is under way to tell (a message already handed to the
	// NIC that could not be delivered); not when it is closed.
	Failed() <-chan struct{}
	Err() error
	Close() error
}

// rdmaLink is a channel's only link over an RDMA end.
type rdmaLink struct{ e RDMAEnd }

func (l rdmaLink) Read(p []byte) (int, error) { return l.e.Read(p) }
func (l rdmaLink) Close() error               { return l.e.Close() }
func (l rdmaLink) write(ctx context.Context, _ func() bool, bufs ...[]byte) (int, error) {
	return l.e.Write(ctx, bufs...)
}

// onceReader reads an RDMA end into buffers used once (RDMAEnd.ReadOnce).
type onceReader struct{ e RDMAEnd }

func (r onceReader) Read(p []byte) (int, error) { return r.e.ReadOnce(p) }

func (e *Endpoint) rdmaDesc() string { return "rdma " + e.opt.RDMA.Describe() }

// rdmaChannel reports whether ch runs over RDMA, and its end.
func rdmaChannel(ch *channel) (RDMAEnd, bool) {
	if ch == nil || len(ch.links) != 1 {
		return nil, false
	}
	l, ok := ch.links[0].(rdmaLink)
	return l.e, ok
}

// deviceChannel reports whether ch reads and writes payloads in device
// memory itself: an RDMA channel on a device that moves device memory.
func (e *Endpoint) deviceChannel(ch *channel) bool {
	if _, ok := rdmaChannel(ch); !ok {
		return false
	}
	moves, _ := e.opt.RDMA.GPU()
	return moves
}

// DeviceData reports whether this rank's LaneData to peer (send) and
// from peer (recv) goes over an RDMA channel that moves device memory
// while GPUDirect RDMA is not ruled out on the device (transport.DataPath).
// Safe for concurrent use; it takes no lock of the endpoint (core asks
// while it holds its communicator's).
func (e *Endpoint) DeviceData(peer int) (send, recv bool) {
	if e.opt.RDMA == nil || peer < 0 || peer >= e.size || e.downed[peer].Load() {
		return false, false
	}
	if _, direct := e.opt.RDMA.GPU(); !direct {
		return false, false
	}
	return e.deviceChannel(e.out[peer].Load()), e.devIn[peer].Load() != nil
}

// SendDevice sends a LaneData payload in device memory over peer's RDMA
// channel, which registers it with the NIC or stages it itself; the
// payload is never gathered with its frame's prefix. Without such a
// channel it fails with transport.ErrNoDevicePath. Safe for concurrent
// use.
func (e *Endpoint) SendDevice(ctx context.Context, peer int, h *transport.Header, payload []byte) error {
	return e.send(ctx, peer, transport.LaneData, h, payload, nil, true)
}

// listenRDMA makes the receiving end of an RDMA channel from peer and
// keeps it until the peer's result; false when the endpoint closes.
func (e *Endpoint) listenRDMA(from int) (evRDMAListening, bool) {
	end, params, err := e.opt.RDMA.Listen(from)
	if err != nil {
		return evRDMAListening{peer: from, err: err}, true
	}
	e.mu.Lock()
	if !e.accepting || e.rdmaPending == nil {
		e.mu.Unlock()
		end.Close()
		return evRDMAListening{}, false
	}
	if old := e.rdmaPending[from]; old != nil {
		old.Close()
	}
	e.rdmaPending[from] = end
	e.mu.Unlock()
	return evRDMAListening{peer: from, qp: params}, true
}

// dialRDMA connects a sending end to the queue pair peer offered.
func (e *Endpoint) dialRDMA(to int, qp []byte) evAttached {
	ev := evAttached{peer: to, kind: pathRDMA}
	if e.opt.RDMA == nil {
		ev.err = errors.New("this rank has no RDMA device")
		return ev
	}
	end, params, err := e.opt.RDMA.Dial(to, qp)
	if err != nil {
		ev.err = err
		return ev
	}
	ev.ch, ev.qp = newChannel(to, e.rdmaDesc(), []link{rdmaLink{end}}), params
	e.rdmaOn.Store(true)
	return ev
}

// Prepare tells the RDMA device, where a channel runs over it, that the
// pieces of b are about to be sent or received, so that it registers b
// whole once (transport.Registrar). Safe for concurrent use.
func (e *Endpoint) Prepare(b []byte) {
	if len(b) > 0 && e.rdmaOn.Load() {
		e.opt.RDMA.Prepare(b)
	}
}

// Forget tells the RDMA device that b's memory is about to be given back,
// so that no registration of it outlives it (transport.Registrar). Not
// gated on a channel being up: a registration made over one that has
// since closed must go too. Safe for concurrent use.
func (e *Endpoint) Forget(b []byte) {
	if len(b) > 0 && e.opt.RDMA != nil {
		e.opt.RDMA.Forget(b)
	}
}

// Registers reports whether the endpoint has an RDMA device, whose
// channels register memory (transport.Registrar). Safe for concurrent use.
func (e *Endpoint) Registers() bool { return e.opt.RDMA != nil }

// watchRDMA reports peer lost when the sending end of its channel ch
// fails while no send waits on it: a message handed to the NIC that could
// not be delivered (the peer's queue pair is gone or unreachable) is told
// by no reader (the channel has none here) and by no later send if none
// comes, while receives from peer would wait for data that never comes.
// It returns once ch is closed.
func (e *Endpoint) watchRDMA(peer int, ch *channel, end RDMAEnd) {
	e.afterStart(func() {
		select {
		case <-end.Failed():
			if !ch.quiet.Load() && !e.closed.Load() {
				e.report(peer, fmt.Errorf("bulk: send to rank %d over %s: %w", peer, ch.desc, end.Err()))
			}
		case <-ch.dead:
		}
	})
}

// acceptRDMA completes the receiving end offered to peer with the
// sender's parameters and reads it.
func (e *Endpoint) acceptRDMA(from int, qp []byte) {
	e.mu.Lock()
	end := e.rdmaPending[from]
	delete(e.rdmaPending, from)
	e.mu.Unlock()
	if end == nil {
		return
	}
	if err := end.Accept(qp); err != nil {
		// The sender's channel is fixed already: its sends fail once its
		// wait for credits ends, and the departure follows.
		end.Close()
		e.log.Warn("nexar: bulk: accepting the RDMA channel failed", "rank", e.self, "peer", from, "err", err)
		return
	}
	e.rdmaOn.Store(true)
	e.startReader(from, newChannel(from, e.rdmaDesc(), []link{rdmaLink{end}}))
}

// rdmaClose closes the receiving ends never accepted and the device (once
// every channel on it is closed).
func (e *Endpoint) rdmaClose() {
	e.mu.Lock()
	pending := e.rdmaPending
	e.rdmaPending = nil
	e.mu.Unlock()
	for _, end := range pending {
		end.Close()
	}
	if e.opt.RDMA != nil {
		if err := e.opt.RDMA.Close(); err != nil {
			e.log.Warn("nexar: bulk: closing the RDMA device", "rank", e.self, "err", err)
		}
	}
}

// rdmaBroken turns a failed send on an RDMA channel into the peer's loss:
// unlike a socket, a queue pair in error does not end the peer's side of
// the channel, so nobody else would report it.
func (e *Endpoint) rdmaBroken(peer int, ch *channel, err error) {
	if _, ok := rdmaChannel(ch); ok {
		e.report(peer, fmt.Errorf("bulk: send to rank %d over %s: %w", peer, ch.desc, err))
	}
}
