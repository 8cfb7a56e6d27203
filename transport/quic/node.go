// Package quictransport is the QUIC implementation of transport.Endpoint
// (import path .../transport/quic), built on quic-go.
//
// A rank calls Listen early, advertises Addr and its Identity's fingerprint
// through the rendezvous, then calls Connect with the peer table. Every pair
// of ranks shares one QUIC connection (the lower rank dials), authenticated
// by TLS 1.3 in both directions with each side pinning the other's
// certificate fingerprint; a stranger cannot complete the handshake. After
// TLS the dialer names its rank in a small hello that the listener checks
// against the certificate it pinned.
//
// Each lane is one long-lived unidirectional stream per direction, opened on
// first use, carrying frames of transport/internal/frame; one goroutine per
// inbound (peer, lane) stream calls the Handler, so a slow handler applies
// QUIC flow control to that lane only. The connection window is sized so
// that a stalled lane cannot starve the others.
//
// Between hosts a pair has more connections for LaneData only (stripes,
// Options.DataConns). A LaneData payload of stripeMin or more to such a
// peer travels in parts (parts.go): the data lane stream carries the frame
// prefix and the split, and part i travels on further connection i+1,
// each connection within its own congestion window. On a clean link the
// parts are plain slices of at least partMin bytes, one after the other on
// a long-lived stream per connection. Once the pair has lost packets they
// are of at least lossyPartMin bytes and a third as many again are
// Reed-Solomon parity, each part on a stream of its own: the receiver
// completes the message from the first k parts to arrive, cancels the
// streams of the rest, and tells the sender (a done datagram on four
// connections of the pair), whose Send then stops waiting for them. The
// receiver assembles at most assemblyWindow messages of a pair at once and
// delivers them in the order of their frames on the data lane stream.
// Losing any stripe closes the pair's first connection: the peer is lost.
//
// Close is graceful and bounded: the closer ends every lane stream to every
// live peer with a goodbye frame and a FIN (opening the lanes it never
// used), keeps reading, and waits up to Options.CloseTimeout for each peer
// to acknowledge. A peer that has read the goodbye on all its lanes from the
// closer (so every earlier frame went through its Handler) reports a
// *transport.PeerDownError with cause transport.ErrPeerClosed and then
// closes the connection with application code 4 (drained), which is the
// acknowledgement. A connection that ends any other way is an abrupt loss.
//
// Future bulk path: one quic-go connection tops out near 0.6 GB/s on a small
// host, so a later bulk transport (parallel TCP sockets authorised over this
// control plane, shared memory on one host) will implement
// transport.Endpoint itself, reuse transport/internal/frame for its wire
// format, and be chosen per peer by a composite Endpoint that routes LaneData
// to it and keeps control, heartbeats and RPC on QUIC.
package quictransport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/transport"
)

// DefaultIdleTimeout is Options.IdleTimeout's default.
const DefaultIdleTimeout = 5 * time.Second

// Options configures a Node. The zero value of every field selects the
// documented default.
type Options struct {
	// slowReply and slowRead (tests) hold this node's first hello reply,
	// and its first read of a reply, that long, as a starved process
	// would.
	slowReply, slowRead time.Duration

	// BindAddr is the UDP address to listen on. Default ":0" (every
	// interface, a free port).
	BindAddr string
	// IdleTimeout is how long a connection may stay silent before it is
	// declared dead; keep-alives are sent every IdleTimeout/3. Default 5s.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds one TLS handshake plus hello. Default 10s.
	HandshakeTimeout time.Duration
	// CloseTimeout bounds the graceful part of Close: the wait for every
	// peer to read what this endpoint sent and acknowledge its goodbye.
	// Past it the connections are closed at once, and peers that have not
	// drained see an abrupt loss. Default 2s.
	CloseTimeout time.Duration
	// MaxStreamWindow is the flow-control window of one lane stream.
	// Default 16 MiB.
	MaxStreamWindow uint64
	// MaxConnWindow is the flow-control window of one connection. Default
	// and minimum: transport.NumLanes * MaxStreamWindow, so that lanes whose
	// handlers stall cannot use up the window of the others.
	MaxConnWindow uint64
	// DataConns is how many QUIC connections a pair has (at most 32): the
	// first, which carries every lane, and DataConns-1 more across which
	// LaneData payloads of 64 KiB or more are split in parts of at least
	// 32 KiB (16 KiB once the pair has lost packets, plus a third as many
	// Reed-Solomon parity parts). One connection's window collapses under
	// random packet loss (quic-go's Cubic keeps 10-20 packets at 5% loss,
	// where Linux TCP keeps hundreds), and a message split over many
	// connections waits for its slowest part unless parity stands in for
	// it (docs/bulk-path.md, "Under loss"). The lower rank of a pair
	// chooses. Default: to a peer whose address is not a loopback address
	// (another host) 32, or 256/(ranks-1) if fewer, at least 1; to a
	// loopback address 1.
	DataConns int
	// Neighbors, when set, limits the mesh to the pairs for which it
	// reports true (a sparse topology; the layer above relays the rest):
	// only those connections are made at Connect, and a Send to another
	// rank fails with a *transport.PeerDownError. nil: every pair.
	Neighbors func(a, b int) bool

	// OnDemand, when above 0, makes connections on demand (ondemand.go):
	// Connect dials nobody, a Send dials its peer when there is no
	// connection, and at most OnDemand connections are held at once, the
	// least recently used closed (gracefully) to make room. One
	// connection per pair (DataConns is 1). Neighbors is ignored.
	OnDemand int
	// DialTimeout bounds how long a Send keeps dialling a peer it has no
	// connection to (on demand) before it reports the peer unreachable.
	// Default 10 s.
	DialTimeout time.Duration

	// lossyAlways (tests) codes every striped message as on a lossy link.
	lossyAlways bool
}

