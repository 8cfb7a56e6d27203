// Package bulk is the bulk data path: a composite transport.Endpoint that
// keeps control, heartbeat and RPC lanes on an inner endpoint (QUIC) and
// moves every LaneData message to a peer over that peer's bulk channel when
// one exists, so large payloads are not bound by one quic-go connection.
//
// Channels are per direction. Their kind is negotiated when the mesh
// starts, and a pair's data waits until its channel exists (a ring is made
// on the first message), so no message overtakes another of its (peer,
// lane) by changing channel:
//
//   - same host (equal host ids, and the producer can actually open the
//     consumer's segment): a single-producer single-consumer ring in a 0600
//     file under /dev/shm, mapped by both sides and unlinked once both have
//     it; waiting spins briefly and then sleeps on a futex. The ring is
//     made when the first message to the peer is sent (the send waits for
//     it), sized so that the rings one process creates stay within
//     Options.RingBudget;
//   - other hosts where both ranks have an active RDMA device
//     (Options.RDMA): a queue pair per direction (rdmachan.go,
//     transport/rdma);
//   - otherwise: N parallel TCP connections, TLS 1.3 pinned to the same
//     certificates as QUIC by default (plaintext on request), authorised by
//     an HMAC of a one-time nonce the receiver sent over the authenticated
//     QUIC control lane; large messages are striped across them;
//   - else the inner endpoint.
//
// The negotiation travels on LaneControl with owner byte (header byte 0)
// 0xB5, a transport-owned value (transport.OwnerTransport), and is
// consumed here; docs/bulk-path.md and docs/wire-format.md describe it.
package bulk

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fxamacker/cbor/v2"

	"github.com/nexar-go/nexar/internal/hostid"
	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
	"github.com/nexar-go/nexar/transport/internal/record"
	nquic "github.com/nexar-go/nexar/transport/quic"
)

// Mode selects which bulk channels may be used.
type Mode int

const (
	ModeAuto Mode = iota // shared memory on one host, TCP between hosts
	ModeOff              // everything on the inner endpoint
	ModeTCP              // TCP only, even on one host
	ModeSHM              // shared memory only; other pairs use the inner endpoint
	ModeRDMA             // RDMA only, even on one host; other pairs use the inner endpoint
)

// ParseMode reads "auto", "off", "tcp", "shm" or "rdma" (empty means auto).
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return ModeAuto, nil
	case "off", "quic":
		return ModeOff, nil
	case "tcp":
		return ModeTCP, nil
	case "shm":
		return ModeSHM, nil
	case "rdma":
		return ModeRDMA, nil
	}
	return 0, fmt.Errorf("bulk: unknown mode %q (want auto, off, tcp, shm or rdma)", s)
}

func (m Mode) String() string {
	return [...]string{"auto", "off", "tcp", "shm", "rdma"}[m]
}

func (m Mode) shm() bool  { return m == ModeAuto || m == ModeSHM }
func (m Mode) tcp() bool  { return m == ModeAuto || m == ModeTCP }
func (m Mode) rdma() bool { return m == ModeAuto || m == ModeRDMA }

// Defaults.
const (
	DefaultConns    = 2
	DefaultRingSize = 8 << 20
	// DefaultRingBudget bounds the rings one process creates (those it
	// receives on): with more local peers than it holds at
	// DefaultRingSize, each ring is smaller.
	DefaultRingBudget = 64 << 20
	minRing           = 64 << 10
	// DefaultRingTimeout is Options.RingTimeout's default; past it the
	// send fails (a later one waits again).
	DefaultRingTimeout = 30 * time.Second
	// DefaultRemoteMin: below it the ring's two copies cost less than the
	// system call and the wait for the receiver's acknowledgement.
	DefaultRemoteMin = 256 << 10
	maxRing          = 1 << 30
	// ctlMagic is the owner byte (header byte 0) of bulk's own messages
	// on the inner endpoint: at or above transport.OwnerTransport, which
	// the layer above never writes there.
	ctlMagic = transport.OwnerTransport | 0x35
	ctlMax   = 4096
)

