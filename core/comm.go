package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core/internal/match"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/transport"
)

// AnySource lets a receive match a message from any rank.
const AnySource = -1

// Status describes a completed receive. Count is in bytes.
type Status struct {
	Source int
	Tag    uint64
	Count  int
}

// Comm is a communicator: a group of ranks with point-to-point messages and
// collectives. All methods are safe for concurrent use; as in MPI, ranks
// must issue collectives on one Comm in the same order (the order in which
// the calls are made, across goroutines, is the order they take).
type Comm struct {
	n     *node
	id    uint64
	rank  int
	size  int
	world []int // comm rank -> world rank
	// byWorld is the inverse of world, by world rank of the node (-1:
	// not a member); read with rankOfWorld.
	byWorld []int32
	cfg     Config
	// tuningDigest is cfg.Tuning.Digest(), put in every signature.
	tuningDigest uint16
	// gen is the membership generation c was created in: its messages
	// carry it, and it takes only messages that carry it.
	gen membership.Generation

	ctx    context.Context // cancelled when the comm fails or closes
	cancel context.CancelFunc
	failed chan struct{}  // closed with err set
	ops    sync.WaitGroup // running operation goroutines
	bg     sync.WaitGroup // abort broadcasts started on failure

	// The started collective not run yet, and the timer that runs it
	// (call.go, deferCall); atomics, taken without mu.
	deferred   atomic.Pointer[collCall]
	laterArmed atomic.Bool
	armedFor   atomic.Pointer[collCall] // the call the armed timer is for
	later      *time.Timer              // stopped until a call is deferred
	deferWait  time.Duration            // deferWindow; longer in tests that watch a deferred call

	closeOnce sync.Once

	// mu guards the following fields.
	mu        sync.Mutex
	err       error
	nextSeq   uint64
	callTab   callTable       // signatures by call: own calls not completed, peers' calls not made here yet (core/calltable.go)
	match     *match.Engine   // matching of inbound messages and receives; settleLocked acts on its completions
	sendTail  []chan struct{} // per peer: done when the previous p2p send finished
	gone      map[int]departure
	fwd       *Error     // the failure a member's goodbye reported, to report in ours
	collLimit uint64     // collectives from this seq on can never complete (a member left)
	filled    *sync.Cond // on mu: broadcast when a placed chunk is written (see waitFilledLocked)
	lost      failures   // members found failed (Failures, Failed)
	rec       recovery   // revoke, agreements, failure policy (core/recover.go)
	closing   bool       // Close has begun: no automatic shrink starts

	// fillWaiters counts goroutines in waitFilledLocked (core/matching.go).
	fillWaiters atomic.Int32
	// departed: some member left (gone is not empty); until then a
	// collective send needs no look at gone (collSendSkip).
	departed atomic.Bool

	rpc *rpcState // handlers and calls in flight (core/rpc.go), under its own lock

	flight *flightRecorder // the last operations (core/flight.go), under its own lock; nil: off

	// Memory and traffic (core/stats.go).
	// slabs carves the large buffers of scratch and early where the data
	// path registers memory (newSlabs), so that both pools share its
	// slabs' registrations; nil elsewhere. Closed after scratch.
	slabs   *collective.Slabs
	scratch *collective.ScratchPool // the schedules' temporaries, idle ones within cfg.ScratchIdleBytes
	// early holds the buffers of chunks that arrive before their
	// receive (placeEarly), idle ones within earlyPoolBytes.
	early   bufPool
	calls   sync.Pool // *collCall of blocking calls that ended cleanly (call.go: recycle)
	traffic traffic   // messages and bytes of this communicator
}

// departure records that a member destroyed its communicator: every message
// it sent on it has been delivered, and it completed every collective
// before seq (and none from seq on). err is its departure, or the failure
// its goodbye reported.
type departure struct {
	seq uint64
	err *Error // Op is filled in per operation
}

