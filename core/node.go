package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/internal/sched"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// node is one rank's attachment to a transport mesh, shared by the world
// communicator and every communicator split from it. It demultiplexes
// inbound messages by communicator id, accounts buffered bytes, and runs
// failure detection.
//
// Lock order: node.mu before Comm.mu. A Comm never takes node.mu while
// holding its own mu.
type node struct {
	cfg  Config
	log  *slog.Logger
	rank int                // world rank
	size int                // world size
	ep   transport.DataPath // set once, before start (worldComm)
	caps transport.Caps     // ep's declaration, read on every hot path
	// poll is ep's scheduling group (transport.Poller), or transport.NoPoller where
	// ep has none; set with ep.
	poll transport.Poller
	// reg is ep's memory registration (transport.Registrar, found on the
	// mesh's parts), nil where its channels register nothing; set with ep.
	reg transport.Registrar
	// view is the world's first membership. Each communicator has the
	// generation it was made in (Comm.gen: the world's is view.Gen, a
	// shrunk communicator's one more than its parent's) and takes only
	// messages that carry it.
	view membership.View
	// stale counts messages dropped because another generation sent them.
	stale atomic.Int64

	born           time.Time      // when the node was made, with a monotonic reading (mono, now)
	spinWait       time.Duration  // resolved Config.SpinWait (resolveSpinWait)
	oversubscribed bool           // more ranks than cores on this machine (transport/bulk: this kernel, namespaces included)
	lastMove       atomic.Int64   // time.Now().UnixNano() of spin's last sched.MoveOff (moveOffEvery)
	lastSeen       []atomic.Int64 // when the last message from each world rank came: mono's reading
	quiet          []atomic.Int64 // per world rank: mono's reading when its silence began while it is stalled (detector.go), else 0
	downSig        []downSignal   // per world rank: declared down (ends sends to it)
	buffered       atomic.Int64   // payload bytes held for unmatched messages
	heartbeats     atomic.Int64   // heartbeats sent (Stats.HeartbeatsSent)
	ringBytes      func() int64   // the mesh's RingBytes (transport.RingHolder); nil without rings (set before start)
	// headers recycles the transport headers of outbound messages: one
	// passed to the endpoint (an interface) escapes, and the hot path
	// makes no allocation.
	headers sync.Pool

	// Elastic membership (core/grow.go): this rank's advertised mesh
	// address, every member's lobby address by world rank ("" for none),
	// and the world size bounds. Set before start, read-only after.
	adv                string
	lobbies            []string
	minWorld, maxWorld int

	// hostKeys names each world rank's host (core/topo.go hostKey), nil
	// where unknown (NewLocal, an older peer). Set before start.
	hostKeys []string

	// Sparse topology (core/topo.go), set before start: the graph (nil:
	// every pair talks directly) and the relaying path's broadcast and
	// forwarded bytes (the mesh's transport.Broadcaster and Forwarder;
	// nil without a relay).
	graph *topology.Graph
	cast  transport.Broadcaster
	fwd   transport.Forwarder
	topo  topoState // under mu
	// sched is the graph the collective schedules fit (Config.Schedules;
	// nil: rank order), set before start.
	sched *topology.Graph
	// onDemand is the mesh whose connections are made at first use
	// ("ondemand:M": transport.OnDemand; nil otherwise), set before the
	// mesh connects.
	onDemand transport.OnDemand

	done chan struct{} // closed by close
	// life ends with done: the node's own sends derive from it (a
	// context over done itself costs a goroutine per send).
	life    context.Context
	endLife context.CancelFunc
	wg      sync.WaitGroup
	closers []func() error // run by close after the endpoint (quic node, seed)

	freed        atomic.Pointer[chan struct{}] // closed and replaced when buffered bytes are released while someone waits
	freedWaiters atomic.Int32                  // registered freedWaiters

	// hold, while set, stops heartbeats, monitoring and the handler
	// (tests: a process that stops without closing its connections, like
	// SIGSTOP).
	hold atomic.Pointer[chan struct{}]

	// Stall detection (monitor): unix nanos of its last check (0 before
	// start), and the end and length of the last stall it noticed.
	tick     atomic.Int64
	stallEnd atomic.Int64
	stallLen atomic.Int64

	// placed is the communicator the last collective frame was placed
	// for (core/place.go): the next one is usually for it too, and then
	// needs neither mu nor comms.
	placed atomic.Pointer[Comm]

	// mu guards the following fields.
	mu      sync.Mutex
	comms   map[uint64]*Comm
	pending map[uint64][]pendingMsg // messages for communicators not created yet
	down    []error                 // per world rank, nil while alive
	left    []error                 // per world rank: closed its endpoint gracefully
	refs    int
	closed  bool
	lobby   *nodeLobby // this rank's lobby while this node owns it (grow hands it on)
}