// Options configures an Endpoint. Zero values select the defaults.
type Options struct {
	Mode Mode
	// Conns is the number of TCP connections per peer and direction.
	// Default DefaultConns, at most 16.
	Conns int
	// Plaintext turns TLS off on the TCP connections (trusted networks
	// only: data can then be read and, by an on-path attacker, altered).
	Plaintext bool
	// RingSize is the largest capacity of one shared-memory ring, a power
	// of two. Default DefaultRingSize.
	RingSize int
	// RingBudget bounds the total capacity of the rings this process
	// creates, one per local peer that sends to it: rings are halved (down
	// to 64 KiB) until one per local peer fits, and a peer whose ring does
	// not fit any more sends over TCP or QUIC. Default DefaultRingBudget.
	RingBudget int
	// BindHost is the IP the TCP listener binds; AdvertiseHost is what
	// peers dial. Defaults: AdvertiseHost, and "127.0.0.1". The listener
	// is bound when a peer first needs a TCP channel to this rank (another
	// host, or no shared memory), so a job on one host has none.
	BindHost, AdvertiseHost string
	// Identity and Fingerprints (by rank) are the QUIC mesh's: TLS on the
	// TCP connections pins the same certificates. Required unless
	// Plaintext or Mode is ModeOff/ModeSHM.
	Identity     *nquic.Identity
	Fingerprints [][32]byte
	// HostID identifies this host for shared memory; default HostID().
	HostID string
	// CloseTimeout bounds how long Close waits for a frame in flight
	// before it says goodbye on a channel. Default 2 s.
	CloseTimeout time.Duration
	// RingTimeout bounds how long a send waits for a peer to make the
	// shared-memory ring it asked for. Default 30 s.
	RingTimeout time.Duration
	Logger      *slog.Logger
	// Place, when set, receives LaneData payloads straight into their
	// destination (see transport.PlaceFunc).
	Place transport.PlaceFunc
	// Forwards says that the layer above forwards some of what it reads to
	// other ranks (a relay, transport/relay): every shared-memory ring then
	// wakes its reader on each write, as while a caller waits for that
	// peer, where a ring left to the callers that poll it sleeps up to
	// 200 ms between reads on a host with more ranks than cores, which a
	// frame to forward would wait at every hop.
	Forwards bool
	// Peers, when set, names the ranks this endpoint talks to (a sparse
	// topology's neighbours; the layer above relays to the others): only
	// those are offered a channel at Start, and another rank's LaneData,
	// which never comes, would stay on the inner endpoint. nil: every
	// rank.
	Peers func(rank int) bool
	// RemoteMin is the smallest payload that a shared-memory ring carries
	// as a remote frame, copied by the receiver straight out of the
	// sender's memory (one copy instead of two) when the two processes may
	// do so. Default DefaultRemoteMin; negative: never.
	RemoteMin int
	// RDMA, when set, is the RDMA device data channels to peers on other
	// hosts (or every peer, with ModeRDMA) use where the peer has one
	// too. The endpoint closes it.
	RDMA RDMA
}

// HostID returns an identifier of this host and boot (internal/hostid.Local,
// where it lives so that hier need not import a transport).
func HostID() string { return hostid.Local() }

// Endpoint is the composite endpoint. All methods are safe for concurrent
// use. Handler and DownHandler must be given to the inner endpoint; Start
// must be called once with it before Send.
type Endpoint struct {
	self, size int
	opt        Options
	log        *slog.Logger
	h          transport.Handler
	down       transport.DownHandler
	inner      transport.Endpoint
	started    chan struct{}
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup

	out    []atomic.Pointer[channel] // outbound channel per peer; nil: inner
	polled []atomic.Pointer[channel] // inbound ring channel per peer, for Poll
	// blockedOn counts, per peer, the goroutines blocked until its data is
	// delivered (Waiting), whether or not its data comes over a ring yet:
	// a ring installed later (shm on first use) takes the count over, or
	// its reader would not be woken for them.
	blockedOn []waitCount
	devIn     []atomic.Pointer[channel] // inbound device channel per peer, for DeviceData
	downed    []atomic.Bool
	closed    atomic.Bool
	once      sync.Once

	mu             sync.Mutex
	decided        []bool // outbound path fixed
	left           int    // peers not decided
	ready          chan struct{}
	paths          []string
	in             []*channel // inbound channels still reading
	bye            []error    // graceful departures waiting for the inbound channel to drain
	byeSeen        []bool     // inbound channel ended with a goodbye
	causes         []error    // why each departed peer is down
	offers         map[int]*tcpOffer
	ln             net.Listener // TCP, bound on first use (see listener)
	lnErr          error
	rings          []*ring  // every ring mapped, released at Close
	raceSync       raceSync // the race detector's view of the rings' order (racesync_on.go)
	pres           presence // this process's presence in the data rings it reads (presence.go)
	local          []bool   // peer is on this host: shared memory, its ring made on first use
	lazy           []atomic.Bool
	waits          []chan struct{} // closed once a lazy path is fixed; nil until a send asks
	ringBytes      int             // capacity of the rings this process created
	ctlWG          bool            // false once Close stops taking control messages
	probe          []byte          // what a peer reads from our memory to test cross-memory attach
	oversubscribed bool            // more ranks on this host than cores (see Start)
	using          atomic.Int64    // sends and pollers that may touch a ring (see Close)
	unuseFn        func()          // StartPolling's stop, made once

	// Sealed TCP connections (tcp.go): the buffers of their records, and
	// how they are dialed (tests tamper with the wire; nil: net.Dialer).
	records  record.Pool
	dialHook func(ctx context.Context, addr string) (net.Conn, error)

	// Same-host deaths (procwatch_linux.go). A peer whose hello or offer
	// proves it a process of this host and PID namespace (sameProc) may
	// watch this process as this one watches it: Close says goodbye to it
	// on the control lane (bye) and waits until it acknowledges (settled),
	// so that this process's exit after a graceful Close is never taken
	// for a death.
	me       procID     // this process; PID 0 when /proc cannot tell
	watch    *procWatch // made for the first same-host peer
	watchErr error      // why there is no watch
	sameProc []bool     // peer proven on this host, in this PID namespace
	// inProc[p]: peer p is a rank of this very process (its hello named
	// this process), whose presence says nothing of another process's
	// use of a CPU (PeerPresence). Set once, read without e.mu.
	inProc    []atomic.Bool
	departing []bool          // peer said bye: its exit is a departure
	exited    []error         // why peer's process is dead, once its watch said so
	drainMax  time.Duration   // how long a dead peer's ring may take to drain (procExited)
	settled   []chan struct{} // closed once peer will not call this process's exit a death
	settledOK []bool

	rpc *rpcPaths // LaneRPC channels (rpcchan.go)

	rdmaPending map[int]RDMAEnd // receiving RDMA ends offered, not accepted yet (rdmachan.go)
}

