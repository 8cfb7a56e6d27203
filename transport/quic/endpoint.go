package quictransport

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
	"github.com/nexar-go/nexar/transport/internal/inbox"
)

// Application error codes on CONNECTION_CLOSE.
const (
	codeClosed    quic.ApplicationErrorCode = 0  // orderly Close
	codeHello     quic.ApplicationErrorCode = 1  // hello refused
	codeProtocol  quic.ApplicationErrorCode = 2  // malformed frame or stream
	codeSendAbort quic.ApplicationErrorCode = 3  // a Send was cancelled mid-frame
	codeDrained   quic.ApplicationErrorCode = 4  // every goodbye of a closing peer was read
	codeStripe    quic.ApplicationErrorCode = 5  // one of the pair's data connections was lost
	codeAbandon   quic.ApplicationErrorCode = 6  // the layer above declared the peer down (Abandon)
	loopbackDepth                           = 16 // messages per loopback lane
	// dialsAtOnce bounds the handshakes one rank starts at once when it
	// forms its mesh. Each costs a few ms of CPU (TLS with ML-KEM and
	// P-256 on both sides); a rank of a 64-rank full mesh that started its
	// 63 at once, with every other rank of one process doing the same on
	// two cores, left thousands of goroutines runnable, and connections
	// already made (and the rendezvous link) then missed their idle
	// timeout waiting to be scheduled (docs/scale.md).
	dialsAtOnce = 4
	inlineMax   = 16 << 10
	readBuffer  = 64 << 10
	// tailProbes datagrams of tailProbeSize bytes follow a striped part on
	// a connection that has lost more than 1 packet in lossyRatio (see
	// writePart). Two, each too large to share a packet with the other, so
	// that the receiver acknowledges at once (it does after two
	// ack-eliciting packets) rather than after its 25 ms ack delay.
	tailProbes    = 2
	tailProbeSize = 800
	lossyRatio    = 200
)

// endpoint is one rank's side of the mesh. All methods are safe for
// concurrent use. Handler and DownHandler run on goroutines that Close waits
// for, so they must not call Close themselves.
type endpoint struct {
	node  *Node
	self  int
	peers []Peer
	h     transport.Handler
	down  transport.DownHandler

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	loop   [transport.NumLanes]*inbox.Inbox
	ready  chan struct{} // closed when every connection is registered

	mu      sync.Mutex
	conns   []*peerConn
	pending int       // connections still missing
	od      *onDemand // connections on demand (ondemand.go); nil: the mesh of Connect
	closing atomic.Bool
	once    sync.Once
}

type peerConn struct {
	rank   int
	conn   *quic.Conn
	lanes  [transport.NumLanes]sendLane
	mu     sync.Mutex
	inLane [transport.NumLanes]bool // inbound lane stream seen
	bye    int                      // inbound lanes that ended with a goodbye
	left   bool                     // the peer closed gracefully and was drained
	downed bool
	// stripes are the pair's further LaneData connections (see the package
	// comment), fixed in number when the first connection registers.
	stripes []stripe
	od      *odConn // on demand (ondemand.go); nil in the mesh of Connect
}

// stripe is one further data connection of a pair. out is guarded by the
// data lane's sendLane.sem; in is taken by the data lane's reader.
type stripe struct {
	conn *quic.Conn
	out  *quic.SendStream
	in   chan *quic.ReceiveStream // the peer's stream, once
	rs   *quic.ReceiveStream      // owned by the data lane's reader
}

// sendLane serialises writes to one (peer, lane) stream; sem is a mutex that
// a waiter can abandon when its ctx ends.
type sendLane struct {
	sem chan struct{}
	s   *quic.SendStream
	buf []byte
}