const (
	maxStripes       = 32
	defaultDataConns = 32
	// maxDataConnsTotal bounds the default's data connections per rank:
	// a large mesh gets fewer per peer.
	maxDataConnsTotal = 256
	// stripeMin is the smallest LaneData payload split across a pair's
	// data connections; smaller ones travel whole on the first.
	stripeMin = 64 << 10
	// partMin is the smallest part of a split payload: a payload of n
	// bytes uses n/partMin of the pair's further connections if that is
	// fewer. On a clean link parts of 32 KiB fill 16 connections with a
	// 512 KiB message: more, smaller parts only cost CPU. Once the pair's
	// connections have lost more than 1 packet in lossyRatio, data parts
	// go down to lossyPartMin (every connection's window is small then,
	// and a part that fits in one window needs no second round trip) and
	// parity parts join them (partsOf).
	partMin      = 32 << 10
	lossyPartMin = 16 << 10
)

func (o Options) withDefaults() Options {
	if o.BindAddr == "" {
		o.BindAddr = ":0"
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 2 * time.Second
	}
	if o.MaxStreamWindow == 0 {
		o.MaxStreamWindow = 16 << 20
	}
	if min := uint64(transport.NumLanes) * o.MaxStreamWindow; o.MaxConnWindow < min {
		o.MaxConnWindow = min
	}
	o.DataConns = min(o.DataConns, maxStripes)
	if o.OnDemand > 0 {
		o.DataConns, o.Neighbors = 1, nil
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	return o
}

// stripesTo says how many connections carry LaneData to a peer at addr in
// a mesh of size ranks.
func (o Options) stripesTo(addr *net.UDPAddr, size int) int {
	if o.DataConns > 0 {
		return o.DataConns
	}
	if addr.IP.IsLoopback() {
		return 1
	}
	return max(1, min(defaultDataConns, maxDataConnsTotal/max(1, size-1)))
}

func (o Options) quicConfig() *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           o.HandshakeTimeout,
		MaxIdleTimeout:                 o.IdleTimeout,
		KeepAlivePeriod:                o.IdleTimeout / 3,
		InitialStreamReceiveWindow:     o.MaxStreamWindow,
		MaxStreamReceiveWindow:         o.MaxStreamWindow,
		InitialConnectionReceiveWindow: o.MaxConnWindow,
		MaxConnectionReceiveWindow:     o.MaxConnWindow,
		// One bidirectional stream (the hello) and one stream per lane,
		// ever: their credit is never released, so a peer cannot open
		// more. A further data connection opens a stream per part, whose
		// credit the receiver releases as each ends (partStreams at once).
		MaxIncomingStreams:         1,
		MaxIncomingUniStreams:      int64(transport.NumLanes + partStreams),
		RequireStreamCreditRelease: true,
		// Datagrams are the tail probes of striped parts (see
		// writePart); what arrives is read and dropped.
		EnableDatagrams: true,
	}
}

