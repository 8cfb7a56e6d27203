package bulk

import (
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

	"github.com/nexar-go/nexar/internal/hostid"
	"github.com/nexar-go/nexar/internal/procwatch"
	"github.com/nexar-go/nexar/internal/sched"
	"github.com/nexar-go/nexar/transport"
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

func (m Mode) shm() bool { return m == ModeAuto || m == ModeSHM }

func (m Mode) tcp() bool { return m == ModeAuto || m == ModeTCP }

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
//
// Lock order: mu, then rpc.mu (rpcchan.go), then a waitCount's mu.
type Endpoint struct {
	// Immutable after New.
	self, size int
	opt        Options
	log        *slog.Logger
	h          transport.Handler
	down       transport.DownHandler
	ctx        context.Context // ends at Close
	cancel     context.CancelFunc
	started    chan struct{}   // closed by Start, once inner is set
	ready      chan struct{}   // closed (under mu) once every outbound data path is fixed
	probe      []byte          // what a peer reads from our memory to test cross-memory attach
	unuseFn    func()          // StartPolling's stop
	me         procwatch.ID    // this process; PID 0 when /proc cannot tell
	drainMax   time.Duration   // how long a dead peer's ring may take to drain (procExited)
	settled    []chan struct{} // per peer, closed (under mu) once it will not call this process's exit a death
	rpc        *rpcPaths       // LaneRPC channels (rpcchan.go), guarded by rpc.mu
	// dialHook dials the TCP connections (tests tamper with the wire; nil:
	// net.Dialer). Set before Start.
	dialHook func(ctx context.Context, addr string) (net.Conn, error)

	// Set once by Start, before started is closed; read after.
	inner transport.Endpoint

	// Synchronised by themselves.
	wg        sync.WaitGroup
	once      sync.Once   // Close
	records   record.Pool // buffers of the sealed TCP records (tcp.go)
	raceSync  raceSync    // the race detector's view of the rings' order (racesync_on.go)
	pres      presence    // this process's presence in the data rings it reads (presence.go)
	blockedOn []waitCount // per peer: goroutines blocked until its data is delivered (Waiting); each has its mu

	// Atomic, per peer unless said otherwise.
	out    []atomic.Pointer[channel] // outbound channel; nil: inner
	polled []atomic.Pointer[channel] // inbound ring channel, for Poll
	devIn  []atomic.Pointer[channel] // inbound device channel, for DeviceData
	downed []atomic.Bool             // reported down (report)
	lazy   []atomic.Bool             // a local peer whose ring is made on first use, not made yet
	// inProc[p]: peer p is a rank of this very process (its hello named
	// this process), whose presence says nothing of another process's use
	// of a CPU (PeerPresence). Set once.
	inProc []atomic.Bool
	closed atomic.Bool  // Close began
	rdmaOn atomic.Bool  // some channel (either way) runs over RDMA: Prepare registers
	using  atomic.Int64 // sends and pollers that may touch a ring (see Close)

	// mu guards the fields below.
	mu        sync.Mutex
	neg       *negotiator       // the negotiation's state (negotiate.go)
	accepting bool              // false once Close stops taking control work and channels
	paths     []string          // per peer: what carries this rank's data to it (Paths)
	waits     []chan struct{}   // per peer: closed once a lazy path is fixed; nil until a send asks
	in        []*channel        // per peer: inbound channel still reading
	bye       []error           // per peer: graceful departure waiting for the inbound channel to drain
	byeSeen   []bool            // per peer: inbound channel ended with a goodbye
	causes    []error           // per peer: why it is down
	offers    map[int]*tcpOffer // TCP offers waiting for their connections, by peer
	ln        net.Listener      // TCP, bound on first use (see listener)
	lnErr     error             // why ln could not be bound
	rings     []*ring           // every ring mapped, released at Close
	ringBytes int               // capacity of the data rings this process created
	// oversubscribed: more ranks than cores share this rank's CPUs (see Start).
	oversubscribed bool
	rdmaPending    map[int]RDMAEnd // receiving RDMA ends offered, not accepted yet (rdmachan.go)
	// Same-host deaths (procdeath.go, procwatch_linux.go). A peer whose
	// hello or offer proves it a process of this host and PID namespace
	// (sameProc) may watch this process as this one watches it: Close
	// says goodbye to it on the control lane (bye) and waits until it
	// acknowledges (settled), so that this process's exit after a graceful
	// Close is never taken for a death.
	watch     *procwatch.Watch // made for the first same-host peer
	watchErr  error            // why there is no watch
	sameProc  []bool           // per peer: proven on this host, in this PID namespace
	departing []bool           // per peer: said bye, so its exit is a departure
	exited    []error          // per peer: why its process is dead, once its watch said so
	settledOK []bool           // per peer: settled is closed
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
		started: make(chan struct{}), ready: make(chan struct{}), drainMax: drainMax,
		settled: make([]chan struct{}, size), rpc: newRPCPaths(size), blockedOn: make([]waitCount, size),
		out: make([]atomic.Pointer[channel], size), polled: make([]atomic.Pointer[channel], size),
		devIn: make([]atomic.Pointer[channel], size), downed: make([]atomic.Bool, size),
		lazy: make([]atomic.Bool, size), inProc: make([]atomic.Bool, size),
		accepting: true, paths: make([]string, size), waits: make([]chan struct{}, size),
		in: make([]*channel, size), bye: make([]error, size), byeSeen: make([]bool, size),
		causes: make([]error, size), offers: map[int]*tcpOffer{}, rdmaPending: map[int]RDMAEnd{},
		sameProc: make([]bool, size), departing: make([]bool, size), exited: make([]error, size),
		settledOK: make([]bool, size)}
	for r := range e.settled {
		e.settled[r] = make(chan struct{})
	}
	if opt.Mode != ModeOff && procwatch.Supported && size > 1 {
		e.me, _ = procwatch.Self()
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
	e.neg = newNegotiator(e.negConfig()) // made again at Start, from the options then
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
	if e.ln != nil || e.lnErr != nil || !e.accepting {
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

// Start negotiates a bulk channel to every peer over inner and returns once
// each peer's path is fixed. Peers that do not answer before ctx ends stay
// on inner. On error the caller closes e.
func (e *Endpoint) Start(ctx context.Context, inner transport.Endpoint) error {
	if inner == nil || inner.Size() != e.size || inner.Rank() != e.self {
		return errors.New("bulk: inner endpoint does not match")
	}
	e.inner = inner
	e.mu.Lock()
	e.neg = newNegotiator(e.negConfig())
	if e.neg.left == 0 || e.opt.Mode == ModeOff {
		close(e.ready)
	}
	e.mu.Unlock()
	close(e.started)
	if e.opt.Mode == ModeOff {
		return nil
	}
	if err := e.negotiate(ctx, evStart{}); err != nil {
		return err
	}
	select {
	case <-e.ready:
	case <-ctx.Done():
		e.negotiate(e.ctx, evStartTimeout{})
	case <-e.ctx.Done():
		return transport.ErrClosed
	}
	for r, p := range e.Paths() {
		e.log.Debug("nexar: data path", "rank", e.self, "peer", r, "path", p)
	}
	e.mu.Lock()
	crowd, cpus := e.neg.crowd(runtime.NumCPU())
	e.mu.Unlock()
	if e.LocalPeers()+1 > runtime.NumCPU() || crowd > cpus {
		e.log.Debug("nexar: more ranks than cores: waiters yield", "rank", e.self,
			"ranks", crowd, "cpus", cpus, "local_peers", e.LocalPeers())
		e.mu.Lock()
		e.oversubscribed = true
		e.pres.crowded.Store(true)
		for _, r := range e.rings {
			r.yield.Store(true)
		}
		e.mu.Unlock()
	}
	return nil
}

// negConfig is what the negotiator is told of this rank.
func (e *Endpoint) negConfig() negConfig {
	o := &e.opt
	c := negConfig{self: e.self, size: e.size, talks: make([]bool, e.size), host: o.HostID,
		kernel: hostid.Kernel(), cpus: sched.Allowed(),
		shm: o.Mode.shm() && shmSupported(), tcp: o.Mode.tcp(), rdma: o.RDMA != nil && o.Mode.rdma(),
		rdmaOnly: o.Mode == ModeRDMA, plaintext: o.Plaintext, conns: o.Conns,
		ringSize: o.RingSize, ringBudget: o.RingBudget, testRemote: cmaSupported && o.RemoteMin >= 0}
	for r := range c.talks {
		c.talks[r] = r != e.self && (o.Peers == nil || o.Peers(r))
	}
	if e.me.PID > 0 {
		c.me = procClaim{Host: o.HostID, PID: e.me.PID, Start: e.me.Start, PIDNS: e.me.PIDNS}
	}
	p := probe{PID: selfPID(), Addr: uint64(uintptr(unsafe.Pointer(&e.probe[0]))), Data: e.probe}
	if cmaSupported && o.RemoteMin > 0 {
		c.dataProbe = p
	}
	if cmaSupported && rpcRemoteMin(o.RemoteMin) > 0 {
		c.rpcProbe = p
	}
	return c
}

// addRing records a mapped ring (released at Close).
func (e *Endpoint) addRing(r *ring) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rings = append(e.rings, r)
	r.yield.Store(e.oversubscribed)
	r.sync = &e.raceSync
}

// pairRing is the ring capacity this rank asks a local peer for
// (negotiator.pairRing).
func (e *Endpoint) pairRing() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.neg.pairRing()
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

func (e *Endpoint) refundRing(size int) {
	e.mu.Lock()
	e.ringBytes -= size
	e.mu.Unlock()
}

// Close says goodbye on every outbound channel (waiting up to
// CloseTimeout for a frame in flight), closes the inner endpoint gracefully
// while inbound channels still deliver, then closes everything else and
// waits for every goroutine. Idempotent.
func (e *Endpoint) Close() error {
	e.once.Do(func() {
		e.closed.Store(true)
		e.negotiate(e.ctx, evClose{}) // nothing more is made
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
		e.accepting = false
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
			watch.Close()
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