// New prepares the composite endpoint for rank self of size; h and down
// serve the layer above. The TCP listener, if any, is bound now.
func New(self, size int, opt Options, h transport.Handler, down transport.DownHandler) (*Endpoint, error) {
	if opt.Conns <= 0 {
		opt.Conns = DefaultConns
	}
	opt.Conns = min(opt.Conns, maxConns)
	if opt.RingSize <= 0 {
		opt.RingSize = DefaultRingSize
	}
	if opt.RingSize&(opt.RingSize-1) != 0 || opt.RingSize > maxRing || opt.RingSize < minRing {
		return nil, fmt.Errorf("bulk: ring size %d is not a power of two in [64 KiB, 1 GiB]", opt.RingSize)
	}
	if opt.RingBudget <= 0 {
		opt.RingBudget = DefaultRingBudget
	}
	if opt.AdvertiseHost == "" {
		opt.AdvertiseHost = "127.0.0.1"
	}
	if opt.BindHost == "" {
		opt.BindHost = opt.AdvertiseHost
	}
	if opt.HostID == "" {
		opt.HostID = HostID()
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.CloseTimeout <= 0 {
		opt.CloseTimeout = 2 * time.Second
	}
	if opt.RemoteMin == 0 {
		opt.RemoteMin = DefaultRemoteMin
	}
	if !opt.Plaintext && opt.Mode.tcp() && (opt.Identity == nil || len(opt.Fingerprints) != size) {
		return nil, errors.New("bulk: TLS on TCP needs the identity and every rank's fingerprint")
	}
	e := &Endpoint{self: self, size: size, opt: opt, log: opt.Logger, h: h, down: down,
		started: make(chan struct{}), out: make([]atomic.Pointer[channel], size), polled: make([]atomic.Pointer[channel], size), blockedOn: make([]waitCount, size), devIn: make([]atomic.Pointer[channel], size),
		downed: make([]atomic.Bool, size), decided: make([]bool, size), left: size - 1,
		ready: make(chan struct{}), paths: make([]string, size), in: make([]*channel, size),
		bye: make([]error, size), byeSeen: make([]bool, size), causes: make([]error, size), offers: map[int]*tcpOffer{}, ctlWG: true,
		local: make([]bool, size), lazy: make([]atomic.Bool, size), waits: make([]chan struct{}, size),
		sameProc: make([]bool, size), inProc: make([]atomic.Bool, size), departing: make([]bool, size), exited: make([]error, size), drainMax: drainMax, settled: make([]chan struct{}, size), settledOK: make([]bool, size),
		rpc: newRPCPaths(size), rdmaPending: map[int]RDMAEnd{}}
	for r := range e.settled {
		e.settled[r] = make(chan struct{})
	}
	for r := range size {
		if r != self && !e.talks(r) {
			e.decided[r] = true // no channel: nothing to negotiate
			e.left--
		}
	}
	if opt.Mode != ModeOff && procWatchSupported && size > 1 {
		e.me, _ = selfProcID()
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.unuseFn = func() {
		e.pres.leave()
		e.using.Add(-1)
	}
	e.probe = make([]byte, 16)
	rand.Read(e.probe)
	for r := range e.paths {
		e.paths[r] = "quic"
	}
	e.paths[self] = "loopback"
	e.decided[self] = true
	if e.left == 0 || opt.Mode == ModeOff {
		close(e.ready)
	}
	if opt.Mode.shm() && shmSupported() && size > 1 {
		if gone := sweepStaleRings(); len(gone) > 0 {
			e.log.Info("nexar: bulk: removed ring files and doorbells of dead processes", "rank", self, "files", gone)
		}
	}
	return e, nil
}

// listener returns the TCP listener, bound on first use; nil when it
// cannot be bound (the peer's data then stays on the inner endpoint) or
// the endpoint is closing.
func (e *Endpoint) listener() net.Listener {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln != nil || e.lnErr != nil || !e.ctlWG {
		return e.ln
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(e.opt.BindHost, "0"))
	if err != nil {
		e.lnErr = err
		e.log.Warn("nexar: bulk: no TCP listener; data from other hosts stays on QUIC", "rank", e.self, "err", err)
		return nil
	}
	e.ln = ln
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.acceptLoop(ln)
	}()
	return ln
}

// Handler is the transport.Handler to give the inner endpoint.
func (e *Endpoint) Handler() transport.Handler { return e.handle }

// DownHandler is the transport.DownHandler to give the inner endpoint.
func (e *Endpoint) DownHandler() transport.DownHandler { return e.peerLost }

func (e *Endpoint) Rank() int { return e.self }
func (e *Endpoint) Size() int { return e.size }

// Paths says which path carries this rank's data to each peer.
func (e *Endpoint) Paths() map[int]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := make(map[int]string, e.size)
	for r, p := range e.paths {
		if ch := e.out[r].Load(); ch != nil && ch.ring != nil && ch.remoteMin > 0 && ch.ring.remoteOK() {
			p += fmt.Sprintf(", cross-memory attach from %d KiB", ch.remoteMin>>10)
		}
		if end, ok := rdmaChannel(e.out[r].Load()); ok && end.Detail() != "" {
			p += ", " + end.Detail()
		}
		m[r] = p
	}
	return m
}