// header returns a transport header to encode into; give it back with
// putHeader once the send returned (transports copy it before then).
func (n *node) header() *transport.Header {
	if h, _ := n.headers.Get().(*transport.Header); h != nil {
		return h
	}
	return new(transport.Header)
}

func (n *node) putHeader(h *transport.Header) { n.headers.Put(h) }

type pendingMsg struct {
	from    int
	lane    transport.Lane
	h       header
	payload []byte
}

func newNode(cfg Config, rank, size int) *node {
	n := &node{
		cfg: cfg, log: cfg.Logger, rank: rank, size: size, view: membership.Initial(size), born: time.Now(),
		lastSeen: make([]atomic.Int64, size),
		quiet:    make([]atomic.Int64, size),
		done:     make(chan struct{}),
		comms:    make(map[uint64]*Comm),
		pending:  make(map[uint64][]pendingMsg),
		down:     make([]error, size),
		left:     make([]error, size),
		downSig:  make([]downSignal, size),
		minWorld: max(cfg.MinWorldSize, 1), maxWorld: cfg.MaxWorldSize,
	}
	if n.maxWorld <= 0 {
		n.maxWorld = size
	}
	n.life, n.endLife = context.WithCancel(context.Background())
	for i := range n.downSig {
		n.downSig[i].ctx, n.downSig[i].cancel = context.WithCancel(context.Background())
	}
	ch := make(chan struct{})
	n.freed.Store(&ch)
	now := n.mono()
	for i := range n.lastSeen {
		n.lastSeen[i].Store(now)
	}
	return n
}

// mono is the time since the node was made, read from the monotonic clock
// alone: time.Now reads the wall clock too, and each read costs 20-40 ns
// on a VM, on paths that take about a microsecond (every message placed).
func (n *node) mono() int64 { return int64(time.Since(n.born)) }

// now is time.Now for deadlines and the flight recorder, at the cost of
// one monotonic clock read (mono). Its wall clock reading is the node's
// birth plus the monotonic time since: for durations and comparisons
// with other times that carry a monotonic reading, as time.Now's do.
func (n *node) now() time.Time {
	return n.born.Add(time.Since(n.born))
}

// start begins heartbeats and monitoring once ep is set.
func (n *node) start() {
	n.resolveSpinWait()
	now := time.Now()
	seen := int64(now.Sub(n.born))
	for i := range n.lastSeen {
		n.lastSeen[i].Store(seen)
	}
	n.tick.Store(now.UnixNano())
	if n.size == 1 {
		return
	}
	if n.wantIdleSysmon() {
		n.wg.Add(1)
		go n.idleSysmon()
	}
	for _, p := range n.watched() {
		n.wg.Go(func() { n.heartbeatTo(n.ep, p, n.done) })
	}
	n.wg.Add(1)
	go n.monitor()
}

// wantIdleSysmon says whether this rank gives the Go runtime's monitor
// thread the idle policy (Config.NormalSysmon): when it spins on shared
// memory with a core per local rank. Ranks that share cores yield them
// (no spinner to preempt), and a host busier than its cores starves an
// idle thread.
func (n *node) wantIdleSysmon() bool {
	return n.caps.Poll && n.spinWait > 0 && !n.oversubscribed && !n.cfg.NormalSysmon
}

