package quictransport

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
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
	// tailProbes datagrams of tailProbeSize bytes follow the frame of a
	// striped message on a pair that has lost more than 1 packet in
	// lossyRatio (see writeMarker). Two, each too large to share a packet
	// with the other, so that the receiver acknowledges at once (it does
	// after two ack-eliciting packets) rather than after its 25 ms ack
	// delay.
	tailProbes    = 2
	tailProbeSize = 800
	lossyRatio    = 200
)

// Stream error codes on a part's stream (see parts.go).
const (
	codePartDone   quic.StreamErrorCode = 1 // the receiver completed the message without this part
	codePartCancel quic.StreamErrorCode = 2 // the sender was told so, or its Send ended
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
	codecs codecs

	mu      sync.Mutex
	conns   []*peerConn
	pending int       // connections still missing
	od      *onDemand // connections on demand (ondemand.go); nil: the mesh of Connect
	closing atomic.Bool
	once    sync.Once

	// picked, when set (tests, before the first Send), is called by Send
	// once it has chosen the connection it sends on ("chosen") and once it
	// has checked that the connection is up ("checked").
	picked func(pc *peerConn, stage string)
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
	asm     *assembler // the striped messages from the peer
	// sentSeq is the seq of the last striped message sent; doneSeq the
	// highest the peer said it completed (a done datagram), doneIn
	// signals a rise. doneOut is the highest this side completed of the
	// peer's coded messages, doneOutIn signals a rise to sendDone.
	sentSeq, doneSeq, doneOut atomic.Uint64
	doneIn, doneOutIn         chan struct{}
	od                        *odConn // on demand (ondemand.go); nil in the mesh of Connect
}

// stripe is one further data connection of a pair. out, the stream that
// carries its plain parts, is guarded by the data lane's sendLane.sem.
type stripe struct {
	conn *quic.Conn
	out  *quic.SendStream
}

// sendLane serialises writes to one (peer, lane) stream; sem is a mutex that
// a waiter can abandon when its ctx ends.
type sendLane struct {
	sem chan struct{}
	s   *quic.SendStream
	buf []byte
	seq uint64 // data lane: seq of the last striped message
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

// replyGrace is how long a dialer that missed its handshake deadline still
// reads the hello reply (dialOnce).
const replyGrace = time.Second

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
	if d := e.node.opt.slowRead; d > 0 && e.node.slowed.CompareAndSwap(false, true) {
		time.Sleep(d)
	}
	if _, err := io.ReadFull(s, b[:]); err != nil {
		// Past the deadline the reply may be here all the same: this
		// process, not the peer, was late (starved). The acceptor has
		// registered the connection once its reply went, so read what
		// came within a short grace rather than abandon a pair that is
		// made on the other side.
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return fail(fmt.Errorf("hello reply: %w", err))
		}
		s.SetDeadline(time.Now().Add(replyGrace))
		if _, err := io.ReadFull(s, b[:]); err != nil {
			return fail(fmt.Errorf("hello reply: %w", err))
		}
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
	reply := hello{rank: uint32(e.self), size: uint32(len(e.peers)), stripe: hi.stripe, stripes: hi.stripes}.marshal()
	if d := e.node.opt.slowReply; d > 0 && e.node.slowed.CompareAndSwap(false, true) {
		time.Sleep(d)
	}
	if e.od == nil {
		// In the mesh the reply goes first and the connection is
		// registered only once it went: a reply that misses its deadline
		// (this process starved past HandshakeTimeout while 64 ranks
		// form on 2 cores) then leaves a refused handshake, which the
		// dialer retries until its connect timeout, not a registered
		// connection whose close would read as the dialer's loss.
		if err := e.registrable(r, int(hi.stripe), int(hi.stripes)); err != nil {
			refuse(err)
			return
		}
		if _, err := s.Write(reply); err != nil {
			conn.CloseWithError(codeHello, "hello reply: "+err.Error())
			return
		}
		if err := e.register(r, conn, int(hi.stripe), int(hi.stripes), r); err != nil {
			refuse(err)
			return
		}
		s.Close()
		return
	}
	if err := e.register(r, conn, int(hi.stripe), int(hi.stripes), r); err != nil {
		refuse(err)
		return
	}
	if _, err := s.Write(reply); err != nil {
		conn.CloseWithError(codeHello, "hello reply: "+err.Error())
		return
	}
	s.Close()
}