func newEndpoint(n *Node, self int, peers []Peer, h transport.Handler, down transport.DownHandler) *endpoint {
	e := &endpoint{node: n, self: self, peers: peers, h: h, down: down,
		conns: make([]*peerConn, len(peers)), ready: make(chan struct{})}
	if n.opt.OnDemand > 0 {
		e.od = newOnDemand(n.opt.OnDemand)
	}
	for r := range peers {
		if e.linked(r) {
			e.pending++
		}
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	for l := range e.loop {
		e.loop[l] = inbox.Start(&e.wg, loopbackDepth, e.ctx.Done(), self, h)
	}
	if e.pending == 0 {
		close(e.ready)
	}
	return e
}

// linked reports whether this rank connects to rank r (Options.Neighbors).
func (e *endpoint) linked(r int) bool {
	return r != e.self && e.od == nil && (e.node.opt.Neighbors == nil || e.node.opt.Neighbors(e.self, r))
}

func (e *endpoint) Rank() int { return e.self }
func (e *endpoint) Size() int { return len(e.peers) }

func (e *endpoint) connect(ctx context.Context) error {
	if e.od != nil {
		e.wg.Go(e.acceptLoop) // and dial on demand
		return nil
	}
	errc := make(chan error, len(e.peers))
	if e.self > 0 {
		e.wg.Go(e.acceptLoop)
	}
	sem := make(chan struct{}, dialsAtOnce)
	for r := e.self + 1; r < len(e.peers); r++ {
		if !e.linked(r) {
			continue
		}
		e.wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
			err := e.dial(ctx, r)
			<-sem
			if err != nil {
				errc <- err
			}
		})
	}
	select {
	case <-e.ready:
		// Every lower rank is in: refuse any further handshake.
		e.node.ln.Close()
		return nil
	case err := <-errc:
		return err
	case <-ctx.Done():
		e.mu.Lock()
		missing := []int{}
		for r, c := range e.conns {
			if c == nil && e.linked(r) {
				missing = append(missing, r)
			}
		}
		e.mu.Unlock()
		return fmt.Errorf("quic: connect: ranks %v not connected: %w", missing, ctx.Err())
	}
}

