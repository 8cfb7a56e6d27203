package bulk

import (
	"fmt"
	"math/bits"
)

// This file is the negotiator: both negotiations, of the data channels
// and of the RPC channels, as one IO-free state machine in the manner of
// raft's RawNode and quic-go's ackhandler. The endpoint (control.go) feeds
// it events (step): Start, a peer's message, a first send or call to a
// peer, the outcome of an action it asked for, a deadline, a peer's loss,
// Close. It answers with actions: messages to send, and the IO to perform
// (make or open a ring, listen or dial, test cross-memory attach), whose
// outcome the endpoint feeds back as the next event. It has no sockets,
// no goroutines, no clock and no locks: the endpoint serialises every
// step under Endpoint.mu and performs the actions after.
//
// Each direction of a pair is owned by its receiving side, which offers
// the channel; the sending side attaches or refuses. Data and RPC are
// separate directions, so crossing messages (two hellos, two wants, two
// rpcwants) never conflict and need no tie-break: each makes its own
// channel. A message that comes when its direction is past the point it
// answers (a duplicate, or an offer after Start gave up on the peer, after
// the RPC deadline, after the peer's loss) is dropped with a note; a shm
// offer so dropped is answered "too late", so that its maker closes the
// ring.

// negConfig is what the negotiator knows of this rank, fixed at New.
type negConfig struct {
	self, size int
	talks      []bool    // per rank: channels are made with it (Options.Peers); false for self
	host       string    // this host's id
	kernel     string    // this machine's running kernel (hostid.Kernel; empty: unknown)
	cpus       []uint64  // the CPUs this process may run on (sched.Allowed; nil: unknown)
	me         procClaim // this process, carried by hello and data offers (PID 0: not known)
	shm        bool      // shared memory allowed and supported
	tcp        bool      // TCP allowed
	rdma       bool      // an RDMA device, and the mode allows it
	rdmaOnly   bool      // ModeRDMA: RDMA on one host too
	plaintext  bool
	conns      int   // TCP connections per data channel
	ringSize   int   // Options.RingSize
	ringBudget int   // Options.RingBudget
	dataProbe  probe // in an OK result for a data ring; zero: none
	rpcProbe   probe // in an OK rpcresult; zero: none
	testRemote bool  // test a ring sender's probe (cross-memory attach)
}

// outPhase is where this rank's outbound data direction to a peer is.
type outPhase uint8

const (
	outNone    outPhase = iota // self, or a rank this one does not talk to
	outWait                    // hello sent, no offer yet (counted in left)
	outLazy                    // a local peer: its ring is asked for with the first message
	outAsked                   // want sent, no offer yet
	outDecided                 // fixed: a channel or the inner endpoint
)

// inPhase is where an inbound direction (data or RPC) from a peer is.
type inPhase uint8

const (
	inNone  inPhase = iota
	inBusy          // making what to offer (a ring, an RDMA end, a TCP offer)
	inLazy          // said shm-lazy: waiting for want
	inRing          // offered a ring
	inRDMA          // offered a queue pair
	inTCP           // offered TCP
	inQUIC          // offered nothing: the inner endpoint
	inFixed         // the sender's result was taken
)

// rpcPhase is where this rank's outbound RPC direction to a peer is.
type rpcPhase uint8

const (
	rpcIdle    rpcPhase = iota // no call yet
	rpcAsked                   // rpcwant sent, no offer yet
	rpcDecided                 // fixed: a channel or the inner endpoint
)

type peerNeg struct {
	out        outPhase
	opening    bool // attaching to a data offer (open, dial) is under way
	local      bool // on this host: data ring on first use
	in         inPhase
	inTCP      bool // the peer can dial TCP: the data fallback
	rpcOut     rpcPhase
	rpcOpening bool
	rpcIn      inPhase
	rpcInTCP   bool
	down       bool
	kernel     bool     // its hello said it runs on this rank's kernel
	cpus       []uint64 // the CPUs its hello said it may run on (nil: unknown)
}