func newComm(n *node, id uint64, rank int, world []int) *Comm {
	slabs := newSlabs(n)
	c := &Comm{
		n: n, id: id, rank: rank, size: len(world), world: world,
		cfg: n.cfg, tuningDigest: n.cfg.Tuning.Digest(), gen: n.view.Gen,
		failed:    make(chan struct{}),
		callTab:   callTable{minFailed: math.MaxUint64},
		match:     match.New(len(world)),
		sendTail:  make([]chan struct{}, len(world)),
		gone:      make(map[int]departure),
		collLimit: math.MaxUint64,
		lost:      newFailures(len(world)),
		rpc:       newRPCState(n.cfg.RPCHandlers, rpcPoolBytes(n.cfg)),
		rec:       recovery{policy: n.cfg.OnFailure, stop: make(chan struct{})},
		flight:    newFlightRecorder(n.cfg, n.log, id, rank),
		slabs:     slabs,
		scratch:   collective.NewScratchPoolFrom(n.cfg.ScratchIdleBytes, slabs),
		early:     bufPool{max: earlyPoolBytes(n.cfg), slabs: slabs},
	}
	c.match.Free = c.early.put
	c.byWorld = make([]int32, n.size)
	for i := range c.byWorld {
		c.byWorld[i] = -1
	}
	for r, w := range world {
		if w >= 0 && w < len(c.byWorld) { // always: world ranks are the node's
			c.byWorld[w] = int32(r)
		}
	}
	if lay := n.layout(world); lay != nil { // core/topo.go
		c.cfg.Tuning.Layout = lay
		c.tuningDigest = c.cfg.Tuning.Digest()
	}
	if h := n.hosts(world); h != nil && c.cfg.Tuning.Hosts == nil { // core/topo.go
		c.cfg.Tuning.Hosts = h
		c.tuningDigest = c.cfg.Tuning.Digest()
	}
	c.filled = sync.NewCond(&c.mu)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.deferWait = deferWindow
	c.later = time.AfterFunc(time.Hour, c.deferredDue)
	c.later.Stop()
	return c
}

// rankOfWorld is the rank in c of world rank w; ok is false (r -1) when
// w is not a member of c.
func (c *Comm) rankOfWorld(w int) (r int, ok bool) {
	if w < 0 || w >= len(c.byWorld) || c.byWorld[w] < 0 {
		return -1, false
	}
	return int(c.byWorld[w]), true
}

// NewLocal builds n communicators in this process, connected by the
// in-memory transport; element i is rank i. cfg's Rank, WorldSize, Seed and
// Token are ignored.
func NewLocal(n int, cfg Config) ([]*Comm, error) {
	return newLocalWrapped(n, cfg, nil)
}

// newLocalWrapped is NewLocal whose rank i drives wrap(i, its endpoint) when wrap
// is not nil (tests put a recording or failing path there).
func newLocalWrapped(n int, cfg Config, wrap func(int, transport.DataPath) transport.DataPath) ([]*Comm, error) {
	if n < 1 {
		return nil, invalidArg("new", "world size %d must be >= 1", n)
	}
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if err := cfg.Tuning.Validate(); err != nil {
		return nil, invalidArg("new", "Config.Tuning: %v", err)
	}
	if err := cfg.validateMemory(); err != nil {
		return nil, err
	}
	if err := onDemand(cfg, n, true); err != nil {
		return nil, err
	}
	g, err := topologyGraph(cfg.Topology, n)
	if err != nil {
		return nil, err
	}
	sched, err := scheduleGraph(cfg, g, n)
	if err != nil {
		return nil, err
	}
	if cfg.Mesh == nil {
		return nil, errNoMesh()
	}
	nodes := make([]*node, n)
	rs := make([]transport.Receiver, n)
	for i := range nodes {
		nd := newNode(cfg, i, n)
		nd.sched, nd.graph = sched, g
		nodes[i] = nd
		rs[i] = transport.Receiver{Handle: nd.handle, Down: nd.onDown, RelayLost: nd.relayLost}
	}
	ms, err := cfg.Mesh.Local(meshOptions(cfg, g), rs)
	if err != nil {
		return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
	}
	comms := make([]*Comm, n)
	for i, nd := range nodes {
		m := ms[i]
		if wrap != nil {
			m.Path = wrap(i, m.Path)
		}
		comms[i] = worldComm(nd, m)
	}
	for _, nd := range nodes {
		nd.start()
	}
	return comms, nil
}