// registrable reports whether register would take stripe k of stripes
// from rank r in the mesh (not on demand), without registering.
func (e *endpoint) registrable(r, k, stripes int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing.Load() {
		return transport.ErrClosed
	}
	return e.registrableLocked(r, k, stripes)
}

func (e *endpoint) registrableLocked(r, k, stripes int) error {
	pc := e.conns[r]
	if k == 0 {
		if pc != nil {
			return fmt.Errorf("rank %d already connected", r)
		}
		if stripes < 1 || stripes > maxStripes {
			return fmt.Errorf("rank %d asks for %d data connections, want 1 to %d", r, stripes, maxStripes)
		}
		return nil
	}
	if pc == nil || stripes != len(pc.stripes)+1 || k >= stripes || pc.stripes[k-1].conn != nil {
		return fmt.Errorf("rank %d: unexpected data connection %d of %d", r, k, stripes)
	}
	return nil
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
	if err := e.registrableLocked(r, k, stripes); err != nil {
		return err
	}
	pc := e.conns[r]
	if k == 0 {
		e.addConnLocked(r, conn, stripes, nil)
		e.pending += stripes - 1
	} else {
		st := &pc.stripes[k-1]
		st.conn = conn
		e.wg.Go(func() { e.monitorStripe(pc, k, st) })
		e.wg.Go(func() { e.readDatagrams(pc, conn) })
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
	pc := &peerConn{rank: r, conn: conn, stripes: make([]stripe, stripes-1), asm: newAssembler(&e.codecs),
		doneIn: make(chan struct{}, 1), doneOutIn: make(chan struct{}, 1), od: od}
	for l := range pc.lanes {
		pc.lanes[l].sem = make(chan struct{}, 1)
	}
	e.conns[r] = pc
	e.wg.Go(func() { e.monitor(pc) })
	e.wg.Go(func() { e.acceptStreams(pc) })
	e.wg.Go(func() { e.readDatagrams(pc, conn) })
	if stripes > 1 {
		e.wg.Go(func() { e.sendDone(pc) })
	}
	return pc
}

// readDatagrams reads the peer's datagrams on conn, one of pc's, until it
// or the endpoint ends: tail probes, which it drops, and done notices.
func (e *endpoint) readDatagrams(pc *peerConn, conn *quic.Conn) {
	for {
		d, err := conn.ReceiveDatagram(e.ctx)
		if err != nil {
			return
		}
		switch {
		case len(d) > 0 && d[0] == dgProbe:
		case len(d) == doneSize && d[0] == dgDone:
			seq := binary.LittleEndian.Uint64(d[1:])
			if seq > pc.sentSeq.Load() {
				e.protocolError(pc, fmt.Errorf("done notice for message %d, beyond the last sent (%d)", seq, pc.sentSeq.Load()))
				return
			}
			if raiseTo(&pc.doneSeq, seq) {
				notify(pc.doneIn)
			}
		default:
			e.protocolError(pc, fmt.Errorf("%d-byte datagram of unknown kind", len(d)))
			return
		}
	}
}

// raiseTo sets v to x if x is higher and reports whether it did.
func raiseTo(v *atomic.Uint64, x uint64) bool {
	for {
		old := v.Load()
		if x <= old {
			return false
		}
		if v.CompareAndSwap(old, x) {
			return true
		}
	}
}

// notify wakes the waiter on ch (capacity 1) without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sendDone tells the peer, on doneCopies connections of the pair (the
// first, which carries no parts, and the first further ones), the highest
// seq of its coded messages this side has completed, so that its Send
// stops waiting for the parts still under way (see sendStriped). A done
// notice is a datagram: a lost or late one is covered by the other copies
// (all four lost: 1 in 160,000 at 5% loss) and by the next notice, and at
// worst the Send waits for its writes as it would without. SendDatagram
// waits only while a connection's queue of 32 datagrams is full, which
// ends at the latest with the connection.
func (e *endpoint) sendDone(pc *peerConn) {
	var d [doneSize]byte
	d[0] = dgDone
	for {
		select {
		case <-pc.doneOutIn:
		case <-pc.conn.Context().Done():
			return
		case <-e.ctx.Done():
			return
		}
		binary.LittleEndian.PutUint64(d[1:], pc.doneOut.Load())
		e.mu.Lock()
		conns := make([]*quic.Conn, 0, doneCopies)
		conns = append(conns, pc.conn)
		for _, st := range pc.stripes[:min(len(pc.stripes), doneCopies-1)] {
			if st.conn != nil {
				conns = append(conns, st.conn)
			}
		}
		e.mu.Unlock()
		for _, c := range conns {
			c.SendDatagram(d[:]) // best effort: an error ends with the connection
		}
	}
}

// monitorStripe reads the parts the peer sends on stripe k, each on a
// stream of its own, and ends the pair with its first connection if the
// stripe ends first: no striped message can complete without it.
func (e *endpoint) monitorStripe(pc *peerConn, k int, st *stripe) {
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	defer context.AfterFunc(pc.conn.Context(), cancel)()
	for {
		s, err := st.conn.AcceptUniStream(ctx)
		if err != nil {
			break
		}
		e.wg.Go(func() { e.readParts(ctx, pc, k, s) })
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

// readParts reads the parts on s, a stream the peer opened on stripe k,
// into the messages they belong to (see parts.go): one coded part, or
// plain parts back to back. A malformed part header, a part shorter or
// longer than its header says, a plain part that is not needed (only a
// duplicate can be) or a coded part after others closes the pair.
func (e *endpoint) readParts(ctx context.Context, pc *peerConn, k int, s *quic.ReceiveStream) {
	defer s.ReleaseStreamCredit()
	drop := func() { s.CancelRead(codePartDone) }
	bad := func(err error) {
		drop()
		e.protocolError(pc, fmt.Errorf("data connection %d: %w", k, err))
	}
	var hb [partHeaderSize]byte
	for first := true; ; first = false {
		if _, err := io.ReadFull(s, hb[:]); err != nil {
			switch {
			case err == io.EOF && !first:
				// the end of a stream of plain parts
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
				bad(errors.New("stream ended inside a part header"))
			default:
				drop() // reset by the sender, or the connection is gone
			}
			return
		}
		h, err := parsePartHeader(&hb, len(pc.stripes))
		coded := err == nil && h.parts > h.k
		switch {
		case err != nil:
		case h.index != k-1:
			err = fmt.Errorf("%w: part %d on data connection %d", frame.ErrMalformed, h.index, k)
		case coded && !first:
			err = fmt.Errorf("%w: coded part %d of message %d after other parts on a stream", frame.ErrMalformed, h.index, h.seq)
		}
		if err != nil {
			bad(err)
			return
		}
		m, region, err := pc.asm.claim(ctx, h, drop)
		switch {
		case err != nil && errors.Is(err, frame.ErrMalformed):
			bad(err)
			return
		case err != nil:
			drop() // the pair or the endpoint is ending
			return
		case m == nil && !coded:
			bad(fmt.Errorf("%w: plain part %d of message %d, which is complete", frame.ErrMalformed, h.index, h.seq))
			return
		case m == nil:
			drop() // not needed: its message is complete
			return
		}
		_, err = io.ReadFull(s, region)
		if pc.asm.filled(m, h.index, err == nil) && raiseTo(&pc.doneOut, h.seq) {
			notify(pc.doneOutIn)
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				bad(fmt.Errorf("%w: part %d of message %d shorter than %d bytes", frame.ErrMalformed, h.index, h.seq, len(region)))
			}
			return // cancelled (not needed), reset by the sender, or the connection is gone
		}
		if coded {
			// Reading the stream's end completes it, which frees its credit.
			var b [1]byte
			if n, _ := s.Read(b[:]); n > 0 {
				bad(fmt.Errorf("%w: coded part %d of message %d longer than %d bytes", frame.ErrMalformed, h.index, h.seq, len(region)))
			}
			return
		}
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
	if lane != transport.LaneData || len(pc.stripes) == 0 || n < stripeMin {
		p := make([]byte, n)
		if _, err := io.ReadFull(br, p); err != nil {
			return 0, nil, nil, unexpectedEOF(err)
		}
		return lane, h, p, nil
	}
	// A striped message: its parts come on the further connections.
	var split [2]byte
	if _, err := io.ReadFull(br, split[:]); err != nil {
		return 0, nil, nil, unexpectedEOF(err)
	}
	parts, k := int(split[0]), int(split[1])
	if err := checkParts(n, parts, k, len(pc.stripes)); err != nil {
		return 0, nil, nil, err
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	defer context.AfterFunc(pc.conn.Context(), cancel)()
	p, err := pc.asm.await(ctx, n, parts, k)
	if err != nil {
		if c := context.Cause(pc.conn.Context()); c != nil {
			return 0, nil, nil, c
		}
		if e.ctx.Err() != nil {
			return 0, nil, nil, transport.ErrClosed
		}
		return 0, nil, nil, err
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
	if e.picked != nil {
		e.picked(pc, "chosen")
	}
	if err := pc.conn.Context().Err(); err != nil {
		return e.endedUnwritten(ctx, pc, lane, h, payload, err)
	}
	if e.picked != nil {
		e.picked(pc, "checked")
	}
	sl := &pc.lanes[lane]
	select {
	case sl.sem <- struct{}{}:
	case <-odClosing(pc):
		return e.Send(ctx, peer, lane, h, payload) // on the pair's next connection
	case <-ctx.Done():
		return fmt.Errorf("quic: send to rank %d on %v: %w", peer, lane, ctx.Err())
	case <-pc.conn.Context().Done():
		// Ready together with odClosing when the connection was closed
		// to make room (select picks either).
		return e.endedUnwritten(ctx, pc, lane, h, payload, context.Cause(pc.conn.Context()))
	}
	defer func() { <-sl.sem }()
	if sl.s == nil {
		s, err := pc.conn.OpenUniStreamSync(ctx)
		if err != nil {
			return e.sendErr(pc, ctx, err)
		}
		sl.s = s
	}
	if lane == transport.LaneData && len(pc.stripes) > 0 && len(payload) >= stripeMin {
		wrote, err := e.sendStriped(ctx, pc, sl, h, payload)
		if err == nil {
			return nil
		}
		return e.sendFailed(ctx, pc, lane, wrote, err)
	}
	// A cancelled ctx moves the write deadline to the past.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		sl.s.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	sl.buf = frame.AppendPrefix(sl.buf[:0], lane, h, len(payload))
	var n int
	var err error
	if len(payload) <= inlineMax {
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
	}
	if cap(sl.buf) > 4*inlineMax {
		sl.buf = nil
	}
	if err == nil {
		return nil
	}
	return e.sendFailed(ctx, pc, lane, n > 0, err)
}

// endedUnwritten is what a Send returns whose connection pc ended (err)
// before it wrote anything on it. An on-demand connection may have been
// closed to make room since the Send chose it: that end is no failure, and
// the Send goes to the pair's next connection (odNext).
func (e *endpoint) endedUnwritten(ctx context.Context, pc *peerConn, lane transport.Lane, h *transport.Header, payload []byte, err error) error {
	if next, werr := e.odNext(ctx, pc); next {
		return e.Send(ctx, pc.rank, lane, h, payload)
	} else if werr != nil {
		return werr
	}
	return e.sendErr(pc, ctx, err)
}

// sendFailed turns the error of a Send on lane to pc into the one it
// returns. wrote says whether the peer may have seen part of the frame: if
// ctx ended then, only a new connection could resynchronise, so the peer is
// lost.
func (e *endpoint) sendFailed(ctx context.Context, pc *peerConn, lane transport.Lane, wrote bool, err error) error {
	if ctx.Err() != nil && pc.conn.Context().Err() == nil {
		if wrote {
			pc.conn.CloseWithError(codeSendAbort, fmt.Sprintf("send to rank %d on %v cancelled mid-frame", pc.rank, lane))
		}
		return fmt.Errorf("quic: send to rank %d on %v: %w", pc.rank, lane, ctx.Err())
	}
	return e.sendErr(pc, ctx, err)
}

// sendStriped sends a striped LaneData message (see parts.go): the frame
// prefix and the split on the data lane stream, then every part at once on
// a new stream of its own connection, each within that connection's
// congestion window. It returns once every part is written (quic-go holds
// what is still unacknowledged) or, for a coded message, once the peer
// says it completed the message, whichever is first: a part held up by
// loss on its connection then no longer holds up the Send, and its stream
// is cancelled. wrote says whether the peer may have seen part of the
// message.
func (e *endpoint) sendStriped(ctx context.Context, pc *peerConn, sl *sendLane, h *transport.Header, payload []byte) (wrote bool, err error) {
	lossy := e.node.opt.lossyAlways || pc.lossy()
	k, parts := partsOf(len(payload), len(pc.stripes), lossy)
	out, err := e.codecs.encodeParts(payload, k, parts)
	if err != nil {
		return false, err
	}
	sl.buf = frame.AppendPrefix(sl.buf[:0], transport.LaneData, h, len(payload))
	sl.buf = append(sl.buf, byte(parts), byte(k))
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		sl.s.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	n, err := writeMarker(pc, sl, lossy)
	if !stop() {
		<-fired
		sl.s.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		return n > 0, err
	}
	sl.seq++
	seq := sl.seq
	pc.sentSeq.Store(seq)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan error, parts)
	for i := range parts {
		ph := partHeader{index: i, seq: seq, n: len(payload), parts: parts, k: k}
		st := &pc.stripes[i]
		if parts > k {
			go func() { results <- writePart(pctx, st.conn, ph, out[i]) }()
		} else {
			go func() { results <- st.writePlain(pctx, ph, out[i]) }()
		}
	}
	var doneIn chan struct{}
	if parts > k {
		doneIn = pc.doneIn
	}
	var failed error
	written, done := 0, false
	for left := parts; left > 0; {
		select {
		case err := <-results:
			left--
			if err == nil {
				written++
			} else if failed == nil {
				failed = err
				cancel()
			}
		case <-doneIn:
			if pc.doneSeq.Load() >= seq {
				done, doneIn = true, nil
				cancel()
			}
		}
	}
	if done || written == parts {
		return true, nil
	}
	return true, failed
}

// writeMarker writes the frame prefix and split of a striped message, in
// sl.buf, on the data lane stream. On a lossy link tail probes follow:
// quic-go declares a packet lost only once a later one is acknowledged,
// and the frame is the last thing on the connection, so without them its
// loss would wait for the probe timeout (srtt + 4 rttvar + the peer's
// 26 ms max_ack_delay) while every part is in. The probes are acknowledged
// at once and the peer drops them. A plain Write may return with the
// frame still buffered, and quic-go packs datagrams ahead of stream data,
// so the probes would ride with it instead of after it: with a write
// limiter (one that limits nothing) Write returns only once every byte is
// in a packet. Probes are best effort: an error (connection closed,
// datagram too large for the path) only ends them.
func writeMarker(pc *peerConn, sl *sendLane, lossy bool) (int, error) {
	if !lossy {
		return sl.s.Write(sl.buf)
	}
	n, err := sl.s.WriteWithLimit(sl.buf, noLimit)
	if err != nil {
		return n, err
	}
	var probe [tailProbeSize]byte // dgProbe and padding
	for range tailProbes {
		if pc.conn.SendDatagram(probe[:]) != nil {
			break
		}
	}
	return n, nil
}

// noLimit is the write limiter of writeMarker: it allows every byte.
func noLimit(n int) int { return n }

// writePart opens a stream on conn and writes part h.index of message
// h.seq, a coded one, on it alone, until ctx ends. A part the receiver stopped (it completed
// the message without it) counts as written. When it returns quic-go no
// longer reads part.
func writePart(ctx context.Context, conn *quic.Conn, h partHeader, part []byte) error {
	s, err := conn.OpenUniStreamSync(ctx)
	if err != nil {
		return err
	}
	defer context.AfterFunc(ctx, func() { s.CancelWrite(codePartCancel) })()
	var hb [partHeaderSize]byte
	h.marshal(&hb)
	if _, err = s.Write(hb[:]); err == nil {
		if _, err = s.Write(part); err == nil {
			err = s.Close()
		}
	}
	if err != nil && partStopped(s) {
		return nil
	}
	return err
}

// writePlain writes part h.index of message h.seq, a plain one, on the
// stream of st that carries them, opened on first use, until ctx ends
// (which leaves the stream mid-part: the caller closes the pair).
func (st *stripe) writePlain(ctx context.Context, h partHeader, part []byte) error {
	if st.out == nil {
		s, err := st.conn.OpenUniStreamSync(ctx)
		if err != nil {
			return err
		}
		st.out = s
	}
	defer context.AfterFunc(ctx, func() { st.out.CancelWrite(codePartCancel) })()
	var hb [partHeaderSize]byte
	h.marshal(&hb)
	_, err := st.out.Write(hb[:])
	if err == nil {
		_, err = st.out.Write(part)
	}
	return err
}

// partStopped reports whether the receiver stopped s, a part's stream,
// because it completed the message without it. Its STOP_SENDING fails the
// Write or, when that is done, the Close, with an error of its own: the
// stream's cause says why.
func partStopped(s *quic.SendStream) bool {
	var se *quic.StreamError
	return errors.As(context.Cause(s.Context()), &se) && se.Remote && se.ErrorCode == codePartDone
}

// lossy says whether the pair's connections have lost more than 1 packet
// in lossyRatio so far.
func (pc *peerConn) lossy() bool {
	s := pc.conn.ConnectionStats()
	lost, sent := s.PacketsLost, s.PacketsSent
	for _, st := range pc.stripes {
		s := st.conn.ConnectionStats()
		lost += s.PacketsLost
		sent += s.PacketsSent
	}
	return lost*lossyRatio > sent
}

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