// negotiator is the negotiation's state. Not safe for concurrent use.
type negotiator struct {
	cfg     negConfig
	peers   []peerNeg
	left    int // peers in outWait: Start returns when none is
	closing bool
	acts    []action // what the current step emits
}

func newNegotiator(cfg negConfig) *negotiator {
	n := &negotiator{cfg: cfg, peers: make([]peerNeg, cfg.size)}
	for r := range n.peers {
		if cfg.talks[r] {
			n.peers[r].out = outWait
			n.left++
		}
	}
	return n
}

// Events.
type (
	event interface{ isEvent() }

	evStart        struct{} // send the hellos
	evStartTimeout struct{} // Start's context ended: unanswered peers stay on the inner endpoint
	evRecv         struct {
		from int
		m    message
	} // a peer's message (not bye, byeack: procdeath.go)
	evConnect    struct{ peer int } // the first data message to a local peer waits for its ring
	evRPCConnect struct{ peer int } // the first call to a peer waits for its RPC channel
	evRPCTimeout struct{ peer int } // the actTimer armed for peer fired
	evSendFailed struct {           // a want or rpcwant could not be sent
		peer int
		t    msgType
	}
	evRingMade struct { // outcome of actMakeRing
		peer int
		rpc  bool
		ring ringSpec
		err  error
	}
	evRDMAListening struct { // outcome of actListenRDMA
		peer int
		qp   []byte
		err  error
	}
	evTCPArmed struct { // outcome of actArmTCP
		peer int
		rpc  bool
		dial dialSpec
		err  error
	}
	evAttached struct { // outcome of actOpenRing, actDial, actDialRDMA
		peer int
		rpc  bool
		kind pathKind
		ch   any    // the channel made (*channel, *rpcChan); nil on error
		qp   []byte // rdma: this end's parameters
		err  error
	}
	evPeerDown struct{ peer int } // the peer is down
	evClose    struct{}           // the endpoint closes: nothing more is made
)

func (evStart) isEvent()         {}
func (evStartTimeout) isEvent()  {}
func (evRecv) isEvent()          {}
func (evConnect) isEvent()       {}
func (evRPCConnect) isEvent()    {}
func (evRPCTimeout) isEvent()    {}
func (evSendFailed) isEvent()    {}
func (evRingMade) isEvent()      {}
func (evRDMAListening) isEvent() {}
func (evTCPArmed) isEvent()      {}
func (evAttached) isEvent()      {}
func (evPeerDown) isEvent()      {}
func (evClose) isEvent()         {}

// Actions. Those the endpoint applies under its lock (bookkeeping) are
// actInstall, actDiscard, actLater and actReady; the others are IO.
type (
	action interface{ String() string }

	actSend struct {
		to int
		m  message
	}
	actMakeRing struct { // make a ring (rpc: and its doorbell), read it, report evRingMade
		peer int
		rpc  bool
		size int // data: the capacity asked for; rpc: 0 (the RPC allowance sizes it)
	}
	actListenRDMA struct{ peer int } // make the receiving end of an RDMA channel, report evRDMAListening
	actArmTCP     struct {           // bind the listener, arm a nonce, report evTCPArmed
		peer  int
		rpc   bool
		conns int
	}
	actOpenRing struct { // open the ring offered, report evAttached
		peer int
		rpc  bool
		ring ringSpec
	}
	actDial struct { // dial the TCP offer, report evAttached
		peer int
		rpc  bool
		dial dialSpec
	}
	actDialRDMA struct {
		peer int
		qp   []byte
	} // connect to the queue pair offered, report evAttached
	actAcceptRDMA struct {
		peer int
		qp   []byte
	} // complete the receiving end offered, and read it
	actTestRemote struct { // test the probe; if readable, let the ring carry remote frames
		peer  int
		rpc   bool
		probe probe
	}
	actDropInbound struct { // close what was offered to peer: the sender did not take it
		peer int
		rpc  bool
		kind pathKind
	}
	actUnlinkBell struct{ peer int } // the RPC ring's doorbell is open, or never will be
	actInstall    struct {           // fix the outbound path to peer (ch nil: the inner endpoint)
		peer int
		rpc  bool
		ch   any
		lazy bool // data: a local peer whose sends wait for this
	}
	actDiscard struct {
		peer int
		ch   any
	} // close a channel nobody will use
	actLater struct{ peer int } // data to local peer: ring on first use
	actReady struct{}           // every outbound data direction is fixed: Start returns
	actTimer struct{ peer int } // report evRPCTimeout for peer after rpcConnectTimeout
	actNote  struct {           // a message dropped or a path refused, for the log
		peer int
		warn bool
		why  string
	}
)