// dial connects to the higher rank r, retrying until ctx ends: r may not
// have called Connect yet and then refuses our certificate.
func (e *endpoint) dial(ctx context.Context, r int) error {
	p := e.peers[r]
	addr, tlsConf, err := e.target(r)
	if err != nil {
		return err
	}
	stripes := e.node.opt.stripesTo(addr, len(e.peers))
	dialStripe := func(k int) error {
		backoff := 20 * time.Millisecond
		for {
			err := e.dialOnce(ctx, r, addr, tlsConf, k, stripes)
			if err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("quic: connect to rank %d at %s (connection %d of %d): %w (last error: %v)", r, p.Addr, k+1, stripes, ctx.Err(), err)
			case <-e.ctx.Done():
				return transport.ErrClosed
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	}
	// The first connection fixes the number of stripes; the rest may then
	// come in any order.
	if err := dialStripe(0); err != nil {
		return err
	}
	errs := make([]error, stripes)
	var wg sync.WaitGroup
	for k := 1; k < stripes; k++ {
		wg.Go(func() { errs[k] = dialStripe(k) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// target is where rank r listens, and the TLS configuration that pins its
// certificate.
func (e *endpoint) target(r int) (*net.UDPAddr, *tls.Config, error) {
	p := e.peers[r]
	addr, err := net.ResolveUDPAddr("udp", p.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("quic: rank %d address %q: %w", r, p.Addr, err)
	}
	tlsConf := ClientTLSConfig(e.node.id, func(fp [32]byte) error {
		if !Equal(fp, p.Fingerprint) {
			return fmt.Errorf("quic: rank %d at %s presented certificate %x, not the pinned one", r, p.Addr, fp[:8])
		}
		return nil
	})
	return addr, tlsConf, nil
}

func (e *endpoint) dialOnce(ctx context.Context, r int, addr *net.UDPAddr, tlsConf *tls.Config, stripe, stripes int) error {
	hctx, cancel := context.WithTimeout(ctx, e.node.opt.HandshakeTimeout)
	defer cancel()
	conn, err := e.node.tr.Dial(hctx, addr, tlsConf, e.node.qconf)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		conn.CloseWithError(codeHello, err.Error())
		return err
	}
	s, err := conn.OpenStreamSync(hctx)
	if err != nil {
		return fail(err)
	}
	if dl, ok := hctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	if _, err := s.Write(hello{rank: uint32(e.self), size: uint32(len(e.peers)), stripe: uint8(stripe), stripes: uint8(stripes)}.marshal()); err != nil {
		return fail(err)
	}
	var b [helloSize]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		return fail(fmt.Errorf("hello reply: %w", err))
	}
	rep, err := parseHello(b[:])
	if err != nil {
		return fail(err)
	}
	if rep.status != 0 || rep.rank != uint32(r) || rep.size != uint32(len(e.peers)) {
		return fail(fmt.Errorf("hello reply: status %d rank %d size %d, want 0, %d, %d", rep.status, rep.rank, rep.size, r, len(e.peers)))
	}
	s.Close()
	if err := e.register(r, conn, stripe, stripes, e.self); err != nil {
		return fail(err)
	}
	return nil
}

func (e *endpoint) acceptLoop() {
	for {
		conn, err := e.node.ln.Accept(e.ctx)
		if err != nil {
			return // listener closed: mesh complete or endpoint closing
		}
		e.wg.Go(func() { e.accept(conn) })
	}
}

// accept reads the dialer's hello and checks that the rank it names is the
// one whose certificate the TLS handshake pinned.
func (e *endpoint) accept(conn *quic.Conn) {
	ctx, cancel := context.WithTimeout(e.ctx, e.node.opt.HandshakeTimeout)
	defer cancel()
	refuse := func(err error) {
		conn.CloseWithError(codeHello, "hello refused: "+err.Error())
	}
	certs := conn.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		refuse(errNoCert)
		return
	}
	fp := sha256.Sum256(certs[0].Raw)
	s, err := conn.AcceptStream(ctx)
	if err != nil {
		refuse(err)
		return
	}
	dl, _ := ctx.Deadline()
	s.SetDeadline(dl)
	var b [helloSize]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		refuse(err)
		return
	}
	hi, err := parseHello(b[:])
	if err != nil {
		refuse(err)
		return
	}
	r := int(hi.rank)
	dials := hi.rank < uint32(e.self) && e.linked(r) // the lower rank of a linked pair
	if e.od != nil {
		dials = hi.rank != uint32(e.self) && hi.rank < uint32(len(e.peers)) // either rank
	}
	if !dials || hi.size != uint32(len(e.peers)) || !Equal(fp, e.peers[r].Fingerprint) {
		refuse(fmt.Errorf("hello names rank %d of %d, which does not match the certificate", hi.rank, hi.size))
		return
	}
	if err := e.register(r, conn, int(hi.stripe), int(hi.stripes), r); err != nil {
		refuse(err)
		return
	}
	if _, err := s.Write(hello{rank: uint32(e.self), size: uint32(len(e.peers)), stripe: hi.stripe, stripes: hi.stripes}.marshal()); err != nil {
		conn.CloseWithError(codeHello, "hello reply: "+err.Error())
		return
	}
	s.Close()
}

// register installs a verified connection, number k of the pair's
// stripes, that dialer dialled, and starts its goroutines. The first
// (stripe 0) carries every lane and fixes the number of stripes; the dialer
// opens the others only after it. It fails if the connection is a
// duplicate, out of order or the endpoint is closing.
func (e *endpoint) register(r int, conn *quic.Conn, k, stripes, dialer int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing.Load() {
		return transport.ErrClosed
	}
	if e.od != nil {
		if k != 0 || stripes != 1 {
			return fmt.Errorf("rank %d asks for %d data connections; on demand, a pair has one", r, stripes)
		}
		return e.odRegisterLocked(r, conn, dialer)
	}
	pc := e.conns[r]
	if k == 0 {
		if pc != nil {
			return fmt.Errorf("rank %d already connected", r)
		}
		if stripes < 1 || stripes > maxStripes {
			return fmt.Errorf("rank %d asks for %d data connections, want 1 to %d", r, stripes, maxStripes)
		}
		e.addConnLocked(r, conn, stripes, nil)
		e.pending += stripes - 1
	} else {
		if pc == nil || stripes != len(pc.stripes)+1 || k >= stripes || pc.stripes[k-1].conn != nil {
			return fmt.Errorf("rank %d: unexpected data connection %d of %d", r, k, stripes)
		}
		st := &pc.stripes[k-1]
		st.conn = conn
		e.wg.Go(func() { e.monitorStripe(pc, k, st) })
		e.wg.Go(func() { e.dropDatagrams(conn) })
	}
	e.pending--
	if e.pending == 0 {
		close(e.ready)
	}
	return nil
}

// addConnLocked makes the pair's first connection with r (od: its
// on-demand state, nil in the mesh of Connect) the current one and starts
// its goroutines.
func (e *endpoint) addConnLocked(r int, conn *quic.Conn, stripes int, od *odConn) *peerConn {
	pc := &peerConn{rank: r, conn: conn, stripes: make([]stripe, stripes-1), od: od}
	for l := range pc.lanes {
		pc.lanes[l].sem = make(chan struct{}, 1)
	}
	for i := range pc.stripes {
		pc.stripes[i].in = make(chan *quic.ReceiveStream, 1)
	}
	e.conns[r] = pc
	e.wg.Go(func() { e.monitor(pc) })
	e.wg.Go(func() { e.acceptStreams(pc) })
	e.wg.Go(func() { e.dropDatagrams(conn) })
	return pc
}

// dropDatagrams reads and discards the peer's tail probes on conn until
// it or the endpoint ends, so that they do not sit in quic-go's queue.
func (e *endpoint) dropDatagrams(conn *quic.Conn) {
	for {
		if _, err := conn.ReceiveDatagram(e.ctx); err != nil {
			return
		}
	}
}

// monitorStripe takes the peer's stream on stripe k and ends the pair with
// its first connection if the stripe ends first: no Send or frame can
// complete without it.
func (e *endpoint) monitorStripe(pc *peerConn, k int, st *stripe) {
	ctx, cancel := context.WithCancel(e.ctx)
	defer context.AfterFunc(pc.conn.Context(), cancel)()
	s, err := st.conn.AcceptUniStream(ctx)
	if err == nil {
		st.in <- s
		// A stripe carries one stream per direction; a second one is a
		// protocol violation.
		if _, err = st.conn.AcceptUniStream(ctx); err == nil {
			e.protocolError(pc, fmt.Errorf("second stream on data connection %d", k))
		}
	}
	select {
	case <-st.conn.Context().Done():
	case <-pc.conn.Context().Done():
	case <-e.ctx.Done():
	}
	if e.closing.Load() || pc.conn.Context().Err() != nil {
		st.conn.CloseWithError(codeClosed, "the pair's first connection ended")
		return
	}
	pc.mu.Lock()
	left := pc.left
	pc.mu.Unlock()
	if !left {
		pc.conn.CloseWithError(codeStripe, fmt.Sprintf("data connection %d to rank %d lost: %v", k, pc.rank, context.Cause(st.conn.Context())))
	}
}

// monitor reports the connection's end to the DownHandler, once.
func (e *endpoint) monitor(pc *peerConn) {
	select {
	case <-pc.conn.Context().Done():
	case <-e.ctx.Done():
		return
	}
	if e.od != nil && e.odEnded(pc) {
		return // closed to make room, or after a crossed dial: nothing lost
	}
	if e.closing.Load() {
		return
	}
	cause := context.Cause(pc.conn.Context())
	var ae *quic.ApplicationError
	if errors.As(cause, &ae) && ae.Remote && ae.ErrorCode == codeClosed {
		cause = fmt.Errorf("quic: rank %d closed its endpoint before it was drained", pc.rank)
	} else if errors.As(cause, &ae) && ae.Remote && ae.ErrorCode == codeAbandon {
		cause = fmt.Errorf("%s: %w", ae.ErrorMessage, transport.ErrDeclaredDown)
	} else {
		cause = fmt.Errorf("quic: connection to rank %d: %w", pc.rank, cause)
	}
	pc.mu.Lock()
	already := pc.downed
	pc.downed = true
	pc.mu.Unlock()
	if e.od != nil {
		e.mu.Lock()
		if e.od.down[pc.rank] == nil {
			e.od.down[pc.rank] = cause // lost: dialled no more
		}
		e.mu.Unlock()
	}
	if !already && e.down != nil {
		e.down(pc.rank, &transport.PeerDownError{Peer: pc.rank, Cause: cause})
	}
}

func (e *endpoint) acceptStreams(pc *peerConn) {
	for {
		s, err := pc.conn.AcceptUniStream(e.ctx)
		if err != nil {
			return
		}
		e.wg.Go(func() { e.readStream(pc, s) })
	}
}

// readStream delivers the frames of one inbound lane stream in order. Any
// protocol violation closes the connection with an error naming the peer.
func (e *endpoint) readStream(pc *peerConn, s *quic.ReceiveStream) {
	br := bufio.NewReaderSize(s, readBuffer)
	pre := new([frame.PrefixSize]byte)
	lane := transport.NumLanes
	for {
		l, h, p, err := e.nextFrame(pc, br, pre)
		bye := errors.Is(err, frame.ErrGoodbye)
		if err != nil && !bye {
			if errors.Is(err, frame.ErrMalformed) || errors.Is(err, io.ErrUnexpectedEOF) {
				e.protocolError(pc, err)
			} else if err == io.EOF {
				e.protocolError(pc, errors.New("lane stream ended without a goodbye"))
			}
			return
		}
		if lane == transport.NumLanes {
			pc.mu.Lock()
			dup := pc.inLane[l]
			pc.inLane[l] = true
			pc.mu.Unlock()
			if dup {
				e.protocolError(pc, fmt.Errorf("second stream for lane %v", l))
				return
			}
			lane = l
		} else if l != lane {
			e.protocolError(pc, fmt.Errorf("frame for lane %v on the %v stream", l, lane))
			return
		}
		if bye {
			// Nothing may follow a goodbye; what does is never read.
			e.goodbye(pc)
			return
		}
		if pc.od != nil {
			if h[0] == ownerOnDemand {
				e.odControl(pc, h)
				continue
			}
			e.odTouch(pc)
		}
		if e.h != nil {
			e.h(pc.rank, l, h, p)
		}
	}
}

// nextFrame reads one frame from an inbound lane stream, as frame.Reader
// does, and the parts of a striped LaneData payload from the pair's further
// data connections.
func (e *endpoint) nextFrame(pc *peerConn, br *bufio.Reader, pre *[frame.PrefixSize]byte) (transport.Lane, *transport.Header, []byte, error) {
	if _, err := io.ReadFull(br, pre[:]); err != nil {
		return 0, nil, nil, err
	}
	lane, h, n, err := frame.ParsePrefix(pre, transport.MaxPayload)
	if err != nil {
		return lane, nil, nil, err
	}
	p := make([]byte, n)
	stripes := len(pc.stripes) + 1
	if lane != transport.LaneData || stripes == 1 || n < stripeMin {
		if _, err := io.ReadFull(br, p); err != nil {
			return 0, nil, nil, unexpectedEOF(err)
		}
		return lane, h, p, nil
	}
	c, err := br.ReadByte()
	if err != nil {
		return 0, nil, nil, unexpectedEOF(err)
	}
	parts := int(c)
	if parts < 1 || parts > stripes || n/parts < lossyPartMin {
		return 0, nil, nil, fmt.Errorf("%w: %d-byte payload in %d parts over %d connections", frame.ErrMalformed, n, parts, stripes)
	}
	_, b := stripeBounds(n, parts, 0)
	if _, err := io.ReadFull(br, p[:b]); err != nil {
		return 0, nil, nil, unexpectedEOF(err)
	}
	for k := 1; k < parts; k++ {
		st := &pc.stripes[k-1]
		if st.rs == nil {
			select {
			case st.rs = <-st.in:
			case <-pc.conn.Context().Done():
				return 0, nil, nil, context.Cause(pc.conn.Context())
			case <-e.ctx.Done():
				return 0, nil, nil, transport.ErrClosed
			}
		}
		a, b := stripeBounds(n, parts, k)
		if _, err := io.ReadFull(st.rs, p[a:b]); err != nil {
			return 0, nil, nil, fmt.Errorf("data connection %d: %w", k, unexpectedEOF(err))
		}
	}
	return lane, h, p, nil
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// goodbye counts one inbound lane that ended with a goodbye. With the last
// one every frame the peer sent has been through the Handler: report the
// graceful departure, then acknowledge it by closing the connection.
func (e *endpoint) goodbye(pc *peerConn) {
	pc.mu.Lock()
	pc.bye++
	drained := pc.bye == int(transport.NumLanes)
	already := pc.downed
	if drained {
		pc.left, pc.downed = true, true
	}
	pc.mu.Unlock()
	if !drained {
		return
	}
	if pc.od != nil {
		pc.mu.Lock()
		departing := pc.od.departing
		pc.mu.Unlock()
		if !departing {
			pc.mu.Lock()
			pc.left, pc.downed = false, already // not a departure: the pair may talk again
			pc.mu.Unlock()
			e.odDrained(pc)
			return
		}
		e.mu.Lock()
		e.od.down[pc.rank] = fmt.Errorf("quic: rank %d closed its endpoint: %w", pc.rank, transport.ErrPeerClosed)
		e.mu.Unlock()
	}
	if !already && !e.closing.Load() && e.down != nil {
		e.down(pc.rank, &transport.PeerDownError{Peer: pc.rank,
			Cause: fmt.Errorf("quic: rank %d closed its endpoint: %w", pc.rank, transport.ErrPeerClosed)})
	}
	pc.conn.CloseWithError(codeDrained, "drained")
}

func (e *endpoint) protocolError(pc *peerConn, err error) {
	if e.closing.Load() {
		return
	}
	pc.conn.CloseWithError(codeProtocol, fmt.Sprintf("bad frame from rank %d: %v", pc.rank, err))
}

func (e *endpoint) Send(ctx context.Context, peer int, lane transport.Lane, h *transport.Header, payload []byte) error {
	if peer < 0 || peer >= len(e.peers) {
		return fmt.Errorf("quic: send to rank %d: out of range [0,%d)", peer, len(e.peers))
	}
	if lane >= transport.NumLanes {
		return fmt.Errorf("quic: send on lane %d: unknown lane", lane)
	}
	if len(payload) > transport.MaxPayload {
		return fmt.Errorf("quic: payload of %d bytes exceeds %d", len(payload), transport.MaxPayload)
	}
	if e.closing.Load() {
		return transport.ErrClosed
	}
	if peer == e.self {
		return e.loop[lane].Put(ctx, lane, h, payload, nil, func() error { return transport.ErrClosed })
	}
	var pc *peerConn
	if e.od != nil {
		var err error
		if pc, err = e.odConn(ctx, peer); err != nil {
			return err
		}
	} else {
		e.mu.Lock()
		pc = e.conns[peer]
		e.mu.Unlock()
	}
	if pc == nil {
		return &transport.PeerDownError{Peer: peer, Cause: errors.New("quic: not connected")}
	}
	if err := pc.conn.Context().Err(); err != nil {
		return e.sendErr(pc, ctx, err)
	}
	sl := &pc.lanes[lane]
	select {
	case sl.sem <- struct{}{}:
	case <-odClosing(pc):
		return e.Send(ctx, peer, lane, h, payload) // on the pair's next connection
	case <-ctx.Done():
		return fmt.Errorf("quic: send to rank %d on %v: %w", peer, lane, ctx.Err())
	case <-pc.conn.Context().Done():
		return e.sendErr(pc, ctx, context.Cause(pc.conn.Context()))
	}
	defer func() { <-sl.sem }()
	if sl.s == nil {
		s, err := pc.conn.OpenUniStreamSync(ctx)
		if err != nil {
			return e.sendErr(pc, ctx, err)
		}
		sl.s = s
	}
	striped := lane == transport.LaneData && len(pc.stripes) > 0 && len(payload) >= stripeMin
	parts := 1 // connections the payload is split across
	if striped {
		parts = partsOf(len(payload), len(pc.stripes)+1, lossy(pc.conn))
		for k := range parts - 1 {
			st := &pc.stripes[k]
			if st.out == nil {
				s, err := st.conn.OpenUniStreamSync(ctx)
				if err != nil {
					return e.sendErr(pc, ctx, err)
				}
				st.out = s
			}
		}
	}
	// A cancelled ctx moves the write deadline to the past.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		sl.s.SetWriteDeadline(time.Unix(1, 0))
		for k := range parts - 1 {
			pc.stripes[k].out.SetWriteDeadline(time.Unix(1, 0))
		}
		close(fired)
	})
	sl.buf = frame.AppendPrefix(sl.buf[:0], lane, h, len(payload))
	if striped {
		sl.buf = append(sl.buf, byte(parts))
	}
	var n int
	var err error
	if striped {
		n, err = e.writeStriped(pc, sl, payload, parts)
	} else if len(payload) <= inlineMax {
		sl.buf = append(sl.buf, payload...)
		n, err = sl.s.Write(sl.buf)
	} else if n, err = sl.s.Write(sl.buf); err == nil {
		var m int
		m, err = sl.s.Write(payload)
		n += m
	}
	if !stop() {
		<-fired
		sl.s.SetWriteDeadline(time.Time{})
		for k := range parts - 1 {
			pc.stripes[k].out.SetWriteDeadline(time.Time{})
		}
	}
	if cap(sl.buf) > 4*inlineMax {
		sl.buf = nil
	}
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && pc.conn.Context().Err() == nil {
		if n > 0 {
			// The stream now holds part of a frame: only a new connection
			// could resynchronise, so this peer is lost.
			pc.conn.CloseWithError(codeSendAbort, fmt.Sprintf("send to rank %d on %v cancelled mid-frame", peer, lane))
		}
		return fmt.Errorf("quic: send to rank %d on %v: %w", peer, lane, ctx.Err())
	}
	return e.sendErr(pc, ctx, err)
}