// worldComm attaches the path of m to nd, with the optional capabilities
// found on m's parts, and creates its world communicator; the caller
// starts nd once every node of the process is attached.
func worldComm(nd *node, m transport.Mesh) *Comm {
	world := make([]int, nd.size)
	for i := range world {
		world[i] = i
	}
	if rh, ok := transport.As[transport.RingHolder](m); ok {
		nd.ringBytes = rh.RingBytes
	}
	if nd.graph != nil {
		nd.cast, _ = transport.As[transport.Broadcaster](m)
		nd.fwd, _ = transport.As[transport.Forwarder](m)
	}
	poll, ok := m.Path.(transport.Poller)
	if !ok {
		poll = transport.NoPoller{}
	}
	reg, _ := transport.As[transport.Registrar](m)
	nd.mu.Lock() // a transport goroutine may be in peerDown already
	nd.ep, nd.caps, nd.poll, nd.reg = m.Path, m.Path.Caps(), poll, reg
	nd.mu.Unlock()
	c := newComm(nd, worldID, nd.rank, world)
	_ = nd.register(c) // a fresh node is never closed
	c.startFlight()
	return c
}

// worldID is the id of every world communicator; split children derive
// theirs from it (see childID).
const worldID = 0

// Rank is this process's rank in c.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in c.
func (c *Comm) Size() int { return c.size }

// Timeout is the bound of c's operations (Config.Timeout, default filled
// in), for layers above core that wait on work of their own for a call
// (package hier: NCCL's). Safe for concurrent use.
func (c *Comm) Timeout() time.Duration { return c.cfg.Timeout }

// Config is the configuration c was made with, the environment and the
// defaults filled in (split children share their parent's), less the
// token and the environment reader: for layers above core that act on
// knobs of their own (capi's device paths: NCCLHier, HierHostID,
// CUDARuntime, NCCLLibrary). Safe for concurrent use.
func (c *Comm) Config() Config {
	cfg := c.cfg
	cfg.Token, cfg.Env = nil, nil
	return cfg
}

// Err returns the sticky failure of c, or nil while it is healthy.
func (c *Comm) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Abort fails every pending and later operation on c with err (wrapped in
// an *Error with CodeAborted unless it is one already) and tells the other
// ranks, whose operations then fail too.
func (c *Comm) Abort(err error) {
	var e *Error
	if !errors.As(err, &e) {
		msg := "aborted"
		if err != nil {
			msg = "aborted: " + err.Error()
		}
		e = &Error{Code: CodeAborted, Op: "abort", Rank: c.rank, Msg: msg, Cause: err}
	}
	if c.fail(e) {
		c.broadcastAbort(e)
	}
}

// Close destroys c: pending operations fail with CodeClosed, and the
// goroutines and buffers of c are released; the transport endpoint is
// closed with the last communicator that shares it. Close is local (not
// collective) and idempotent.
//
// Close is a graceful departure: the other ranks are told, after every
// message this rank sent on c, which collectives it completed. Their
// operations that need nothing more from this rank complete normally; those
// that still need data from it or must send to it fail with CodePeerDown
// ("rank r has destroyed its communicator"), without failing c for them.
// If c had failed, the goodbye carries the failure, and the others' c fail
// with it ("rank 2 is unreachable: ... (reported by rank 1, which then
// destroyed its communicator)").
func (c *Comm) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		done := c.callTab.firstUnfinished(c.nextSeq) // every collective before it completed here
		cause := c.fwd
		if e := (*Error)(nil); cause == nil && errors.As(c.err, &e) && e.Code != CodeClosed && !isDeparture(c.err) {
			cause = e
		}
		c.closing = true
		close(c.rec.stop)
		c.mu.Unlock()
		c.fail(newError(CodeClosed, "close", c.rank, "communicator is closed"))
		c.later.Stop()
		c.launchDeferred() // it fails at once: closed
		c.ops.Wait()
		c.rpc.running.Wait() // handlers see their context end
		c.bg.Wait()
		c.sayBye(done, cause)
		c.mu.Lock()
		held := c.match.Drop()
		c.closeFailuresLocked()
		c.mu.Unlock()
		c.n.release(held)
		c.n.unregister(c)
		c.scratch.Close()
		c.slabs.Close() // after the pools' last use: drops the slabs' registrations
	})
	return nil
}