// step takes one event and returns the actions it leads to.
func (n *negotiator) step(ev event) []action {
	n.acts = nil
	if n.closing {
		// Nothing more is made; a channel made meanwhile is closed.
		if a, ok := ev.(evAttached); ok && a.ch != nil {
			n.emit(actDiscard{a.peer, a.ch})
		}
		return n.acts
	}
	switch ev := ev.(type) {
	case evStart:
		hello := helloMsg{Proc: n.cfg.me, SHM: n.cfg.shm, TCP: n.cfg.tcp, RDMA: n.cfg.rdma, Kernel: n.cfg.kernel, CPUs: n.cfg.cpus}
		hello.Proc.Host = n.cfg.host
		for r, t := range n.cfg.talks {
			if t {
				n.emit(actSend{r, hello})
			}
		}
	case evStartTimeout:
		for r := range n.peers {
			if p := &n.peers[r]; p.out == outWait {
				p.out = outDecided
				n.emit(actNote{r, true, "no answer from peer; its data stays on QUIC"})
			}
		}
	case evRecv:
		n.recv(ev.from, ev.m)
	case evConnect:
		if p := n.peer(ev.peer); p != nil && p.out == outLazy {
			p.out = outAsked
			n.emit(actSend{ev.peer, wantMsg{Size: n.pairRing(), TCP: n.cfg.tcp}})
		}
	case evRPCConnect:
		if p := n.peer(ev.peer); p != nil && p.rpcOut == rpcIdle && !p.down {
			p.rpcOut = rpcAsked
			n.emit(actSend{ev.peer, rpcWantMsg{Host: n.cfg.host, SHM: n.cfg.shm, TCP: n.cfg.tcp}})
			n.emit(actTimer{ev.peer})
		}
	case evRPCTimeout:
		if p := n.peer(ev.peer); p != nil && p.rpcOut == rpcAsked {
			n.emit(actNote{ev.peer, true, "no RPC channel offer from peer; its RPC stays on QUIC"})
			n.rpcDecide(ev.peer, nil)
		}
	case evSendFailed:
		p := n.peer(ev.peer)
		switch {
		case p == nil:
		case ev.t == msgWant && p.out == outAsked:
			n.decide(ev.peer, nil)
		case ev.t == msgRPCWant && p.rpcOut == rpcAsked:
			n.rpcDecide(ev.peer, nil)
		}
	case evRingMade:
		n.ringMade(ev)
	case evRDMAListening:
		p := n.peer(ev.peer)
		if p == nil || p.in != inBusy {
			break
		}
		if ev.err != nil {
			n.emit(actNote{ev.peer, true, "no RDMA channel; trying the next path: " + ev.err.Error()})
			n.offerTCPOrQUIC(ev.peer, false)
			break
		}
		p.in = inRDMA
		n.emit(actSend{ev.peer, offerMsg{Kind: pathRDMA, Proc: n.cfg.me, QP: ev.qp}})
	case evTCPArmed:
		n.tcpArmed(ev)
	case evAttached:
		if ev.rpc {
			n.rpcAttached(ev)
		} else {
			n.attached(ev)
		}
	case evPeerDown:
		p := n.peer(ev.peer)
		if p == nil {
			break
		}
		p.down = true
		if p.out == outLazy || p.out == outAsked {
			n.decide(ev.peer, nil) // wake the sends waiting for the ring
		}
		if p.rpcOut != rpcDecided {
			n.rpcDecide(ev.peer, nil) // the inner endpoint fails the calls
		}
	case evClose:
		n.closing = true
	}
	return n.acts
}