// Peer is one row of the peer table from the rendezvous (transport.Peer).
type Peer = transport.Peer

// Node owns one UDP socket and the QUIC transport on it. Listen, Addr and
// Close are safe for concurrent use; Connect may be called once.
type Node struct {
	id    *Identity
	opt   Options
	udp   *net.UDPConn
	tr    *quic.Transport
	ln    *quic.Listener
	qconf *quic.Config

	slowed atomic.Bool // the first hello reply or read of one was held (Options.slowReply, slowRead)

	mu        sync.Mutex
	ep        *endpoint // set by Connect; nil before
	connected bool
	closed    bool
}

// Listen binds the UDP socket now, so its port can be advertised before the
// peer table is known. Incoming handshakes are refused until Connect.
func Listen(id *Identity, opt Options) (*Node, error) {
	if id == nil {
		return nil, errors.New("quic: nil identity")
	}
	opt = opt.withDefaults()
	ua, err := net.ResolveUDPAddr("udp", opt.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("quic: bind address %q: %w", opt.BindAddr, err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("quic: listen on %q: %w", opt.BindAddr, err)
	}
	n := &Node{id: id, opt: opt, udp: udp, tr: &quic.Transport{Conn: udp}, qconf: opt.quicConfig()}
	n.ln, err = n.tr.Listen(ServerTLSConfig(id, n.verifyClient), n.qconf)
	if err != nil {
		n.tr.Close()
		udp.Close()
		return nil, fmt.Errorf("quic: listen: %w", err)
	}
	return n, nil
}

// Addr returns the bound UDP address.
func (n *Node) Addr() net.Addr { return n.udp.LocalAddr() }

// verifyClient accepts a client certificate only if it is pinned for a rank
// below ours (only those dial us), or any other rank on demand.
func (n *Node) verifyClient(fp [32]byte) error {
	n.mu.Lock()
	e := n.ep
	n.mu.Unlock()
	if e == nil {
		return errors.New("quic: not connecting yet")
	}
	found := false
	below := e.self // only lower ranks dial, but on demand
	if e.od != nil {
		below = len(e.peers)
	}
	for r := 0; r < below; r++ {
		if r == e.self {
			continue
		}
		if Equal(fp, e.peers[r].Fingerprint) {
			found = true // no early exit: constant time over the table
		}
	}
	if !found {
		return fmt.Errorf("quic: unknown client certificate %x", fp[:8])
	}
	return nil
}

// Close releases the socket and, if Connect succeeded, the endpoint. It is
// idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	e := n.ep
	n.mu.Unlock()
	if e != nil {
		return e.Close()
	}
	n.closeSocket()
	return nil
}

func (n *Node) closeSocket() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	n.mu.Unlock()
	// Outside n.mu: closing the transport waits for handshakes in
	// progress, whose verifyClient takes n.mu.
	n.ln.Close()
	n.tr.Close()
	n.udp.Close()
}

// Connect builds the full mesh described by peers (one row per rank 0..n-1,
// in any order; the row for self must carry this node's fingerprint) and
// returns once every connection is up. h and down serve this rank. On error
// the Node is closed. The endpoint's Close also closes the Node.
func (n *Node) Connect(ctx context.Context, self int, peers []Peer, h transport.Handler, down transport.DownHandler) (transport.Endpoint, error) {
	table := make([]Peer, len(peers))
	seen := make([]bool, len(peers))
	for _, p := range peers {
		if p.Rank < 0 || p.Rank >= len(peers) || seen[p.Rank] {
			n.Close()
			return nil, fmt.Errorf("quic: peer table: rank %d duplicated or out of range [0,%d)", p.Rank, len(peers))
		}
		seen[p.Rank] = true
		table[p.Rank] = p
	}
	if self < 0 || self >= len(table) {
		n.Close()
		return nil, fmt.Errorf("quic: self rank %d out of range [0,%d)", self, len(table))
	}
	if !Equal(table[self].Fingerprint, n.id.Fingerprint) {
		n.Close()
		return nil, fmt.Errorf("quic: peer table: rank %d's fingerprint is not this node's", self)
	}
	n.mu.Lock()
	if n.connected || n.closed {
		n.mu.Unlock()
		return nil, errors.New("quic: Connect called twice or after Close")
	}
	n.connected = true
	e := newEndpoint(n, self, table, h, down)
	n.ep = e
	n.mu.Unlock()

	if err := e.connect(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}
