// Package transport moves framed messages between the ranks of a mesh. It
// knows nothing of collectives: a message is a fixed-size opaque header plus
// a payload, delivered in order per (peer, lane).
//
// Endpoint is what every transport provides; DataPath is the contract core
// drives (Endpoint plus progress sends, device data and the path's
// declared Caps; how a waiter polls it is the optional Poller). Implementations: transport/mem (in-process, for tests; a
// DataPath), transport/quic (quic-go, TLS 1.3 with mutual authentication
// and pinned certificates; an Endpoint) and transport/bulk (a DataPath that
// carries LaneData over shared-memory rings or TCP and the rest over a
// wrapped Endpoint). All pass the conformance suite in
// transport/transporttest, the DataPaths its RunDataPath too.
//
// A Builder (mesh.go; package transport/mesh implements it) assembles
// them into one rank's Mesh, so that core names no concrete transport;
// optional behaviour is a small interface found by type assertion, as
// net/http's http.Flusher is: Poller on a path, and Broadcaster,
// Forwarder, OnDemand and RingHolder on a Mesh's parts (As).
package transport

import (
	"context"
	"errors"
	"time"
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

// HeaderSize is the size of the per-message header that the layer above
// (core) uses for matching; the transport carries it verbatim.
const HeaderSize = 56

// Header is opaque to the transport but for its first byte, the owner: a
// transport may send messages of its own through the endpoint it wraps
// (transport/bulk negotiates its paths over the QUIC mesh's LaneControl)
// and marks them with an owner byte at or above OwnerTransport; the layer
// above keeps byte 0 below it (core writes its wire version there). A
// wrapping transport consumes the messages it marked and passes the rest
// up unchanged.
type Header [HeaderSize]byte

// OwnerTransport is the lowest owner byte (Header[0]) of a message that a
// transport sends for itself; values below it belong to the layer above.
const OwnerTransport = 0x80

// MaxPayload bounds one message's payload; larger transfers are chunked by
// the layer above. Receivers reject larger lengths before allocating.
const MaxPayload = 64 << 20

// Handler receives every inbound message. It is called from one goroutine
// per (peer, lane), so messages of one (peer, lane) arrive in order; it may
// block, which applies back-pressure to that peer and lane only. The payload
// belongs to the handler.
type Handler func(from int, lane Lane, h *Header, payload []byte)

// Peer is one row of the peer table from the rendezvous: where a rank's
// mesh node listens and the fingerprint of its TLS identity, which its
// peers pin (internal/identity).
type Peer struct {
	Rank        int
	Addr        string   // host:port of the peer's node; needed for ranks above self
	Fingerprint [32]byte // the peer's identity fingerprint
	// Host names the host the peer runs on, as it told the seed (equal
	// for ranks on one host); "" when it did not say.
	Host string
}

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

// Caps is what a DataPath declares that it can do; the layer above
// branches on the declaration, never on the endpoint's type.
type Caps struct {
	// Poll: StartPolling can return a poll function for a peer whose
	// LaneData arrives over a channel the waiting goroutine may progress
	// itself (a shared-memory ring, a TCP connection), and Waiting
	// changes how a ring wakes its reader.
	Poll bool
	// ProgressSend: SendProgress runs its progress function while a
	// LaneData send waits for room; without it SendProgress is Send.
	ProgressSend bool
	// LazyData: LaneData paths to some peers are made on their first
	// message, so DataUnused may report true.
	LazyData bool
	// Presence: PeerPresence can tell, for some peers (those whose data
	// this rank polls for over shared memory), whether they are polling
	// or asleep.
	Presence bool
	// Device: DeviceData may report true for some peers, whose LaneData
	// channels move payloads in GPU device memory themselves.
	Device bool
}

// Presence is what a peer last published of how it waits for data: a
// goroutine of it is in a call, polling for data (Polling; Beat then
// advances every few microseconds while it polls, so a Beat that stops
// moving means the peer is off the CPU, or busy in the call), or sleeps
// until data arrives (Asleep); neither: it runs its own code. CPU is the
// CPU it ran on then (-1: unknown): while the reader runs on that CPU, the
// peer does not. A hint for how long to spin and whether to yield, never
// for correctness.
type Presence struct {
	Polling, Asleep bool
	CPU             int
	Beat            uint32
	// InProcess: the peer is a rank of this very process, a goroutine of
	// this runtime; yielding the thread (the OS's CPU) does not make it
	// run, so CPU-sharing rules do not apply to it.
	InProcess bool
}

// DataPath is the contract between core and the path that carries its
// messages: an Endpoint plus what core needs to drive a data path well.
// Every implementation (transport/mem, transport/relay, and
// transport/bulk over the QUIC mesh with shared-memory rings or TCP)
// implements all of it, doing nothing where its Caps says it cannot, and
// transporttest.RunDataPath checks that each does what it declares. How a
// waiter may poll and sleep on a path is the optional Poller; the other
// optional interfaces (mesh.go) are found on a Mesh's parts. All methods
// are safe for concurrent use.
type DataPath interface {
	Endpoint
	// Caps declares the optional behaviours; constant for the endpoint's
	// life.
	Caps() Caps
	// SendProgress is Send on LaneData that runs progress (a poll
	// function from StartPolling) while it waits for room, so that one
	// goroutine keeps both directions of an exchange moving; with
	// !Caps().ProgressSend it is Send.
	SendProgress(ctx context.Context, peer int, h *Header, payload []byte, progress func() bool) error
	// PeerAlive reports whether peer's process is known to be running
	// now, so that its death would reach the DownHandler at once: it is
	// on this host and watched, or (transport/bulk) a TCP connection to it
	// is established and its kernel answers on it (a dead process's
	// kernel closes its connections). False where the path cannot tell
	// (no watch, no such connection): silence is then all the layer above
	// can judge by.
	PeerAlive(peer int) bool
	// SharedMemory reports whether LaneData to peer goes over shared
	// memory (where polling and spinning pay off).
	SharedMemory(peer int) bool
	// Paths names the path that carries LaneData to each peer, for
	// diagnostics ("shm 8 MiB ring", "tcp x2 tls", "quic", "mem").
	Paths() map[int]string
	// DataUnused reports whether no LaneData message was ever sent, or is
	// being sent, to peer; a message that must only stay behind LaneData
	// may then take another lane. Never true without Caps().LazyData.
	DataUnused(peer int) bool
	// DeviceData reports whether LaneData to peer (send) and from peer
	// (recv) travels over a channel that moves payloads in GPU device
	// memory itself, never with a host access to it (the NIC registers
	// the memory, GPUDirect RDMA, else the channel stages it), while the
	// NIC may still reach device memory directly: once every way of
	// registering it failed for good both are false, so that the caller
	// stages in a better way of its own. With send, SendDevice takes a
	// payload in device memory; with recv, the PlaceFunc may return device
	// memory as the destination of a message from peer. Both false without
	// Caps().Device; they may change while a path is set up or lost.
	DeviceData(peer int) (send, recv bool)
	// SendDevice is SendProgress (without progress) of a payload in GPU
	// device memory, which the path reads without a host access. It fails
	// with an error wrapping ErrNoDevicePath, having sent nothing, where
	// the channel to peer cannot read device memory.
	SendDevice(ctx context.Context, peer int, h *Header, payload []byte) error
	// Abandon gives up on peer, which the layer above declared down
	// (cause says why): the DownHandler is told once, as for any loss, and
	// where the path holds connections to peer they are closed, so that a
	// send or receive blocked on it ends at once and peer, if alive,
	// learns it was declared down (ErrDeclaredDown).
	Abandon(peer int, cause error)
}

// Poller is the scheduling group of a DataPath, optional as net/http's
// http.Flusher is for a ResponseWriter: how a goroutine that waits for a
// peer's data may poll for it, sleep on it and yield its core. core asks
// for it once, by type assertion, when a node starts, and waits the plain
// way (the Handler delivers) on a path without it (transport/mem).
// Caps.Poll and Caps.Presence declare what a Poller can do for some peers.
type Poller interface {
	// StartPolling lets the calling goroutine, about to wait for data
	// from peer, consume what arrived itself: poll delivers the frames it
	// completes and reports whether it consumed anything; stop ends the
	// polling (call it once). Both are nil when peer's data cannot be
	// polled (always, with !Caps().Poll).
	StartPolling(peer int) (poll func() bool, stop func())
	// Waiting tells the path that the caller is about to block until
	// data from peer is delivered; call done when the wait ends. A no-op
	// where it changes nothing.
	Waiting(peer int) (done func())
	// Await sleeps until data from peer may have arrived, d passes or
	// done is closed, and then consumes what arrived (as poll does); the
	// sender wakes the sleeping thread itself, which costs microseconds
	// where a hand-off through a reader goroutine costs a scheduler round
	// trip. It reports false, without sleeping, where it cannot (no
	// Caps().Poll, no pollable channel to peer, or that channel closed):
	// the caller then blocks as usual (Waiting). Every Await ends by d.
	// done is checked once the sleep is announced (a completion that a
	// poll of another goroutine reports wakes the sleeper); it is a
	// function, so that a waiter that never sleeps makes no channel.
	Await(peer int, done func() bool, d time.Duration) bool
	// PeerPresence reads what peer last published of its presence; ok is
	// false where the path cannot tell (always, with !Caps().Presence).
	PeerPresence(peer int) (p Presence, ok bool)
	// Oversubscribed reports whether this host runs more ranks than it
	// has cores, so that waiters should yield the core while they spin.
	Oversubscribed() bool
}

// NoPoller is the scheduling group of a path that has none (transport/mem,
// a relay over such a path): nothing to poll or sleep on, the Handler
// delivers. Safe for concurrent use.
type NoPoller struct{}

func (NoPoller) StartPolling(int) (func() bool, func())     { return nil, nil }
func (NoPoller) Waiting(int) func()                         { return func() {} }
func (NoPoller) Await(int, func() bool, time.Duration) bool { return false }
func (NoPoller) PeerPresence(int) (Presence, bool)          { return Presence{}, false }
func (NoPoller) Oversubscribed() bool                       { return false }

// ErrNoDevicePath is wrapped by SendDevice's error when the channel to
// the peer cannot read device memory: the caller copies the payload to
// host memory and sends that.
var ErrNoDevicePath = errors.New("transport: the path to the peer does not carry device memory")

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