func (n *negotiator) emit(a action) { n.acts = append(n.acts, a) }

// peer returns r's state, nil for self or a rank outside the job.
func (n *negotiator) peer(r int) *peerNeg {
	if r < 0 || r >= n.cfg.size || r == n.cfg.self {
		return nil
	}
	return &n.peers[r]
}

// localPeers is the number of peers on this host (data ring on first use).
func (n *negotiator) localPeers() int {
	k := 0
	for _, p := range n.peers {
		if p.local {
			k++
		}
	}
	return k
}

// crowd returns how many ranks, this one included, run on this rank's
// kernel on CPUs that overlap its own, and how many CPUs those ranks may
// use between them (the union of their sets; ncpu where this rank's is
// unknown). Ranks in other network namespaces of one machine (containers,
// the two-host tests) count: they talk as hosts do but take the same
// cores. Peers that said no hello (silent, or not talked to) do not.
func (n *negotiator) crowd(ncpu int) (ranks, cpus int) {
	union := append([]uint64(nil), n.cfg.cpus...)
	ranks = 1
	for _, p := range n.peers {
		if !p.kernel || !overlaps(p.cpus, n.cfg.cpus) {
			continue
		}
		ranks++
		for i, w := range p.cpus {
			if i == len(union) {
				union = append(union, 0)
			}
			union[i] |= w
		}
	}
	if len(n.cfg.cpus) == 0 {
		return ranks, ncpu
	}
	for _, w := range union {
		cpus += bits.OnesCount64(w)
	}
	return ranks, cpus
}

// overlaps reports whether CPU sets a and b share a CPU; an unknown (nil)
// set overlaps every set.
func overlaps(a, b []uint64) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	for i := range min(len(a), len(b)) {
		if a[i]&b[i] != 0 {
			return true
		}
	}
	return false
}

// pairRing is the ring capacity this rank asks a local peer for: the
// largest power of two up to RingSize with which one ring per local peer
// fits the budget (each side sizes alike, having the same local peers).
func (n *negotiator) pairRing() int {
	k := max(n.localPeers(), 1)
	size := n.cfg.ringSize
	for size > minRing && size*k > n.cfg.ringBudget {
		size /= 2
	}
	return size
}

func (n *negotiator) recv(from int, m message) {
	p := n.peer(from)
	if p == nil {
		n.emit(actNote{from, true, "negotiation message from an unknown rank; dropped"})
		return
	}
	if !n.cfg.talks[from] {
		n.emit(actNote{from, true, fmt.Sprintf("%v from a rank this one does not talk to; ignored", m.msgType())})
		return
	}
	switch m := m.(type) {
	case helloMsg:
		if p.in != inNone {
			n.emit(actNote{from, false, "duplicate hello; ignored"})
			return
		}
		p.kernel = m.Kernel != "" && m.Kernel == n.cfg.kernel
		p.cpus = m.CPUs
		same := m.Proc.Host == n.cfg.host
		n.offerData(from, same && m.SHM, m.TCP, 0, n.cfg.rdma && m.RDMA && (n.cfg.rdmaOnly || !same))
	case wantMsg:
		if p.in != inLazy {
			n.emit(actNote{from, false, "want without a shm-lazy offer; ignored"})
			return
		}
		n.offerData(from, true, m.TCP, max(m.Size, 1), false)
	case rpcWantMsg:
		if p.rpcIn != inNone {
			n.emit(actNote{from, false, "duplicate rpcwant; ignored"})
			return
		}
		p.rpcInTCP = m.TCP
		if m.Host == n.cfg.host && m.SHM && n.cfg.shm {
			p.rpcIn = inBusy
			n.emit(actMakeRing{from, true, 0})
			return
		}
		n.offerTCPOrQUIC(from, true)
	case offerMsg:
		if m.RPC {
			n.rpcAttach(from, m)
		} else {
			n.attach(from, m)
		}
	case resultMsg:
		if m.RPC {
			n.rpcResult(from, m)
		} else {
			n.result(from, m)
		}
	default: // bye, byeack: the endpoint takes them (procdeath.go)
		n.emit(actNote{from, false, fmt.Sprintf("%v is not negotiation; ignored", m.msgType())})
	}
}