// fail makes err the sticky failure of c; it reports whether it did (false
// when c had already failed).
func (c *Comm) fail(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failLocked(err)
}

func (c *Comm) failLocked(err error) bool {
	c.noteFailureLocked(err) // reported even when c had failed already
	if c.err != nil {
		return false
	}
	c.err = err
	// RPC calls fail before the contexts end: a waiter woken by them then
	// finds its call failed with err, not expired.
	c.rpc.failAll(err)
	close(c.failed)
	c.cancel()
	if c.rec.policy == PolicyShrink && autoShrinks(err) {
		c.startAutoShrinkLocked()
	}
	if CodeOf(err) != CodeClosed {
		c.n.log.Warn("nexar: communicator failed", "comm", c.id, "rank", c.rank, "err", err)
	}
	return true
}

// peerDownLocked is called with node.mu held.
func (c *Comm) peerDownLocked(w int, why error) {
	r, ok := c.rankOfWorld(w)
	if !ok {
		return
	}
	c.mu.Lock()
	_, left := c.gone[r]
	c.mu.Unlock()
	if left {
		return // everything it sent here was delivered: its loss changes nothing
	}
	msg := fmt.Sprintf("rank %d is unreachable: %v", r, why)
	if c.id != worldID && r != w {
		msg = fmt.Sprintf("rank %d (world rank %d) is unreachable: %v", r, w, why)
	}
	c.fail(&Error{Code: CodePeerDown, Op: "comm", Rank: r, Msg: msg, Cause: why})
}

// lostWhileStalledLocked is peerDownLocked when this process had just been
// stopped or starved for stalled, past the peers' heartbeat timeout: they
// have probably declared this rank unreachable, which is the failure to
// report, not the healthy peer it lost since.
func (c *Comm) lostWhileStalledLocked(w int, stalled time.Duration, why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lost, ok := c.liveMemberNameLocked(w)
	if !ok {
		return
	}
	c.failLocked(&Error{Code: CodePeerDown, Op: "comm", Rank: c.rank, Cause: why, Msg: c.stalledMsg(stalled, lost, why)})
}

// stalledMsg says that this rank was stopped or stalled for stalled, and
// then lost member lost (why).
func (c *Comm) stalledMsg(stalled time.Duration, lost string, why error) string {
	return fmt.Sprintf("this rank (%d) was stopped or stalled for %v (heartbeat timeout %v), so the others have probably declared it unreachable; it then lost %s (%v)",
		c.rank, stalled.Round(100*time.Millisecond), c.cfg.HeartbeatTimeout, lost, why)
}

// liveMemberNameLocked names world rank w as a rank of c ("rank 1", or
// "rank 1 (world rank 3)" in a split communicator); ok is false when w is
// not a member or has left c (it needs nothing more from this rank on c).
// Called with c.mu held.
func (c *Comm) liveMemberNameLocked(w int) (name string, ok bool) {
	r, ok := c.rankOfWorld(w)
	if !ok {
		return "", false
	}
	if _, left := c.gone[r]; left {
		return "", false
	}
	if c.id != worldID && r != w {
		return fmt.Sprintf("rank %d (world rank %d)", r, w), true
	}
	return fmt.Sprintf("rank %d", r), true
}

// broadcastAbort tells every other rank, best effort and bounded in time,
// why c failed.
func (c *Comm) broadcastAbort(e *Error) {
	if c.size == 1 {
		return
	}
	payload := encodeCause(e)
	var th transport.Header
	(&header{kind: kindControl, sub: ctlAbort, comm: c.id, total: uint64(len(payload))}).encode(&th, c.gen)
	for p := 0; p < c.size; p++ {
		if p == c.rank || c.peerIsDown(p) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HeartbeatTimeout)
		_ = c.n.ep.Send(ctx, c.world[p], transport.LaneControl, &th, payload)
		cancel()
	}
}