// idleSysmon gives the Go runtime's monitor thread the idle policy
// (Config.NormalSysmon), once this process's goroutines run: a spinning
// rank is then never preempted by its wake-ups.
func (n *node) idleSysmon() {
	defer n.wg.Done()
	tid, err := sched.IdleSysmon(n.life)
	if err != nil {
		if n.life.Err() == nil {
			n.log.Debug("nexar: sysmon keeps its policy", "subsys", SubsysInit, "rank", n.rank, "err", err)
		}
		return
	}
	n.log.Debug("nexar: sysmon set to SCHED_IDLE", "subsys", SubsysInit, "rank", n.rank, "tid", tid)
}

// heartbeatTo runs one loop per peer so that a peer whose lane is stuck
// never delays heartbeats to the others. It sends on ep until stop closes.
func (n *node) heartbeatTo(ep transport.Endpoint, peer int, stop <-chan struct{}) {
	var th transport.Header
	(&header{kind: kindHeartbeat}).encode(&th, n.view.Gen)
	t := time.NewTicker(n.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		n.mu.Lock()
		gone := n.left[peer] != nil || n.down[peer] != nil
		n.mu.Unlock()
		if !gone && n.hold.Load() == nil {
			ctx, cancel := context.WithTimeout(n.life, n.cfg.HeartbeatInterval)
			_ = ep.Send(ctx, peer, transport.LaneHeartbeat, &th, nil)
			cancel()
			n.heartbeats.Add(1)
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// heartbeatWhileForming sends heartbeats over the mesh ep until the
// returned function is called, which waits for them to stop. Peers that
// formed first watch this rank already, while it may still be negotiating
// its data path: a TCP connect on a lossy link can take seconds (its SYN
// is retried after 1 s, then 3 s), and silence that long would get this
// rank declared unreachable before it ever ran.
func (n *node) heartbeatWhileForming(ep transport.Endpoint) (stop func()) {
	if n.size == 1 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range n.watched() {
		wg.Go(func() { n.heartbeatTo(ep, p, done) })
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

func (n *node) monitor() {
	defer n.wg.Done()
	tick := n.cfg.HeartbeatInterval / 2
	if tick > 250*time.Millisecond {
		tick = 250 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	// A gap between ticks this long means this process was stopped
	// (SIGSTOP, a paused VM) or starved: the peers' silence then says
	// nothing about them, and a notice that they declared this rank
	// unreachable may be waiting to be read. Count their silence afresh.
	stall := n.stallGap()
	var stalled []stalledPeer
	prev := time.Now()
	det := newDetector(n.size, detectorParamsOf(n.cfg), int64(prev.Sub(n.born)))
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
		}
		if n.hold.Load() != nil {
			continue // frozen (tests): stopped like the rest of the process
		}
		now := time.Now()
		seen := int64(now.Sub(n.born)) // lastSeen's clock
		if gap := now.Sub(prev); gap > stall {
			n.log.Warn("nexar: this process was stalled", "rank", n.rank, "for", gap.Round(time.Millisecond))
			n.stallLen.Store(int64(gap))
			n.stallEnd.Store(now.UnixNano())
			for p := range n.lastSeen {
				n.lastSeen[p].Store(max(n.lastSeen[p].Load(), seen))
				det.restart(p, seen)
			}
		}
		prev = now
		n.tick.Store(now.UnixNano())
		stalled = stalled[:0]
		for p := range n.lastSeen {
			if n.watches(p) {
				det.arrived(p, n.lastSeen[p].Load())
				if s, ok := n.judge(det, p, seen); ok {
					stalled = append(stalled, s)
				}
			}
		}
		if len(stalled) > 0 {
			// One line per check, not per peer: when the whole host is
			// oversubscribed, every rank sees most of the others stall
			// at once.
			// Info, not Warn: on a host with more ranks than cores this is
			// common and harmless (a call that waits on it names it).
			n.log.Info("nexar: peers stalled: silent, but their processes are alive", "rank", n.rank,
				"peers", stalledPeers(stalled))
		}
	}
}

// stalledPeer is a peer that the detector found stalled, and how long it
// had been silent.
type stalledPeer struct {
	rank   int
	silent time.Duration
}

// stalledPeers formats peers as "3 (3.1s), 7 (3s)".
func stalledPeers(ps []stalledPeer) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d (%v)", p.rank, p.silent.Round(100*time.Millisecond))
	}
	return b.String()
}

// judge acts on the detector's verdict on world rank p at now (mono's
// reading): a dead peer is declared down; a stalled one (its process
// known to run) is recorded in quiet, where a call that times out finds
// it (timeoutError), and returned once per silence, for the caller to log.
func (n *node) judge(det *detector, p int, now int64) (stalledPeer, bool) {
	v, silent, first := det.check(p, now, n.ep.PeerAlive)
	switch v {
	case verdictDead:
		n.peerDown(p, fmt.Sprintf("no heartbeat for %v", silent.Round(100*time.Millisecond)), nil)
	case verdictStalled:
		if first {
			n.quiet[p].Store(max(now-int64(silent), 1))
			return stalledPeer{p, silent}, true
		}
	default:
		if n.quiet[p].Swap(0) != 0 {
			n.log.Debug("nexar: stalled peer heard from again", "rank", n.rank, "peer", p)
		}
	}
	return stalledPeer{}, false
}

// stallGap is the gap between monitor checks that counts as a stall.
func (n *node) stallGap() time.Duration {
	tick := min(n.cfg.HeartbeatInterval/2, 250*time.Millisecond)
	return max(n.cfg.HeartbeatTimeout/2, 4*tick)
}

// stalledFor returns how long this process was stopped or starved, when
// that was long enough for its peers to declare it unreachable and is
// recent (the monitor has not run since, or noticed it lately), else 0.
func (n *node) stalledFor(now time.Time) time.Duration {
	last := n.tick.Load()
	if last == 0 || n.size == 1 {
		return 0 // not started
	}
	d := now.Sub(time.Unix(0, last))
	if d <= n.stallGap() {
		d = 0
		if end := n.stallEnd.Load(); end != 0 && now.Sub(time.Unix(0, end)) < 2*n.cfg.HeartbeatTimeout {
			d = time.Duration(n.stallLen.Load())
		}
	}
	if d < n.cfg.HeartbeatTimeout-n.cfg.HeartbeatInterval {
		return 0
	}
	return d
}

// peerDown fails, once, every communicator that contains world rank p.
// A rank that left gracefully is not down: whatever it sent was delivered.
// If this process was just stalled long enough for its peers to declare
// it unreachable, that is the likelier story, and the error says so.
func (n *node) peerDown(p int, why string, cause error) {
	n.peerDownBy(p, n.rank, why, why, cause)
}

// peerDownBy is peerDown for a failure that rank by detected for the
// reason found; why is how this rank tells it.
func (n *node) peerDownBy(p, by int, found, why string, cause error) {
	n.mu.Lock()
	if n.closed || n.down[p] != nil || n.left[p] != nil {
		n.mu.Unlock()
		return
	}
	n.down[p] = fmt.Errorf("%s", why)
	if cause != nil {
		n.down[p] = fmt.Errorf("%s: %w", why, cause)
	}
	err := n.down[p]
	n.log.Warn("nexar: peer unreachable", "rank", n.rank, "peer", p, "why", why)
	n.gossipFailedLocked(p, by, found)
	stalled := n.stalledFor(time.Now())
	for _, c := range n.comms {
		if stalled > 0 {
			c.lostWhileStalledLocked(p, stalled, err)
		} else {
			c.peerDownLocked(p, err)
		}
		c.suspectWorldLocked(p)
	}
	// Then end every send to p and every receive from p that the
	// transport holds (a ring, TCP or QUIC stream mid-frame): a dead peer
	// never unblocks them, and the transport would only notice at its own
	// timeout. The communicators are failed first, so an operation that
	// ends this way reports their failure.
	s := &n.downSig[p]
	s.err = &sendDownError{&transport.PeerDownError{Peer: p, Cause: err}}
	s.is.Store(true)
	s.cancel()
	ep := n.ep
	if ep != nil {
		// Tell p, should it be alive after all (stopped, then resumed),
		// that it was declared unreachable. Best effort: Abandon below
		// may close the connection first, and then the close's reason
		// (transport.ErrDeclaredDown) tells it instead.
		n.wg.Add(1)
		go n.tellDeclaredDown(p, err.Error())
	}
	n.mu.Unlock()
	// Outside n.mu: the endpoint tells onDown, which takes it.
	if ep != nil {
		ep.Abandon(p, err)
	}
}

// tellDeclaredDown tells world rank p, best effort and bounded in time,
// that this rank declared it unreachable, so that if p is alive after all
// (stopped, then resumed) it reports that, not the silence of healthy
// peers that stopped talking to it.
func (n *node) tellDeclaredDown(p int, why string) {
	defer n.wg.Done()
	if !n.connectedOnDemand(p) {
		return // no connection to tell it on (and dialling a dead rank only waits)
	}
	payload := []byte(truncate(why, 1024))
	var th transport.Header
	(&header{kind: kindControl, sub: ctlDeclaredDown, total: uint64(len(payload))}).encode(&th, n.view.Gen)
	ctx, cancel := context.WithTimeout(n.life, min(byeTimeout, n.cfg.HeartbeatTimeout))
	defer cancel()
	_ = n.ep.Send(ctx, p, transport.LaneControl, &th, payload)
}

// isDown reports whether world rank p was declared down here.
func (n *node) isDown(p int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down[p] != nil
}

// declaredDown handles world rank p's notice that it declared this rank
// unreachable: p talks to this rank no more, and every communicator with
// p fails saying so.
func (n *node) declaredDown(p int, why string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.down[p] != nil || n.left[p] != nil {
		return
	}
	n.down[p] = fmt.Errorf("it declared this rank unreachable (%s)", why)
	n.log.Warn("nexar: declared unreachable by a peer", "rank", n.rank, "peer", p, "why", why)
	for _, c := range n.comms {
		c.declaredDownLocked(p, why)
		c.suspectWorldLocked(p)
	}
}

// peerLeft records that world rank p closed its endpoint after every
// message it sent was delivered. Communicators it had not said goodbye on
// (normally none: Comm.Close does) treat every collective not yet complete
// as one it did not complete.
func (n *node) peerLeft(p int, cause error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.down[p] != nil || n.left[p] != nil {
		return
	}
	n.left[p] = cause
	n.log.Debug("nexar: peer left", "rank", n.rank, "peer", p)
	for _, c := range n.comms {
		c.leftLocked(p)
	}
}

// onDown is the transport's DownHandler.
func (n *node) onDown(peer int, err error) {
	if peer < 0 || peer >= n.size {
		return
	}
	if errors.Is(err, transport.ErrPeerClosed) {
		n.peerLeft(peer, err)
		return
	}
	if errors.Is(err, transport.ErrDeclaredDown) {
		// The peer gave up on this rank and closed the connection (its
		// notice may have been lost with it): say that, not "lost".
		var pd *transport.PeerDownError
		why := err.Error()
		if errors.As(err, &pd) && pd.Cause != nil {
			why = strings.TrimSuffix(pd.Cause.Error(), ": "+transport.ErrDeclaredDown.Error())
		}
		n.declaredDown(peer, why)
		return
	}
	n.peerDown(peer, "connection lost", err)
}

// freeze stops heartbeats and inbound delivery until thaw (tests).
func (n *node) freeze() {
	ch := make(chan struct{})
	n.hold.Store(&ch)
}

func (n *node) thaw() {
	if ch := n.hold.Swap(nil); ch != nil {
		close(*ch)
	}
}

// handle is the transport Handler: one goroutine per (peer, lane).
func (n *node) handle(from int, lane transport.Lane, th *transport.Header, payload []byte) {
	if from < 0 || from >= n.size {
		return
	}
	if hold := n.hold.Load(); hold != nil {
		select {
		case <-*hold:
		case <-n.done:
			return
		}
	}
	n.lastSeen[from].Store(n.mono())
	if lane == transport.LaneHeartbeat {
		return
	}
	h, err := decodeHeader(th)
	if err != nil {
		n.log.Warn("nexar: dropping message", "rank", n.rank, "from", from, "lane", lane.String(), "err", err)
		return
	}
	if h.kind == kindHeartbeat {
		return
	}
	if h.total > 1<<62 || uint64(len(payload)) > h.total {
		n.log.Warn("nexar: dropping message with bad length", "rank", n.rank, "from", from)
		return
	}
	if h.kind == kindControl && h.sub == ctlDeclaredDown {
		n.declaredDown(from, string(payload))
		return
	}
	if h.kind == kindControl && h.sub == ctlFailed {
		n.failedNotice(from, payload)
		return
	}
	w := freedWaiter{n: n}
	defer w.end()
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return
		}
		c := n.comms[h.comm]
		if c != nil {
			n.mu.Unlock()
			c.deliver(from, lane, h, payload, false)
			return
		}
		if n.tryAcquire(int64(len(payload))) {
			n.pending[h.comm] = append(n.pending[h.comm], pendingMsg{from, lane, h, payload})
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		if !w.wait(nil) {
			return
		}
	}
}

// freedWaiter is one caller's wait for buffered bytes to be released,
// across the attempts of its retry loop. The first wait only registers
// and takes the channel the next release closes (the caller then tries
// once more at once); later waits block until a release. release frees
// the bytes before it looks for waiters, so no registered caller misses
// one, and without waiters it allocates nothing.
type freedWaiter struct {
	n     *node
	freed chan struct{}
}

// wait reports false when the node closed or stop was closed first.
func (w *freedWaiter) wait(stop <-chan struct{}) bool {
	if w.freed == nil {
		w.n.freedWaiters.Add(1)
		w.freed = w.n.freedCh()
		return true
	}
	select {
	case <-w.freed:
		w.freed = w.n.freedCh()
		return true
	case <-w.n.done:
		return false
	case <-stop:
		return false
	}
}

// end unregisters the caller if it waited.
func (w *freedWaiter) end() {
	if w.freed != nil {
		w.n.freedWaiters.Add(-1)
	}
}

func (n *node) freedCh() chan struct{} { return *n.freed.Load() }

// tryAcquire reserves n buffered bytes if the budget allows (a lone
// message larger than the budget is admitted when nothing else is held).
func (n *node) tryAcquire(b int64) bool {
	if b == 0 {
		return true
	}
	for {
		cur := n.buffered.Load()
		if cur > 0 && cur+b > n.cfg.MaxBufferedBytes {
			return false
		}
		if n.buffered.CompareAndSwap(cur, cur+b) {
			return true
		}
	}
}

func (n *node) release(b int64) {
	if b == 0 {
		return
	}
	n.buffered.Add(-b)
	if n.freedWaiters.Load() == 0 {
		return
	}
	ch := make(chan struct{})
	old := n.freed.Swap(&ch)
	close(*old)
}

// register adds c and replays messages that arrived before it existed, in
// the same critical section so that no later message overtakes them.
func (n *node) register(c *Comm) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return newError(CodeClosed, "split", -1, "communicator is closed")
	}
	n.comms[c.id] = c
	n.noteRegisteredLocked(c)
	n.refs++
	for _, w := range c.world {
		if n.down[w] != nil {
			c.peerDownLocked(w, n.down[w])
		}
		if n.left[w] != nil {
			c.leftLocked(w)
		}
	}
	for _, m := range n.pending[c.id] {
		c.deliver(m.from, m.lane, m.h, m.payload, true)
	}
	delete(n.pending, c.id)
	return nil
}

// unregister removes c; the last one out closes the node.
func (n *node) unregister(c *Comm) {
	n.mu.Lock()
	delete(n.comms, c.id)
	delete(n.topo.born, c.id)
	n.refs--
	last := n.refs == 0
	n.mu.Unlock()
	if last {
		n.close()
	}
}

func (n *node) close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	close(n.done)
	n.endLife()
	var held int64
	for _, ms := range n.pending {
		for _, m := range ms {
			held += int64(len(m.payload))
		}
	}
	n.pending = nil
	lb := n.lobby
	n.lobby = nil
	n.mu.Unlock()
	n.release(held)
	if lb != nil {
		lb.close()
	}
	if n.ep != nil {
		_ = n.ep.Close()
	}
	n.wg.Wait()
	for _, f := range n.closers {
		_ = f()
	}
}