// offerData offers the inbound data direction from peer: a ring on this
// host (shm; size 0: on first use, shm-lazy), else an RDMA end (rdma),
// else TCP where the peer can dial it (tcp), else nothing.
func (n *negotiator) offerData(from int, shm, tcp bool, size int, rdma bool) {
	p := &n.peers[from]
	p.inTCP = tcp
	switch {
	case shm && n.cfg.shm && size == 0:
		p.in = inLazy
		n.emit(actSend{from, offerMsg{Kind: pathSHMLazy, Proc: n.cfg.me}})
	case shm && n.cfg.shm:
		p.in = inBusy
		n.emit(actMakeRing{from, false, size})
	case rdma:
		p.in = inBusy
		n.emit(actListenRDMA{from})
	default:
		n.offerTCPOrQUIC(from, false)
	}
}

// offerTCPOrQUIC offers TCP where both sides can use it, else nothing.
func (n *negotiator) offerTCPOrQUIC(from int, rpc bool) {
	p := &n.peers[from]
	in, tcp, conns := &p.in, p.inTCP, n.cfg.conns
	if rpc {
		in, tcp, conns = &p.rpcIn, p.rpcInTCP, 1
	}
	if tcp && n.cfg.tcp {
		*in = inBusy
		n.emit(actArmTCP{from, rpc, conns})
		return
	}
	*in = inQUIC
	n.emit(actSend{from, n.offer(rpc, pathQUIC)})
}

func (n *negotiator) offer(rpc bool, kind pathKind) offerMsg {
	m := offerMsg{RPC: rpc, Kind: kind}
	if !rpc {
		m.Proc = n.cfg.me
	}
	return m
}

func (n *negotiator) ringMade(ev evRingMade) {
	p := n.peer(ev.peer)
	if p == nil {
		return
	}
	in := &p.in
	if ev.rpc {
		in = &p.rpcIn
	}
	if *in != inBusy {
		return
	}
	if ev.err != nil {
		n.emit(actNote{ev.peer, false, "no shared-memory ring: " + ev.err.Error()})
		n.offerTCPOrQUIC(ev.peer, ev.rpc)
		return
	}
	*in = inRing
	m := n.offer(ev.rpc, pathSHM)
	m.Ring = ev.ring
	n.emit(actSend{ev.peer, m})
}

func (n *negotiator) tcpArmed(ev evTCPArmed) {
	p := n.peer(ev.peer)
	if p == nil {
		return
	}
	in := &p.in
	if ev.rpc {
		in = &p.rpcIn
	}
	if *in != inBusy {
		return
	}
	if ev.err != nil {
		n.emit(actNote{ev.peer, false, "no TCP offer: " + ev.err.Error()})
		*in = inQUIC
		n.emit(actSend{ev.peer, n.offer(ev.rpc, pathQUIC)})
		return
	}
	*in = inTCP
	m := n.offer(ev.rpc, pathTCP)
	m.Dial = ev.dial
	n.emit(actSend{ev.peer, m})
}

// dialable says why a TCP offer cannot be dialed ("" when it can): its
// connection count and nonce, and TLS on both sides or on neither.
func (n *negotiator) dialable(d dialSpec, rpc bool) string {
	if !rpc && (d.Conns < 1 || d.Conns > maxConns) || len(d.Nonce) != 32 {
		return fmt.Sprintf("offer of %d connections, %d-byte nonce", d.Conns, len(d.Nonce))
	}
	if d.TLS == n.cfg.plaintext {
		return fmt.Sprintf("peer offers TLS=%v, this rank wants TLS=%v", d.TLS, !n.cfg.plaintext)
	}
	return ""
}