// Start negotiates a bulk channel to every peer over inner and returns once
// each peer's path is fixed. Peers that do not answer before ctx ends stay
// on inner. On error the caller closes e.
func (e *Endpoint) Start(ctx context.Context, inner transport.Endpoint) error {
	if inner == nil || inner.Size() != e.size || inner.Rank() != e.self {
		return errors.New("bulk: inner endpoint does not match")
	}
	e.inner = inner
	close(e.started)
	if e.opt.Mode == ModeOff {
		return nil
	}
	hello := e.withProc(&ctlMsg{V: 1, T: "hello", Host: e.opt.HostID, SHM: e.opt.Mode.shm() && shmSupported(), TCP: e.opt.Mode.tcp(),
		RDMA: e.opt.RDMA != nil && e.opt.Mode.rdma()})
	for r := range e.size {
		if r != e.self && e.talks(r) {
			if err := e.sendCtl(ctx, r, hello); err != nil {
				return err
			}
		}
	}
	select {
	case <-e.ready:
	case <-ctx.Done():
		e.mu.Lock()
		for r, d := range e.decided {
			if !d {
				e.decided[r] = true
				e.log.Warn("nexar: bulk: no answer from peer; its data stays on QUIC", "rank", e.self, "peer", r)
			}
		}
		e.mu.Unlock()
	case <-e.ctx.Done():
		return transport.ErrClosed
	}
	for r, p := range e.Paths() {
		e.log.Debug("nexar: data path", "rank", e.self, "peer", r, "path", p)
	}
	if e.LocalPeers()+1 > runtime.NumCPU() {
		e.mu.Lock()
		e.oversubscribed = true
		for _, r := range e.rings {
			r.yield.Store(true)
		}
		e.mu.Unlock()
	}
	return nil
}

// talks reports whether this endpoint makes channels with rank r
// (Options.Peers).
func (e *Endpoint) talks(r int) bool { return e.opt.Peers == nil || e.opt.Peers(r) }

// addRing records a mapped ring (released at Close).
func (e *Endpoint) addRing(r *ring) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rings = append(e.rings, r)
	r.yield.Store(e.oversubscribed)
	r.sync = &e.raceSync
}

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
// RDMA channels move device memory where the device was given a GPU
// runtime.
func (e *Endpoint) Caps() transport.Caps {
	shm := e.opt.Mode.shm()
	dev := false
	if e.opt.RDMA != nil {
		dev, _ = e.opt.RDMA.GPU()
	}
	return transport.Caps{Poll: shm, ProgressSend: shm, LazyData: shm, Presence: shm, Device: dev}
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

// Oversubscribed reports whether this host runs more ranks than it has
// cores, as decided at Start: waiters on its rings then yield the core
// between polls, and so should the caller's. Safe for concurrent use.
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

// LocalPeers is the number of peers whose data comes over shared-memory
// rings, made or to be made on first use: the other ranks on this host.
func (e *Endpoint) LocalPeers() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, l := range e.local {
		if l {
			n++
		}
	}
	return n
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
		// that later sends wait on.
		m := &ctlMsg{V: 1, T: "want", Size: e.pairRing(), TCP: e.opt.Mode.tcp()}
		if err := e.sendCtl(e.ctx, peer, m); err != nil {
			e.decide(peer, nil) // the inner endpoint says what became of peer
		}
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

// pairRing is the ring capacity this rank asks a local peer for: the
// largest power of two up to RingSize with which one ring per local peer
// fits the budget (each side sizes alike, having the same local peers).
func (e *Endpoint) pairRing() int {
	n := max(e.LocalPeers(), 1)
	size := e.opt.RingSize
	for size > minRing && size*n > e.opt.RingBudget {
		size /= 2
	}
	return size
}

// chargeRing takes a ring of about want bytes from the budget and returns
// its capacity: want clamped to [64 KiB, RingSize], halved while the
// budget lacks room; 0 when not even 64 KiB is left.
func (e *Endpoint) chargeRing(want int) int {
	size := e.opt.RingSize
	for size > minRing && size > want {
		size /= 2
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for size >= minRing && e.ringBytes+size > e.opt.RingBudget {
		size /= 2
	}
	if size < minRing {
		return 0
	}
	e.ringBytes += size
	return size
}

// RingBytes returns the capacity of the shared-memory rings this process
// created: data rings (charged to Options.RingBudget) and RPC rings (a
// quarter of it on top, rpcchan.go).
func (e *Endpoint) RingBytes() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rpc.mu.Lock()
	defer e.rpc.mu.Unlock()
	return int64(e.ringBytes + e.rpc.ringBytes)
}

func (e *Endpoint) refundRing(size int) {
	e.mu.Lock()
	e.ringBytes -= size
	e.mu.Unlock()
}

// StartPolling lets the calling goroutine, which is about to wait for data
// from peer, progress peer's shared-memory ring itself: poll consumes, in
// the caller, what has arrived (a bounded amount), delivers the frames it
// completes and reports whether it consumed anything, without waiting for
// more; stop ends the polling (call it exactly once). Both are nil when
// peer's data does not come over a ring. Safe for concurrent use.
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
	return ch.pollFn, e.unuseFn
}