func (c *Comm) peerIsDown(p int) bool {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	return c.n.down[c.world[p]] != nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// failure returns the sticky error relabelled for op.
func (c *Comm) failure(op string) error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err == nil {
		return nil
	}
	return withOp(err, op)
}

// deliver routes one inbound message. preAccounted means its payload is
// already counted in node.buffered (a replay from node.pending, called with
// node.mu held: deliver must then not block).
func (c *Comm) deliver(from int, lane transport.Lane, h header, payload []byte, preAccounted bool) {
	src, ok := c.rankOfWorld(from)
	data := h.kind == kindColl || h.kind == kindP2P
	if preAccounted && (!ok || !data) {
		// Only matched data stays accounted (held by the engine); the
		// rest is done with here. release wakes deliveries waiting for room.
		c.n.release(int64(len(payload)))
	}
	if !ok {
		c.n.log.Warn("nexar: message from a non-member", "comm", c.id, "from", from)
		return
	}
	if h.gen != c.gen {
		// Sent in another membership of this communicator's members:
		// nothing here may take it.
		if preAccounted && data {
			c.n.release(int64(len(payload)))
		}
		c.n.stale.Add(1)
		c.n.log.Debug("nexar: dropping message of another membership generation", "comm", c.id, "from", from,
			"generation", h.gen, "ours", c.gen)
		return
	}
	switch h.kind {
	case kindControl:
		c.control(src, h, payload)
	case kindColl, kindP2P:
		c.deliverData(src, h, payload, preAccounted, false)
	case kindRPC:
		c.deliverRPC(src, h, payload, preAccounted)
	}
}

func (c *Comm) control(src int, h header, payload []byte) {
	switch h.sub {
	case ctlSigCheck:
		c.mu.Lock()
		c.checkSigLocked(src, h.seqOrTag, h.sig)
		c.mu.Unlock()
	case ctlBye:
		orig, relayed := c.byeCause(src, payload)
		c.mu.Lock()
		if relayed != nil && c.failLocked(relayed) {
			c.fwd = orig
		}
		c.departLocked(src, h.seqOrTag, relayed)
		c.mu.Unlock()
	case ctlRevoke:
		c.revokeMessage(src, payload)
	case ctlAgree:
		c.agreeMessage(src, h.seqOrTag, payload)
	case ctlGrow:
		c.growMessage(src, h.seqOrTag, payload)
	case ctlGrowAbort:
		c.growAbortMessage(src, h.seqOrTag, payload)
	case ctlAbort:
		e := c.decodeCause(payload)
		if e == nil {
			return
		}
		// Blame the rank the sender's failure names (the dead rank behind
		// "rank 2 failed: rank 3 is unreachable"), else the sender. A
		// mismatch names the pair in its message; the sender is its witness.
		if e.Code == CodeMismatch || e.Rank < 0 {
			e.Rank = src
		}
		if e.Code != CodeMismatch {
			e.Msg = fmt.Sprintf("rank %d failed: %s", src, e.Msg)
		}
		c.fail(e)
	}
}

// checkSigLocked compares a peer's signature for seq with ours (kept from
// the call until it completes), or keeps it until we make call seq. Every
// data message of a collective and every ring check carries one.
func (c *Comm) checkSigLocked(src int, seq uint64, sig signature) {
	s := c.callTab.get(seq)
	if s != nil && s.hasMine {
		if !s.mine.matches(sig) {
			c.mismatchLocked(s.mine, src, sig)
		}
		return
	}
	if seq < c.nextSeq {
		return // our call seq has completed, every message checked
	}
	if s != nil && s.hasRemote {
		if !s.remote.matches(sig) {
			c.mismatchBetweenLocked(s.from, s.remote, src, sig)
		}
		return
	}
	s = c.callTab.at(seq)
	s.remote, s.from, s.hasRemote = sig, src, true
}