// attach takes an offer for this rank's data to peer to.
func (n *negotiator) attach(to int, m offerMsg) {
	p := &n.peers[to]
	switch {
	case p.out == outLazy && m.Kind != pathSHMLazy, p.out == outAsked && m.Kind == pathSHMLazy:
		n.emit(actNote{to, false, fmt.Sprintf("offer of %v nobody asked for; ignored", m.Kind)})
		return
	case p.out == outLazy, p.out == outDecided, p.out == outNone:
		n.emit(actNote{to, false, fmt.Sprintf("offer of %v after the path was fixed; ignored", m.Kind)})
		if m.Kind == pathSHM || m.Kind == pathRDMA {
			n.emit(actSend{to, resultMsg{Kind: m.Kind, Err: "too late"}})
		}
		return
	case p.opening:
		n.emit(actNote{to, false, fmt.Sprintf("offer of %v while attaching to another; ignored", m.Kind)})
		return
	}
	switch m.Kind {
	case pathSHMLazy:
		p.out, p.local = outLazy, true
		n.left--
		n.emit(actLater{to})
		if n.left == 0 {
			n.emit(actReady{})
		}
	case pathSHM:
		p.opening = true
		n.emit(actOpenRing{to, false, m.Ring})
	case pathTCP:
		if why := n.dialable(m.Dial, false); why != "" {
			n.emit(actNote{to, true, "TCP channel refused; data stays on QUIC: " + why})
			n.decide(to, nil)
			return
		}
		p.opening = true
		n.emit(actDial{to, false, m.Dial})
	case pathRDMA:
		p.opening = true
		n.emit(actDialRDMA{to, m.QP})
	default:
		n.decide(to, nil)
	}
}

// attached takes the outcome of attaching to a data offer.
func (n *negotiator) attached(ev evAttached) {
	p := n.peer(ev.peer)
	if p == nil {
		return
	}
	p.opening = false
	if p.down || (p.out != outWait && p.out != outAsked) {
		if ev.ch != nil {
			n.emit(actDiscard{ev.peer, ev.ch})
		}
		if ev.err == nil && !p.down && (ev.kind == pathSHM || ev.kind == pathRDMA) {
			n.emit(actSend{ev.peer, resultMsg{Kind: ev.kind, Err: "too late"}})
		}
		return
	}
	if ev.err != nil {
		switch ev.kind {
		case pathSHM, pathRDMA:
			// The peer offers another path.
			n.emit(actNote{ev.peer, ev.kind == pathRDMA, fmt.Sprintf("cannot attach to the %v channel; asking for another path: %v", ev.kind, ev.err)})
			n.emit(actSend{ev.peer, resultMsg{Kind: ev.kind, Err: ev.err.Error(), TCP: n.cfg.tcp}})
		default:
			n.emit(actNote{ev.peer, true, "TCP channel failed; data stays on QUIC: " + ev.err.Error()})
			n.decide(ev.peer, nil)
		}
		return
	}
	n.decide(ev.peer, ev.ch)
	switch ev.kind {
	case pathSHM:
		n.emit(actSend{ev.peer, resultMsg{Kind: pathSHM, OK: true, Probe: n.cfg.dataProbe}})
	case pathRDMA:
		n.emit(actSend{ev.peer, resultMsg{Kind: pathRDMA, OK: true, QP: ev.qp}})
	}
}

// decide fixes the outbound data path to peer (ch nil: the inner endpoint).
func (n *negotiator) decide(peer int, ch any) {
	p := &n.peers[peer]
	p.opening = false
	counted := p.out == outWait
	lazy := p.out == outLazy || p.out == outAsked
	p.out = outDecided
	n.emit(actInstall{peer: peer, ch: ch, lazy: lazy})
	if counted {
		n.left--
		if n.left == 0 {
			n.emit(actReady{})
		}
	}
}