// Waiting tells peer's shared-memory ring that the calling goroutine is
// about to block until data from peer is delivered: the producer then wakes
// the ring's read loop for every write, instead of leaving the data to a
// goroutine that polls. Call done when the wait ends. Both are no-ops when
// peer's data does not come over a ring.
//
// A wait that begins before peer's ring exists is counted on the ring once
// startReader installs it (waitCount).
func (e *Endpoint) Waiting(peer int) (done func()) {
	if peer < 0 || peer >= e.size {
		return func() {}
	}
	e.using.Add(1) // as StartPolling: Close does not unmap a ring counted on
	if e.closed.Load() {
		e.using.Add(-1)
		return func() {}
	}
	w := &e.blockedOn[peer]
	w.add(1, e.polled[peer].Load())
	return func() {
		w.add(-1, nil)
		e.using.Add(-1)
	}
}

// waitCount is the number of goroutines blocked until one peer's data is
// delivered, and the ring channel they are counted on (the producer wakes
// its reader for every write while the count there is not zero).
type waitCount struct {
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
// goroutine (see channel.await): the producer wakes this thread itself,
// so a waiter whose peer is late is back within microseconds. It reports
// false at once when peer's data does not come over an open ring.
func (e *Endpoint) Await(peer int, done func() bool, d time.Duration) bool {
	if peer < 0 || peer >= e.size {
		return false
	}
	ch := e.polled[peer].Load()
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
	if e.closed.Load() || e.downed[peer].Swap(true) {
		return
	}
	e.settle(peer)
	var pd *transport.PeerDownError
	if errors.As(err, &pd) {
		err = pd.Cause
	}
	e.mu.Lock()
	e.causes[peer] = err
	in := e.in[peer]
	e.mu.Unlock()
	if e.lazy[peer].Load() {
		e.decide(peer, nil) // wake sends waiting for the ring
	}
	for _, ch := range []*channel{e.out[peer].Load(), in} {
		if ch != nil {
			ch.quiet.Store(true)
			ch.close()
		}
	}
	e.rpcPeerDown(peer)
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
	e.mu.Lock()
	if !e.ctlWG || e.downed[from].Load() {
		e.mu.Unlock()
		ch.quiet.Store(true)
		ch.close()
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
	var place func(h *transport.Header, n int) ([]byte, func(error))
	if e.opt.Place != nil {
		place = func(h *transport.Header, n int) ([]byte, func(error)) { return e.opt.Place(from, h, n) }
	}
	ch.startReading(func(h *transport.Header, p []byte) {
		if e.h != nil {
			e.h(from, transport.LaneData, h, p)
		}
	}, place)
	if ch.ring != nil {
		if e.opt.Forwards {
			ch.ring.setWaiting(1)
		}
		e.polled[from].Store(ch)
		e.blockedOn[from].moveTo(ch)
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
		switch {
		case ch.quiet.Load() || e.closed.Load():
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

// Close says goodbye on every outbound channel (waiting up to
// CloseTimeout for a frame in flight), closes the inner endpoint gracefully
// while inbound channels still deliver, then closes everything else and
// waits for every goroutine. Idempotent.
func (e *Endpoint) Close() error {
	e.once.Do(func() {
		e.closed.Store(true)
		deadline := time.Now().Add(e.opt.CloseTimeout)
		var wg sync.WaitGroup
		for i := range e.out {
			if ch := e.out[i].Load(); ch != nil {
				wg.Go(func() { ch.goodbye(deadline) })
			}
		}
		e.rpcGoodbyes(deadline, &wg)
		if e.inner != nil {
			for _, p := range e.watchers() {
				wg.Go(func() { e.sayBye(p, deadline) })
			}
		}
		wg.Wait()
		if e.inner != nil {
			e.inner.Close()
		}
		e.cancel()
		e.mu.Lock()
		e.ctlWG = false
		if e.ln != nil {
			e.ln.Close()
		}
		watch := e.watch
		chans := append([]*channel(nil), e.in...)
		for _, off := range e.offers {
			for _, c := range off.raws {
				if c != nil {
					c.Close()
				}
			}
		}
		e.offers = nil
		e.mu.Unlock()
		if watch != nil {
			watch.close()
		}
		e.rpcCloseAll()
		for _, ch := range chans {
			if ch != nil {
				ch.quiet.Store(true)
				ch.close()
			}
		}
		e.wg.Wait()
		e.rdmaClose()
		// Sends still in a ring (waiting for room or an acknowledgement)
		// and pollers see the closed rings and return; the rings stay
		// mapped until they have, or leak if one does not within the close
		// timeout.
		unmap := true
		for deadline := time.Now().Add(e.opt.CloseTimeout); e.using.Load() > 0; {
			if time.Now().After(deadline) {
				unmap = false
				e.log.Warn("nexar: bulk: a send did not return at close; its shared memory stays mapped", "rank", e.self)
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		e.pres.clear()
		e.mu.Lock()
		for _, r := range e.rings {
			r.Close()
			if unmap {
				r.release()
			}
		}
		e.rings = nil
		e.mu.Unlock()
	})
	return nil
}

// ctlMsg is one negotiation message (CBOR, string keys).
type ctlMsg struct {
	V      int    `cbor:"v"`
	T      string `cbor:"t"` // hello, offer, want, result; rpcwant, rpcoffer, rpcresult (rpcchan.go)
	Host   string `cbor:"host,omitempty"`
	SHM    bool   `cbor:"shm,omitempty"`
	TCP    bool   `cbor:"tcp,omitempty"`
	Kind   string `cbor:"kind,omitempty"` // offer/result: shm, shm-lazy, rdma, tcp, quic
	Path   string `cbor:"path,omitempty"`
	Cookie []byte `cbor:"cookie,omitempty"`
	Size   int    `cbor:"size,omitempty"`
	Addr   string `cbor:"addr,omitempty"`
	Nonce  []byte `cbor:"nonce,omitempty"`
	Conns  int    `cbor:"conns,omitempty"`
	TLS    bool   `cbor:"tls,omitempty"`
	OK     bool   `cbor:"ok,omitempty"`
	Err    string `cbor:"err,omitempty"`
	// result of a shm attach: the producer's process id and where in its
	// memory the consumer finds Data, to test cross-memory attach.
	// hello and offer: the sender's process (PID, Start, PIDNS) and Host,
	// for a peer on this host to watch it (procwatch_linux.go).
	PID   int    `cbor:"pid,omitempty"`
	Probe uint64 `cbor:"probe,omitempty"`
	Data  []byte `cbor:"data,omitempty"`
	Start uint64 `cbor:"start,omitempty"` // clock ticks after boot
	PIDNS string `cbor:"pidns,omitempty"` // "pid:[inode]"
	// hello: this rank has an RDMA device; offer and result of kind rdma:
	// the queue pair's parameters (a map of transport/rdma,
	// docs/wire-format.md).
	RDMA bool            `cbor:"rdma,omitempty"`
	QP   cbor.RawMessage `cbor:"qp,omitempty"`
}

var ctlDec, _ = cbor.DecOptions{MaxArrayElements: 16, MaxMapPairs: 32, MaxNestedLevels: 4}.DecMode()

// decodeCtl decodes a peer's negotiation message (FuzzDecodeCtl).
func decodeCtl(p []byte) (ctlMsg, error) {
	var m ctlMsg
	if len(p) > ctlMax {
		return m, fmt.Errorf("bulk: negotiation message of %d bytes exceeds %d", len(p), ctlMax)
	}
	if err := ctlDec.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("bulk: negotiation message: %w", err)
	}
	if m.V != 1 {
		return m, fmt.Errorf("bulk: negotiation message of version %d", m.V)
	}
	return m, nil
}

func (e *Endpoint) sendCtl(ctx context.Context, peer int, m *ctlMsg) error {
	b, err := cbor.Marshal(m)
	if err != nil {
		return err
	}
	var h transport.Header
	h[0] = ctlMagic
	return e.inner.Send(ctx, peer, transport.LaneControl, &h, b)
}

// handle takes the negotiation messages off the control lane and passes
// everything else up.
func (e *Endpoint) handle(from int, lane transport.Lane, h *transport.Header, p []byte) {
	if lane != transport.LaneControl || h == nil || h[0] != ctlMagic {
		if e.h != nil {
			e.h(from, lane, h, p)
		}
		return
	}
	if from < 0 || from >= e.size || from == e.self {
		e.log.Warn("nexar: bulk: dropping a negotiation message from an unknown rank", "rank", e.self, "from", from)
		return
	}
	m, err := decodeCtl(p)
	if err != nil {
		e.log.Warn("nexar: bulk: dropping malformed negotiation message", "rank", e.self, "from", from, "err", err)
		return
	}
	// In the handler, in order: a peer's process is known before its
	// offer is acted on (Start then returns knowing every local peer),
	// and its bye before its exit.
	switch m.T {
	case "hello", "offer":
		e.notePeerProc(from, &m)
	case "bye":
		e.peerBye(from)
		return
	case "byeack":
		e.settle(from)
		return
	}
	e.afterStart(func() { e.control(from, &m) })
}

// afterStart runs f in a goroutine of e once Start has run, unless e
// closes first; nothing when e takes no more control work (ctlWG off).
func (e *Endpoint) afterStart(f func()) {
	e.mu.Lock()
	if !e.ctlWG {
		e.mu.Unlock()
		return
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		select {
		case <-e.started:
		case <-e.ctx.Done():
			return
		}
		f()
	}()
}

func (e *Endpoint) control(from int, m *ctlMsg) {
	if !e.talks(from) {
		e.log.Warn("nexar: bulk: negotiation from a rank this one does not talk to; ignored", "rank", e.self, "peer", from, "kind", m.T)
		return
	}
	ctx := e.ctx
	switch m.T {
	case "hello":
		e.offer(ctx, from, m.Host == e.opt.HostID && m.SHM, m.TCP, 0, e.rdmaUsable(m.RDMA, m.Host == e.opt.HostID))
	case "want":
		e.offer(ctx, from, true, m.TCP, m.Size, false)
	case "offer":
		e.attach(ctx, from, m)
	case "rpcwant":
		e.rpcOffer(ctx, from, m)
	case "rpcoffer":
		e.rpcAttach(ctx, from, m)
	case "rpcresult":
		e.rpcResult(from, m)
	case "result":
		if m.Kind == "rdma" {
			e.rdmaResult(ctx, from, m)
		}
		if m.Kind == "shm" && m.OK {
			e.tryRemote(from, m)
		}
		if m.Kind == "shm" && !m.OK {
			e.log.Debug("nexar: bulk: peer could not open the shared-memory ring", "rank", e.self, "peer", from, "err", m.Err)
			e.mu.Lock()
			ch := e.in[from]
			e.in[from] = nil
			e.mu.Unlock()
			if ch != nil {
				ch.quiet.Store(true)
				ch.close()
			}
			e.offer(ctx, from, false, m.TCP, 0, false)
		}
	}
}

// tryRemote tests, on the receiving side of a ring, whether this process
// may copy straight out of the sender's memory (it reads the probe the
// sender named), and if so tells the ring, which lets the sender use
// remote frames.
func (e *Endpoint) tryRemote(from int, m *ctlMsg) {
	if !cmaSupported || m.PID <= 0 || m.Probe == 0 || len(m.Data) != 16 || e.opt.RemoteMin < 0 {
		return
	}
	e.mu.Lock()
	ch := e.in[from]
	e.mu.Unlock()
	if ch == nil || ch.ring == nil {
		return
	}
	got := make([]byte, 16)
	if err := readRemote(m.PID, m.Probe, got); err != nil || !bytes.Equal(got, m.Data) {
		e.log.Debug("nexar: bulk: no cross-memory attach; payloads go through the ring", "rank", e.self, "peer", from, "err", err)
		return
	}
	ch.remotePID.Store(int64(m.PID))
	ch.ring.setRemoteOK()
	e.log.Debug("nexar: bulk: cross-memory attach from peer", "rank", e.self, "peer", from)
}

// offer sets up the inbound channel from peer (this rank receives) and
// tells the peer how to reach it. For a local peer (shm) at the hello
// (size 0) it only says so: the peer asks for the ring, of about size
// bytes, with its first message (want). rdma: try an RDMA channel before
// TCP.
func (e *Endpoint) offer(ctx context.Context, from int, shm, tcp bool, size int, rdma bool) {
	if shm && e.opt.Mode.shm() && shmSupported() {
		if size == 0 {
			e.sendCtl(ctx, from, e.withProc(&ctlMsg{V: 1, T: "offer", Kind: "shm-lazy"}))
			return
		}
		var err error
		if size = e.chargeRing(size); size == 0 {
			err = fmt.Errorf("the budget of %d MiB for rings is spent", e.opt.RingBudget>>20)
		} else {
			var r *ring
			var path string
			var cookie []byte
			if r, path, cookie, err = createRing(size); err == nil {
				e.addRing(r)
				e.pres.add(r) // this process's presence, for the peer (presence.go)
				e.startReader(from, newChannel(from, ringDesc(size), []link{ringLink{r}}))
				e.sendCtl(ctx, from, e.withProc(&ctlMsg{V: 1, T: "offer", Kind: "shm", Path: path, Cookie: cookie, Size: size, TCP: tcp}))
				return
			}
			e.refundRing(size)
		}
		e.log.Debug("nexar: bulk: no shared-memory ring", "rank", e.self, "peer", from, "err", err)
	}
	if rdma && e.offerRDMA(ctx, from, tcp) {
		return
	}
	if ln := e.tcpListener(tcp); ln != nil {
		nonce := make([]byte, 32)
		rand.Read(nonce)
		e.mu.Lock()
		if e.offers != nil {
			e.offers[from] = &tcpOffer{nonce: nonce, conns: make([]net.Conn, e.opt.Conns), raws: make([]net.Conn, e.opt.Conns)}
		}
		e.mu.Unlock()
		port := ln.Addr().(*net.TCPAddr).Port
		addr := net.JoinHostPort(e.opt.AdvertiseHost, fmt.Sprint(port))
		e.sendCtl(ctx, from, e.withProc(&ctlMsg{V: 1, T: "offer", Kind: "tcp", Addr: addr, Nonce: nonce, Conns: e.opt.Conns, TLS: !e.opt.Plaintext}))
		return
	}
	e.sendCtl(ctx, from, e.withProc(&ctlMsg{V: 1, T: "offer", Kind: "quic"}))
}

// tcpListener is the listener for a TCP offer to a peer that can dial
// one (tcp), or nil.
func (e *Endpoint) tcpListener(tcp bool) net.Listener {
	if !tcp || !e.opt.Mode.tcp() {
		return nil
	}
	return e.listener()
}

// attach opens the channel a peer offered for this rank's data to it.
func (e *Endpoint) attach(ctx context.Context, to int, m *ctlMsg) {
	switch m.Kind {
	case "shm":
		r, err := openRing(m.Path, m.Size, m.Cookie)
		if err != nil {
			e.sendCtl(ctx, to, &ctlMsg{V: 1, T: "result", Kind: "shm", Err: err.Error(), TCP: e.opt.Mode.tcp()})
			return
		}
		e.addRing(r)
		ch := newChannel(to, ringDesc(m.Size), []link{ringLink{r}})
		ch.remoteMin = max(e.opt.RemoteMin, 0)
		e.decide(to, ch)
		res := &ctlMsg{V: 1, T: "result", Kind: "shm", OK: true}
		if cmaSupported && e.opt.RemoteMin > 0 {
			res.PID, res.Probe, res.Data = selfPID(), uint64(uintptr(unsafe.Pointer(&e.probe[0]))), e.probe
		}
		e.sendCtl(ctx, to, res)
	case "tcp":
		links, err := e.dialTCP(ctx, to, m.Addr, m.Nonce, m.Conns, m.TLS)
		if err != nil {
			e.log.Warn("nexar: bulk: TCP channel failed; data stays on QUIC", "rank", e.self, "peer", to, "err", err)
			e.decide(to, nil)
			return
		}
		e.decide(to, newChannel(to, e.tcpDesc(links), links))
	case "shm-lazy":
		e.decideLater(to)
	case "rdma":
		e.attachRDMA(ctx, to, m)
	default:
		e.decide(to, nil)
	}
}

// decide fixes the outbound path to peer (nil: the inner endpoint), at
// Start or, for a local peer, when its ring was asked for.
func (e *Endpoint) decide(peer int, ch *channel) {
	e.mu.Lock()
	defer e.mu.Unlock()
	later := e.lazy[peer].Load()
	if (e.decided[peer] && !later) || !e.ctlWG {
		if ch != nil {
			ch.quiet.Store(true)
			ch.close()
		}
		return
	}
	if ch != nil {
		e.out[peer].Store(ch)
		e.paths[peer] = ch.desc
	} else if later {
		e.paths[peer] = "quic"
	}
	if later {
		e.lazy[peer].Store(false)
		if e.waits[peer] == nil {
			e.waits[peer] = make(chan struct{})
		}
		close(e.waits[peer])
		return
	}
	e.decided[peer] = true
	e.left--
	if e.left == 0 {
		close(e.ready)
	}
}

// decideLater records at Start that peer is on this host: its ring is made
// when the first message to it is sent (connect).
func (e *Endpoint) decideLater(peer int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.decided[peer] || !e.ctlWG {
		return
	}
	e.decided[peer] = true
	e.local[peer] = true
	e.lazy[peer].Store(true)
	e.paths[peer] = "shm ring on first use"
	e.left--
	if e.left == 0 {
		close(e.ready)
	}
}

func ringDesc(size int) string {
	if size >= 1<<20 {
		return fmt.Sprintf("shm %d MiB ring", size>>20)
	}
	return fmt.Sprintf("shm %d KiB ring", size>>10)
}

// Available describes, for `nexar info`, what this build and machine offer:
// shared-memory rings, cross-memory attach (tried on this process; each pair
// of ranks is probed again when it connects) and TCP.
func Available() (shm, cma, tcp string) {
	shm = "unavailable: needs Linux and a writable " + shmDir
	if shmSupported() {
		if r, _, _, err := createRing(64 << 10); err == nil {
			r.Close()
			r.release()
			shm = fmt.Sprintf("yes (%s; %d MiB ring per direction between ranks of one host)", shmDir, DefaultRingSize>>20)
		} else {
			shm = "unavailable: " + err.Error()
		}
	}
	cma = "unavailable on this platform"
	if cmaSupported {
		probe := []byte("nexar cross-memory attach probe")
		got := make([]byte, len(probe))
		if err := readRemote(selfPID(), uint64(uintptr(unsafe.Pointer(&probe[0]))), got); err != nil {
			cma = "unavailable: " + err.Error()
		} else if !bytes.Equal(got, probe) {
			cma = "unavailable: process_vm_readv returned wrong data"
		} else {
			cma = fmt.Sprintf("yes (process_vm_readv; payloads from %d KiB on shared-memory paths)", DefaultRemoteMin>>10)
		}
	}
	tcp = fmt.Sprintf("yes (%d connections per direction between hosts, authenticated by TLS 1.3, data sealed with %s unless NEXAR_BULK_PLAINTEXT=1)", DefaultConns, record.AES128GCM)
	return shm, cma, tcp
}
