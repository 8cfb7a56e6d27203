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
	loopbackDepth                           = 16 // messages per loopback lane
	inlineMax                               = 16 << 10
	readBuffer                              = 64 << 10
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
	pending int // connections still missing
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
		conns: make([]*peerConn, len(peers)), pending: len(peers) - 1, ready: make(chan struct{})}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	for l := range e.loop {
		e.loop[l] = inbox.Start(&e.wg, loopbackDepth, e.ctx.Done(), self, h)
	}
	if e.pending == 0 {
		close(e.ready)
	}
	return e
}

func (e *endpoint) Rank() int { return e.self }
func (e *endpoint) Size() int { return len(e.peers) }

func (e *endpoint) connect(ctx context.Context) error {
	errc := make(chan error, len(e.peers))
	if e.self > 0 {
		e.wg.Go(e.acceptLoop)
	}
	for r := e.self + 1; r < len(e.peers); r++ {
		e.wg.Go(func() {
			if err := e.dial(ctx, r); err != nil {
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
			if c == nil && r != e.self {
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
	addr, err := net.ResolveUDPAddr("udp", p.Addr)
	if err != nil {
		return fmt.Errorf("quic: rank %d address %q: %w", r, p.Addr, err)
	}
	tlsConf := ClientTLSConfig(e.node.id, func(fp [32]byte) error {
		if !Equal(fp, p.Fingerprint) {
			return fmt.Errorf("quic: rank %d at %s presented certificate %x, not the pinned one", r, p.Addr, fp[:8])
		}
		return nil
	})
	backoff := 20 * time.Millisecond
	for {
		err = e.dialOnce(ctx, r, addr, tlsConf)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("quic: connect to rank %d at %s: %w (last error: %v)", r, p.Addr, ctx.Err(), err)
		case <-e.ctx.Done():
			return transport.ErrClosed
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (e *endpoint) dialOnce(ctx context.Context, r int, addr *net.UDPAddr, tlsConf *tls.Config) error {
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
	if _, err := s.Write(hello{rank: uint32(e.self), size: uint32(len(e.peers))}.marshal()); err != nil {
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
	if !e.register(r, conn) {
		return fail(fmt.Errorf("rank %d already connected", r))
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
	if hi.rank >= uint32(e.self) || hi.size != uint32(len(e.peers)) || !Equal(fp, e.peers[r].Fingerprint) {
		refuse(fmt.Errorf("hello names rank %d of %d, which does not match the certificate", hi.rank, hi.size))
		return
	}
	if !e.register(r, conn) {
		refuse(fmt.Errorf("rank %d already connected", r))
		return
	}
	if _, err := s.Write(hello{rank: uint32(e.self), size: uint32(len(e.peers))}.marshal()); err != nil {
		conn.CloseWithError(codeHello, "hello reply: "+err.Error())
		return
	}
	s.Close()
}

// register installs a verified connection and starts its goroutines. It
// returns false if rank r already has one or the endpoint is closing.
func (e *endpoint) register(r int, conn *quic.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conns[r] != nil || e.closing.Load() {
		return false
	}
	pc := &peerConn{rank: r, conn: conn}
	for l := range pc.lanes {
		pc.lanes[l].sem = make(chan struct{}, 1)
	}
	e.conns[r] = pc
	e.wg.Go(func() { e.monitor(pc) })
	e.wg.Go(func() { e.acceptStreams(pc) })
	e.pending--
	if e.pending == 0 {
		close(e.ready)
	}
	return true
}

// monitor reports the connection's end to the DownHandler, once.
func (e *endpoint) monitor(pc *peerConn) {
	select {
	case <-pc.conn.Context().Done():
	case <-e.ctx.Done():
		return
	}
	if e.closing.Load() {
		return
	}
	cause := context.Cause(pc.conn.Context())
	var ae *quic.ApplicationError
	if errors.As(cause, &ae) && ae.Remote && ae.ErrorCode == codeClosed {
		cause = fmt.Errorf("quic: rank %d closed its endpoint before it was drained", pc.rank)
	} else {
		cause = fmt.Errorf("quic: connection to rank %d: %w", pc.rank, cause)
	}
	pc.mu.Lock()
	already := pc.downed
	pc.downed = true
	pc.mu.Unlock()
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
	r := frame.Reader{R: bufio.NewReaderSize(s, readBuffer)}
	lane := transport.NumLanes
	for {
		l, h, p, err := r.Next()
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
		if e.h != nil {
			e.h(pc.rank, l, h, p)
		}
	}
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
	e.mu.Lock()
	pc := e.conns[peer]
	e.mu.Unlock()
	if pc == nil {
		return &transport.PeerDownError{Peer: peer, Cause: errors.New("quic: not connected")}
	}
	if err := pc.conn.Context().Err(); err != nil {
		return e.sendErr(pc, ctx, err)
	}
	sl := &pc.lanes[lane]
	select {
	case sl.sem <- struct{}{}:
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
func (e *endpoint) Close() error {
	e.once.Do(func() {
		e.mu.Lock()
		e.closing.Store(true)
		conns := append([]*peerConn(nil), e.conns...)
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
// It keeps each lane's semaphore, so no Send can follow the goodbye.
func (e *endpoint) sayGoodbye(pc *peerConn, deadline time.Time) {
	ctx, cancel := context.WithDeadline(pc.conn.Context(), deadline)
	defer cancel()
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
		buf = frame.AppendGoodbye(buf[:0], transport.Lane(l))
		if _, err := sl.s.Write(buf); err != nil {
			return
		}
		sl.s.Close()
	}
	<-ctx.Done()
}