// result takes the sender's outcome of this rank's ring or RDMA offer.
func (n *negotiator) result(from int, m resultMsg) {
	p := &n.peers[from]
	want := inRing
	if m.Kind == pathRDMA {
		want = inRDMA
	}
	if p.in != want {
		n.emit(actNote{from, false, fmt.Sprintf("result for a %v channel not offered; ignored", m.Kind)})
		return
	}
	if m.OK {
		p.in = inFixed
		if m.Kind == pathRDMA {
			n.emit(actAcceptRDMA{from, m.QP})
		} else if n.cfg.testRemote && m.Probe.valid() {
			n.emit(actTestRemote{from, false, m.Probe})
		}
		return
	}
	n.emit(actNote{from, false, fmt.Sprintf("peer could not attach to the %v channel: %s", m.Kind, m.Err)})
	n.emit(actDropInbound{from, false, m.Kind})
	p.inTCP = m.TCP
	n.offerTCPOrQUIC(from, false)
}

// rpcAttach takes an offer for this rank's RPC to peer to.
func (n *negotiator) rpcAttach(to int, m offerMsg) {
	p := &n.peers[to]
	if p.rpcOut != rpcAsked || p.rpcOpening {
		n.emit(actNote{to, false, fmt.Sprintf("rpcoffer of %v nobody waits for; ignored", m.Kind)})
		if m.Kind == pathSHM && !p.rpcOpening {
			n.emit(actSend{to, resultMsg{RPC: true, Kind: pathSHM, Err: "too late"}})
		}
		return
	}
	switch m.Kind {
	case pathSHM:
		p.rpcOpening = true
		n.emit(actOpenRing{to, true, m.Ring})
	case pathTCP:
		d := m.Dial
		d.Conns = 1
		if why := n.dialable(d, true); why != "" {
			n.emit(actNote{to, true, "RPC TCP channel refused; RPC stays on QUIC: " + why})
			n.rpcDecide(to, nil)
			return
		}
		p.rpcOpening = true
		n.emit(actDial{to, true, d})
	default:
		n.rpcDecide(to, nil)
	}
}

// rpcAttached takes the outcome of attaching to an RPC offer.
func (n *negotiator) rpcAttached(ev evAttached) {
	p := n.peer(ev.peer)
	if p == nil {
		return
	}
	p.rpcOpening = false
	if p.rpcOut != rpcAsked {
		if ev.ch != nil {
			n.emit(actDiscard{ev.peer, ev.ch})
		}
		if ev.err == nil && ev.kind == pathSHM && !p.down {
			n.emit(actSend{ev.peer, resultMsg{RPC: true, Kind: pathSHM, Err: "too late"}})
		}
		return
	}
	if ev.err != nil {
		n.emit(actNote{ev.peer, ev.kind == pathTCP, fmt.Sprintf("cannot attach to the RPC %v channel; RPC stays on QUIC: %v", ev.kind, ev.err)})
		n.rpcDecide(ev.peer, nil)
		if ev.kind == pathSHM {
			n.emit(actSend{ev.peer, resultMsg{RPC: true, Kind: pathSHM, Err: ev.err.Error()}})
		}
		return
	}
	n.rpcDecide(ev.peer, ev.ch)
	if ev.kind == pathSHM {
		n.emit(actSend{ev.peer, resultMsg{RPC: true, Kind: pathSHM, OK: true, Probe: n.cfg.rpcProbe}})
	}
}

// rpcDecide fixes the outbound RPC path to peer (ch nil: the inner endpoint).
func (n *negotiator) rpcDecide(peer int, ch any) {
	p := &n.peers[peer]
	p.rpcOut, p.rpcOpening = rpcDecided, false
	n.emit(actInstall{peer: peer, rpc: true, ch: ch})
}

// rpcResult takes the caller's outcome of this rank's RPC ring offer.
func (n *negotiator) rpcResult(from int, m resultMsg) {
	p := &n.peers[from]
	if m.Kind != pathSHM || p.rpcIn != inRing {
		n.emit(actNote{from, false, fmt.Sprintf("rpcresult for a %v channel not offered; ignored", m.Kind)})
		return
	}
	p.rpcIn = inFixed
	n.emit(actUnlinkBell{from})
	switch {
	case !m.OK:
		n.emit(actNote{from, false, "peer did not take the RPC ring: " + m.Err})
		n.emit(actDropInbound{from, true, pathSHM})
	case n.cfg.testRemote && m.Probe.valid():
		n.emit(actTestRemote{from, true, m.Probe})
	}
}