func (c *Comm) mismatchLocked(mine signature, src int, theirs signature) {
	ms, ts := describePair(mine, theirs)
	e := &Error{Code: CodeMismatch, Op: mine.kind.String(), Rank: src,
		Msg: fmt.Sprintf("rank %d called %s but rank %d called %s", c.rank, ms, src, ts)}
	c.failAndTellLocked(e)
}

// failAndTellLocked fails c and, in the background, tells the other ranks.
func (c *Comm) failAndTellLocked(e *Error) {
	if c.failLocked(e) {
		c.bg.Add(1)
		go func() {
			defer c.bg.Done()
			c.broadcastAbort(e)
		}()
	}
}

func (c *Comm) mismatchBetweenLocked(a int, asig signature, b int, bsig signature) {
	as, bs := describePair(asig, bsig)
	e := &Error{Code: CodeMismatch, Op: "comm", Rank: b,
		Msg: fmt.Sprintf("rank %d called %s but rank %d called %s", a, as, b, bs)}
	c.failAndTellLocked(e)
}

// byeTimeout bounds the departure notices of Close.
const byeTimeout = 2 * time.Second

// sayBye tells every live member, best effort, that this rank leaves and
// completed every collective before done, and why if c had failed (cause
// not nil).
func (c *Comm) sayBye(done uint64, cause *Error) {
	if c.size == 1 {
		return
	}
	var payload []byte
	if cause != nil {
		payload = encodeCause(cause)
	}
	var th transport.Header
	(&header{kind: kindControl, sub: ctlBye, comm: c.id, seqOrTag: done, total: uint64(len(payload))}).encode(&th, c.gen)
	ctx, cancel := context.WithTimeout(context.Background(), min(byeTimeout, c.cfg.HeartbeatTimeout))
	defer cancel()
	var wg sync.WaitGroup
	var cast []int // world ranks told in one broadcast (core/topo.go)
	for p := 0; p < c.size; p++ {
		if p == c.rank || c.peerIsDown(p) {
			continue
		}
		if c.n.byeSkipped(c.world[p]) {
			continue
		}
		if c.n.byeByCast(c.world[p]) {
			cast = append(cast, c.world[p])
			continue
		}
		// Behind every data message of c to p; where none ever went (a
		// shared-memory ring not made yet), the control lane keeps that
		// order without making a ring just to say goodbye.
		lane := transport.LaneData
		if c.n.caps.LazyData && c.n.ep.DataUnused(c.world[p]) {
			lane = transport.LaneControl
		}
		wg.Go(func() { _ = c.n.ep.Send(ctx, c.world[p], lane, &th, payload) })
	}
	if len(cast) > 0 {
		wg.Go(func() { _ = c.n.cast.Broadcast(ctx, transport.LaneControl, &th, payload, cast) })
	}
	wg.Wait()
}

// encodeCause is the payload of an abort, and of a goodbye from a failed
// communicator: code byte, the rank the failure names (int32, comm rank,
// -1 = none) and a UTF-8 message of at most 4096 bytes.
func encodeCause(e *Error) []byte {
	msg := truncate(e.Msg, 4096)
	b := make([]byte, 5, 5+len(msg))
	b[0] = byte(e.Code)
	binary.LittleEndian.PutUint32(b[1:], uint32(int32(e.Rank)))
	return append(b, msg...)
}

// byeCause decodes the failure a goodbye from comm rank src reports: as
// sent (orig), and as this rank's failure (relayed); nil, nil for a clean
// close.
func (c *Comm) byeCause(src int, p []byte) (orig, relayed *Error) {
	orig = c.decodeCause(p)
	if orig == nil {
		return nil, nil
	}
	relayed = &Error{Code: orig.Code, Op: "comm", Rank: orig.Rank,
		Msg: fmt.Sprintf("%s (reported by rank %d, which then destroyed its communicator)", orig.Msg, src)}
	return orig, relayed
}