// partsOf says across how many of a pair's stripes connections an n-byte
// LaneData payload of at least stripeMin bytes is split: all of them, or
// fewer so that no part is under partMin, or lossyPartMin if the pair's
// link is lossy. The frame tells the receiver.
func partsOf(n, stripes int, lossy bool) int {
	least := partMin
	if lossy {
		least = lossyPartMin
	}
	return max(1, min(stripes, n/least))
}

// lossy says whether conn has lost more than 1 packet in lossyRatio so far.
func lossy(conn *quic.Conn) bool {
	s := conn.ConnectionStats()
	return s.PacketsLost*lossyRatio > s.PacketsSent
}

// stripeBounds returns where part k of an n-byte payload split in parts
// starts and ends.
func stripeBounds(n, parts, k int) (int, int) {
	part := n / parts
	if k == parts-1 {
		return k * part, n
	}
	return k * part, (k + 1) * part
}

// writeStriped writes the prefix in sl.buf and part 0 of payload on the data
// lane stream and part k on stripe k (k < parts), all at once: each
// connection sends within its own congestion window. It returns the bytes
// written and the first error.
func (e *endpoint) writeStriped(pc *peerConn, sl *sendLane, payload []byte, parts int) (int, error) {
	var n atomic.Int64
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for k := 1; k < parts; k++ {
		wg.Go(func() {
			a, b := stripeBounds(len(payload), parts, k)
			st := &pc.stripes[k-1]
			m, err := writePart(st.conn, st.out, payload[a:b])
			n.Add(int64(m))
			errs[k] = err
		})
	}
	_, b := stripeBounds(len(payload), parts, 0)
	m, err := sl.s.Write(sl.buf)
	if err == nil {
		var m2 int
		m2, err = writePart(pc.conn, sl.s, payload[:b])
		m += m2
	}
	n.Add(int64(m))
	errs[0] = err
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return int(n.Load()), err
		}
	}
	return int(n.Load()), nil
}