// String forms, for transcripts (negotiate_test.go) and the log.

func (a actSend) String() string { return fmt.Sprintf("send %d %s", a.to, msgString(a.m)) }
func (a actMakeRing) String() string {
	return fmt.Sprintf("make-ring %d%s size=%d", a.peer, rpcTag(a.rpc), a.size)
}
func (a actListenRDMA) String() string { return fmt.Sprintf("listen-rdma %d", a.peer) }
func (a actArmTCP) String() string {
	return fmt.Sprintf("arm-tcp %d%s conns=%d", a.peer, rpcTag(a.rpc), a.conns)
}
func (a actOpenRing) String() string {
	return fmt.Sprintf("open-ring %d%s %s", a.peer, rpcTag(a.rpc), a.ring.Path)
}
func (a actDial) String() string {
	return fmt.Sprintf("dial %d%s %s x%d", a.peer, rpcTag(a.rpc), a.dial.Addr, a.dial.Conns)
}
func (a actDialRDMA) String() string   { return fmt.Sprintf("dial-rdma %d", a.peer) }
func (a actAcceptRDMA) String() string { return fmt.Sprintf("accept-rdma %d", a.peer) }
func (a actTestRemote) String() string {
	return fmt.Sprintf("test-remote %d%s pid=%d", a.peer, rpcTag(a.rpc), a.probe.PID)
}
func (a actDropInbound) String() string {
	return fmt.Sprintf("drop-inbound %d%s %v", a.peer, rpcTag(a.rpc), a.kind)
}
func (a actUnlinkBell) String() string { return fmt.Sprintf("unlink-bell %d", a.peer) }
func (a actDiscard) String() string    { return fmt.Sprintf("discard %d", a.peer) }
func (a actLater) String() string      { return fmt.Sprintf("later %d", a.peer) }
func (a actReady) String() string      { return "ready" }
func (a actTimer) String() string      { return fmt.Sprintf("timer %d", a.peer) }
func (a actNote) String() string       { return fmt.Sprintf("note %d %s", a.peer, a.why) }
func (a actInstall) String() string {
	s := fmt.Sprintf("install %d%s", a.peer, rpcTag(a.rpc))
	switch ch := a.ch.(type) {
	case nil:
		s += " quic"
	case string: // transcripts name channels by strings
		s += " " + ch
	default:
		s += " channel"
	}
	if a.lazy {
		s += " (lazy)"
	}
	return s
}

func rpcTag(rpc bool) string {
	if rpc {
		return " rpc"
	}
	return ""
}

// msgString is a message's short form: its type and what decides it.
func msgString(m message) string {
	switch m := m.(type) {
	case helloMsg:
		return fmt.Sprintf("hello{host=%s shm=%v tcp=%v rdma=%v}", m.Proc.Host, m.SHM, m.TCP, m.RDMA)
	case wantMsg:
		return fmt.Sprintf("want{size=%d tcp=%v}", m.Size, m.TCP)
	case rpcWantMsg:
		return fmt.Sprintf("rpcwant{host=%s shm=%v tcp=%v}", m.Host, m.SHM, m.TCP)
	case offerMsg:
		s := fmt.Sprintf("%v{%v", m.msgType(), m.Kind)
		switch m.Kind {
		case pathSHM:
			s += fmt.Sprintf(" %s size=%d", m.Ring.Path, m.Ring.Size)
		case pathTCP:
			s += fmt.Sprintf(" %s x%d tls=%v", m.Dial.Addr, m.Dial.Conns, m.Dial.TLS)
		}
		return s + "}"
	case resultMsg:
		s := fmt.Sprintf("%v{%v", m.msgType(), m.Kind)
		if m.OK {
			s += " ok"
		} else {
			s += fmt.Sprintf(" err=%q tcp=%v", m.Err, m.TCP)
		}
		if m.Probe.PID != 0 {
			s += " probe"
		}
		return s + "}"
	}
	return m.msgType().String()
}