// decodeCause decodes an encodeCause payload; nil when p is too short. An
// unknown code reads as CodeAborted, a rank outside c as -1.
func (c *Comm) decodeCause(p []byte) *Error {
	if len(p) < 5 {
		return nil
	}
	code := Code(p[0])
	if code <= CodeOK || code >= numCodes {
		code = CodeAborted
	}
	rank := int(int32(binary.LittleEndian.Uint32(p[1:])))
	if rank < -1 || rank >= c.size {
		rank = -1
	}
	return &Error{Code: code, Op: "comm", Rank: rank, Msg: string(p[5:])}
}

// errDeparted is the cause of the errors of operations that needed a member
// that destroyed its communicator.
var errDeparted = fmt.Errorf("core: %w", transport.ErrPeerClosed)

func (c *Comm) departedError(r int) *Error {
	msg := fmt.Sprintf("rank %d has destroyed its communicator", r)
	if w := c.world[r]; c.id != worldID && r != w {
		msg = fmt.Sprintf("rank %d (world rank %d) has destroyed its communicator", r, w)
	}
	return &Error{Code: CodePeerDown, Op: "comm", Rank: r, Msg: msg, Cause: errDeparted}
}

// isDeparture reports whether err comes from a member's graceful departure,
// which fails the operations that need it but not the communicator.
func isDeparture(err error) bool { return errors.Is(err, transport.ErrPeerClosed) }

// departLocked records that comm rank r left after completing every
// collective before seq, and fails what can no longer complete: receives
// from r, and the collectives from seq on, with cause when r reported a
// failure, else as departed. Called with c.mu held (and possibly node.mu).
func (c *Comm) departLocked(r int, seq uint64, cause *Error) {
	if _, ok := c.gone[r]; ok || r == c.rank {
		return
	}
	d := departure{seq: seq, err: c.departedError(r)}
	if cause != nil {
		d.err = cause
	}
	c.gone[r] = d
	c.departed.Store(true)
	c.suspectDepartedLocked(r)
	c.collLimit = min(c.collLimit, seq)
	release := c.match.Depart(r, c.collLimit, d.err)
	c.settleLocked()
	if release > 0 {
		c.n.release(release)
	}
}

// departedLocked returns the error for op if it needs comm rank r, which
// has left, or nil.
func (c *Comm) departedLocked(op string, r int) error {
	if d, ok := c.gone[r]; ok {
		return withOp(d.err, op)
	}
	return nil
}

// collDepartedLocked returns the error for collective seq if a member left
// before completing it, or nil.
func (c *Comm) collDepartedLocked(op string, seq uint64) error {
	if seq < c.collLimit {
		return nil
	}
	first := -1
	for r, d := range c.gone {
		if d.seq <= seq && (first < 0 || r < first) {
			first = r
		}
	}
	return withOp(c.gone[first].err, op)
}

// collSendSkip decides a collective send to comm rank peer for seq: skip
// it (true, nil) when peer left after completing seq, which therefore
// needs nothing more; fail it when peer left before; else (false, nil).
func (c *Comm) collSendSkip(peer int, seq uint64, op string) (bool, error) {
	if !c.departed.Load() {
		// Nobody left: nothing to skip or fail. A departure recorded
		// meanwhile fails this send, which asks again (link.send).
		return false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.gone[peer]
	if !ok {
		return false, c.collDepartedLocked(op, seq)
	}
	if seq < d.seq {
		return true, nil
	}
	return false, withOp(d.err, op)
}

// leftLocked handles world rank w's graceful transport departure, called
// with node.mu held. If w said goodbye on c this changes nothing; if not,
// no collective not completed yet can complete.
func (c *Comm) leftLocked(w int) {
	r, ok := c.rankOfWorld(w)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.departLocked(r, 0, nil)
}

// declaredDownLocked handles world rank w's notice that it declared this
// rank unreachable (why: its reason); called with node.mu held. Whatever
// this rank saw meanwhile (e.g. silence after being stopped), that is the
// failure to report.
func (c *Comm) declaredDownLocked(w int, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	by, ok := c.liveMemberNameLocked(w)
	if !ok {
		return
	}
	c.failLocked(&Error{Code: CodePeerDown, Op: "comm", Rank: c.rank,
		Msg: fmt.Sprintf("this rank (%d) was declared unreachable by %s (%s)", c.rank, by, why)})
}