// writePart writes one part of a striped payload on s, a stream of conn.
// If conn has lost more than 1 packet in lossyRatio so far, it follows the
// part with tailProbes datagrams. quic-go declares a packet lost only once
// a later one is acknowledged, and repeats a lost acknowledgement only
// when new packets arrive; a part's last packets have nothing after them,
// so without probes the loss of one of them, or of the acknowledgement of
// the last ones, waits for the probe timeout (srtt + 4 rttvar + the peer's
// 26 ms max_ack_delay, doubled on each repetition), and the unacknowledged
// packets hold the congestion window against the next message meanwhile
// (at 5% loss, about half the parts that waited for a probe timeout). The
// probes carry no data and the peer drops them; SendDatagram waits only
// while quic-go's queue of 32 datagrams is full, which ends at the latest
// with the connection. A plain Write returns with the part's last bytes
// still buffered, and quic-go packs datagrams ahead of stream data, so the
// probes would ride with the tail instead of after it: with a write
// limiter (one that limits nothing) Write returns only once every byte is
// in a packet. Probes are best effort: an error (connection closed,
// datagram too large for the path) only ends them. On a clean link none
// is sent and the write is a plain one.
func writePart(conn *quic.Conn, s *quic.SendStream, part []byte) (int, error) {
	if !lossy(conn) {
		return s.Write(part)
	}
	n, err := s.WriteWithLimit(part, noLimit)
	if err != nil {
		return n, err
	}
	var probe [tailProbeSize]byte
	for range tailProbes {
		if conn.SendDatagram(probe[:]) != nil {
			break
		}
	}
	return n, nil
}

