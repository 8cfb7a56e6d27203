// Package transport moves framed messages between the ranks of a mesh. It
// knows nothing of collectives: a message is a fixed-size opaque header plus
// a payload, delivered in order per (peer, lane).
//
// Implementations: transport/mem (in-process, for tests) and transport/quic
// (quic-go, TLS 1.3 with mutual authentication and pinned certificates).
// Both pass the conformance suite in transport/transporttest.
package transport

import (
	"context"
	"errors"
)

// Lane separates kinds of traffic so that control and heartbeats never wait
// behind bulk data (each lane is its own stream on QUIC).
type Lane uint8

const (
	LaneControl   Lane = iota // small control messages, collective signatures
	LaneHeartbeat             // liveness only
	LaneData                  // collective and point-to-point payloads
	LaneRPC                   // reserved for RPC
	NumLanes
)

func (l Lane) String() string {
	switch l {
	case LaneControl:
		return "control"
	case LaneHeartbeat:
		return "heartbeat"
	case LaneData:
		return "data"
	case LaneRPC:
		return "rpc"
	}
	return "lane?"
}

// HeaderSize is the size of the opaque per-message header that the layer
// above (core) uses for matching; the transport carries it verbatim.
const HeaderSize = 48

// Header is opaque to the transport.
type Header [HeaderSize]byte

// MaxPayload bounds one message's payload; larger transfers are chunked by
// the layer above. Receivers reject larger lengths before allocating.
const MaxPayload = 64 << 20

// Handler receives every inbound message. It is called from one goroutine
// per (peer, lane), so messages of one (peer, lane) arrive in order; it may
// block, which applies back-pressure to that peer and lane only. The payload
// belongs to the handler.
type Handler func(from int, lane Lane, h *Header, payload []byte)

// PlaceFunc, when a transport is given one, lets the layer above receive a
// LaneData payload straight into its final buffer. The transport calls it
// once a message's header has arrived and before reading its n payload
// bytes. A nil dst means "not expected yet": the payload then goes to the
// Handler as usual. Otherwise len(dst) == n, the transport reads the payload
// into dst and calls done exactly once, with nil or the error that cut the
// payload short, and does not call the Handler for that message. It is
// called from the goroutine that reads from the peer, like the Handler.
type PlaceFunc func(from int, h *Header, n int) (dst []byte, done func(err error))

// DownHandler is told, once per peer, that the peer's connection failed.
type DownHandler func(peer int, err error)

// Endpoint is one rank's view of a connected mesh. All methods are safe for
// concurrent use.
type Endpoint interface {
	Rank() int
	Size() int
	// Send queues one message for peer on lane. It blocks while the lane is
	// congested (until ctx ends) and does not retain payload after return.
	// Sending to oneself is allowed and loops back through the Handler.
	Send(ctx context.Context, peer int, lane Lane, h *Header, payload []byte) error
	// Close tears down every connection and goroutine; idempotent.
	Close() error
}

// ErrClosed is returned by Send after Close.
var ErrClosed = errors.New("transport: endpoint closed")

// ErrPeerClosed is the Cause of a graceful departure: the peer closed its
// endpoint and every message it sent before Close has been delivered to the
// Handler, in order, before the DownHandler is told (with a *PeerDownError
// for which errors.Is(err, ErrPeerClosed) holds). Any other cause is an
// abrupt loss, after which messages may have been lost. Sends to a departed
// peer fail with a *PeerDownError carrying the same cause.
var ErrPeerClosed = errors.New("transport: peer closed its endpoint")

// ErrDeclaredDown is the Cause (under a *PeerDownError) when the peer
// closed the connection because its layer above declared this rank down
// (Abandon): this rank was stopped or cut off long enough to be given up
// on, and the peer talks to it no more. The error's text carries the
// peer's reason.
var ErrDeclaredDown = errors.New("transport: the peer declared this rank down")

// PeerDownError says that a peer's connection failed or was closed.
type PeerDownError struct {
	Peer  int
	Cause error
}

func (e *PeerDownError) Error() string {
	return "transport: peer " + itoa(e.Peer) + " is down: " + e.Cause.Error()
}

func (e *PeerDownError) Unwrap() error { return e.Cause }

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	neg := i < 0
	if neg {
		i = -i
	}
	var b [20]byte
	n := len(b)
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		n--
		b[n] = '-'
	}
	return string(b[n:])
}