// noLimit is the write limiter of writePart: it allows every byte.
func noLimit(n int) int { return n }

func (e *endpoint) sendErr(pc *peerConn, ctx context.Context, err error) error {
	if e.closing.Load() {
		return transport.ErrClosed
	}
	if ctx.Err() != nil && pc.conn.Context().Err() == nil {
		return fmt.Errorf("quic: send to rank %d: %w", pc.rank, ctx.Err())
	}
	pc.mu.Lock()
	left := pc.left
	pc.mu.Unlock()
	if left {
		return &transport.PeerDownError{Peer: pc.rank, Cause: fmt.Errorf("quic: rank %d closed its endpoint: %w", pc.rank, transport.ErrPeerClosed)}
	}
	if c := context.Cause(pc.conn.Context()); c != nil {
		err = c
	}
	return &transport.PeerDownError{Peer: pc.rank, Cause: fmt.Errorf("quic: %w", err)}
}

// Close says goodbye to every live peer and waits, up to
// Options.CloseTimeout, until each has read everything sent to it; then it
// closes every connection, the socket and the Node, and waits for every
// goroutine (handlers included) to return. Inbound messages are still
// delivered while it drains. It is idempotent.
// Abandon closes the connection to peer, which the layer above declared
// down (cause says why): a send or a receive blocked on it, which a dead
// peer would leave blocked until the idle timeout, ends at once, and the
// peer, should it come back, is told why. The DownHandler is told as for
// any lost connection.
func (e *endpoint) Abandon(peer int, cause error) {
	if peer < 0 || peer >= len(e.peers) || peer == e.self {
		return
	}
	e.mu.Lock()
	pc := e.conns[peer]
	if e.od != nil && e.od.down[peer] == nil {
		e.od.down[peer] = fmt.Errorf("quic: rank %d declared rank %d down: %w", e.self, peer, cause)
	}
	e.mu.Unlock()
	if pc != nil {
		pc.conn.CloseWithError(codeAbandon, fmt.Sprintf("rank %d declared rank %d down: %v", e.self, peer, cause))
	}
}

func (e *endpoint) Close() error {
	e.once.Do(func() {
		e.mu.Lock()
		e.closing.Store(true)
		conns := append([]*peerConn(nil), e.conns...)
		if e.od != nil { // every connection still open, current or closing
			conns = conns[:0]
			for pc := range e.od.all {
				conns = append(conns, pc)
			}
		}
		e.mu.Unlock()
		deadline := time.Now().Add(e.node.opt.CloseTimeout)
		var wg sync.WaitGroup
		for _, pc := range conns {
			if pc != nil {
				wg.Go(func() { e.sayGoodbye(pc, deadline) })
			}
		}
		wg.Wait()
		e.cancel()
		for _, pc := range conns {
			if pc != nil {
				pc.conn.CloseWithError(codeClosed, "closed")
			}
		}
		e.node.closeSocket()
		e.wg.Wait()
	})
	return nil
}

// sayGoodbye ends every lane to pc with a goodbye frame and a FIN, then
// waits until pc acknowledges by closing the connection, or until deadline.
// On demand, a connection whose goodbyes went already (being closed) is
// only waited for.
func (e *endpoint) sayGoodbye(pc *peerConn, deadline time.Time) {
	ctx, cancel := context.WithDeadline(pc.conn.Context(), deadline)
	defer cancel()
	if pc.od == nil || !e.goodbyesWritten(pc) {
		e.writeGoodbyes(pc, deadline, pc.od != nil)
	}
	<-ctx.Done()
}

// goodbyesWritten reports whether this side began ending pc's lanes.
func (e *endpoint) goodbyesWritten(pc *peerConn) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.od.wroteBye
}

// writeGoodbyes ends every lane to pc with a goodbye frame and a FIN (by
// deadline when set), after a departure frame when depart. It keeps each
// lane's semaphore, so no Send can follow the goodbye.
func (e *endpoint) writeGoodbyes(pc *peerConn, deadline time.Time, depart bool) {
	if pc.od != nil {
		pc.mu.Lock()
		was := pc.od.wroteBye
		pc.od.wroteBye = true
		pc.mu.Unlock()
		if was {
			return
		}
	}
	ctx := pc.conn.Context()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	var buf []byte
	for l := range pc.lanes {
		sl := &pc.lanes[l]
		select {
		case sl.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if sl.s == nil {
			s, err := pc.conn.OpenUniStream()
			if err != nil {
				return
			}
			sl.s = s
		}
		sl.s.SetWriteDeadline(deadline)
		buf = buf[:0]
		if depart && transport.Lane(l) == transport.LaneControl {
			var h transport.Header
			h[0], h[1] = ownerOnDemand, odDepart
			buf = frame.AppendPrefix(buf, transport.LaneControl, &h, 0)
		}
		buf = frame.AppendGoodbye(buf, transport.Lane(l))
		if _, err := sl.s.Write(buf); err != nil {
			return
		}
		sl.s.Close()
	}
}
