package bulk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
)

// This file is the RPC channel: LaneRPC moved, per peer and direction, off
// the QUIC mesh (where a loopback round trip costs over 100 µs of
// user-space packet processing on a small host) onto a channel of its own,
// apart from the data channels, so that RPC never waits behind a
// collective's payload nor a collective behind RPC:
//
//   - a peer on this host (equal host ids, shared memory allowed): a second
//     shared-memory ring per direction, made (like the data rings) with the
//     pair's first call and charged to Options.RingBudget;
//   - another host (or ModeTCP): one TCP connection per direction, TLS
//     pinned like the data connections, preamble "NXR1";
//   - else, or when the negotiation fails, the inner endpoint (QUIC).
//
// Inbound RPC is never polled by a waiting goroutine (nobody waits for a
// request): one reader goroutine per channel blocks in the ring's Read
// (a short spin, then a futex sleep that the producer wakes, because the
// reader counts itself as a consumer inside a frame) or in the TCP read, and
// hands each message to the layer above at once.
//
// Negotiation (control lane, owner byte 0xB5, like the data channels): the
// sender of the first call to a peer sends rpcwant {host}; the peer (the
// receiving side) answers rpcoffer {kind shm|tcp|quic, ...}, having made
// the ring or armed a one-time nonce; the sender attaches and, for a ring,
// answers rpcresult {ok}. A sender that cannot attach, or gets no answer
// within rpcConnectTimeout, keeps RPC to that peer on QUIC.

const (
	// rpcRingSize is the largest RPC ring: replies of a few MiB stream
	// through it in pieces, and most pairs never call at all.
	rpcRingSize = 2 << 20
	// rpcConnectTimeout bounds how long a first call waits for the
	// peer's offer before RPC to it stays on QUIC.
	rpcConnectTimeout = 10 * time.Second
	rpcMagic          = "NXR1"
)

// rpcChan carries LaneRPC frames in one direction over one link: a TCP
// connection, or a ring with its doorbell. send is safe for concurrent
// use; one goroutine reads.
type rpcChan struct {
	peer  int
	desc  string
	l     link  // TCP; nil for a ring
	r     *ring // ring, with its doorbell b
	b     *bell
	sem   *sendLock // serialises frames
	buf   []byte
	dead  chan struct{}
	once  sync.Once
	quiet atomic.Bool // closed on purpose: do not report the peer down
	bad   atomic.Bool // a frame was cut: the stream cannot be framed any more
	// Cross-memory attach on a ring, as on the data rings: the sender sends
	// payloads of remoteMin bytes or more (0: never) as remote frames once
	// the receiver, which knows remotePID, said it can read them.
	remoteMin int
	remotePID atomic.Int64
}

func newRPCChan(peer int, desc string, l link) *rpcChan {
	return &rpcChan{peer: peer, desc: desc, l: l, sem: newSendLock(), dead: make(chan struct{})}
}

func newRPCRing(peer, size int, r *ring, b *bell) *rpcChan {
	c := newRPCChan(peer, "rpc "+ringDesc(size), nil)
	c.r, c.b = r, b
	return c
}

// rpcRemoteMin is the smallest RPC payload sent as a remote frame
// (cross-memory attach) for Options.RemoteMin, 0 for never: only where
// RemoteMin was set below DefaultRemoteMin. By default RPC payloads go
// through the ring: a call has one frame in flight, and the ring's two
// copies run side by side (the reader copies out each piece the writer
// has published), while a remote frame's one copy leaves the sender
// spinning until the receiver is done; on a 2-core host the ring was as
// fast or faster at every size from 256 KiB to 16 MiB (docs/performance.md).
func rpcRemoteMin(remoteMin int) int {
	if remoteMin <= 0 || remoteMin >= DefaultRemoteMin {
		return 0
	}
	return remoteMin
}

// bellPiece bounds what the producer publishes before it rings: the
// reader then copies while the producer writes the rest.
const bellPiece = 64 << 10

func (c *rpcChan) close() {
	c.once.Do(func() {
		close(c.dead)
		if c.l != nil {
			c.l.Close()
			return
		}
		c.r.Close()
		c.b.ring() // a producer's close: the reader sees it
		c.b.Close()
	})
}

// write writes bufs in order (a ring rings its bell after each piece).
func (c *rpcChan) write(ctx context.Context, bufs ...[]byte) (int, error) {
	if c.l != nil {
		return c.l.write(ctx, nil, bufs...)
	}
	n := 0
	for _, b := range bufs {
		for len(b) > 0 {
			k := min(len(b), bellPiece)
			m, err := c.r.Write(ctx, b[:k], nil)
			n += m
			if m > 0 {
				c.b.ring()
			}
			if err != nil {
				return n, err
			}
			b = b[k:]
		}
	}
	return n, nil
}

// ringSpins is how often the reader re-checks an empty ring before it
// parks on the doorbell: a reply often follows within a few microseconds.
const ringSpins = 64

// readFull fills p from the ring, parking on the doorbell while it is
// empty; it fails once the ring is closed and drained (io.EOF: the
// producer closed it).
func (c *rpcChan) readFull(p []byte) error {
	off, spins := 0, 0
	for off < len(p) {
		k := c.r.TryRead(p[off:])
		off += k
		if k > 0 {
			spins = 0
			continue
		}
		if err := c.r.closedErr(); err != nil {
			if c.r.available() > 0 {
				continue
			}
			return err
		}
		if spins < ringSpins {
			spins++
			continue
		}
		if err := c.b.wait(); err != nil {
			if cerr := c.r.closedErr(); cerr != nil {
				err = cerr
			}
			return err
		}
	}
	return nil
}

// send writes one frame; broken reports that the channel is unusable
// (some bytes of the frame left).
func (c *rpcChan) send(ctx context.Context, h *transport.Header, p []byte) (broken bool, err error) {
	if err := c.sem.lockCtx(ctx, c.dead); err != nil {
		return err == errBroken, err
	}
	defer c.sem.unlock()
	if c.bad.Load() {
		return true, errBroken
	}
	if c.r != nil && c.remoteMin > 0 && len(p) >= c.remoteMin && c.r.remoteOK() {
		return c.sendRemote(ctx, h, p)
	}
	c.buf = frame.AppendPrefix(c.buf[:0], transport.LaneRPC, h, len(p))
	var n int
	if len(p) <= inlineMax {
		c.buf = append(c.buf, p...)
		n, err = c.write(ctx, c.buf)
	} else {
		n, err = c.write(ctx, c.buf, p)
	}
	if cap(c.buf) > 4*inlineMax {
		c.buf = nil
	}
	return c.sent(ctx, n, err)
}

// sent turns the outcome of a frame's write (n bytes written) into send's:
// nothing on success; the context's error when it ended the write before
// anything left; else the channel is broken (a partial frame, or the
// receiver may be copying p as send returns, must never be delivered as a
// whole) and the error is reported as the channel's.
func (c *rpcChan) sent(ctx context.Context, n int, err error) (bool, error) {
	if err == nil {
		return false, nil
	}
	if n == 0 && ctx.Err() != nil {
		return false, ctx.Err()
	}
	c.bad.Store(true)
	c.close()
	return true, err
}

// sendRemote writes a remote frame for p and waits until the receiver has
// copied p out of this process's memory (one copy instead of two; p is at
// least remoteMin bytes, so on the heap or in C memory, neither of which
// moves). Called with the semaphore held.
func (c *rpcChan) sendRemote(ctx context.Context, h *transport.Header, p []byte) (bool, error) {
	c.buf = frame.AppendRemote(c.buf[:0], transport.LaneRPC, h, len(p), uint64(uintptr(unsafe.Pointer(&p[0]))))
	k := c.r.sentRemote()
	n, err := c.write(ctx, c.buf)
	if err == nil {
		err = c.r.waitAck(ctx, k, len(p), nil)
	}
	runtime.KeepAlive(p)
	return c.sent(ctx, n, err)
}

// goodbye writes the goodbye frame (waiting until deadline for a frame in
// flight) and closes the channel.
func (c *rpcChan) goodbye(deadline time.Time) {
	switch c.sem.lockUntil(deadline, c.dead) {
	case cancelled:
		c.close()
		return
	case ended:
		return
	}
	if !c.bad.Load() {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c.write(ctx, frame.AppendGoodbye(nil, transport.LaneRPC))
		cancel()
	}
	c.close()
}

// readLoop delivers frames until the link fails or a goodbye arrives
// (frame.ErrGoodbye). place (may be nil) is asked for each payload's
// buffer first, as on the data channels (transport.PlaceFunc): the layer
// above then reads large payloads straight into buffers it reuses.
func (c *rpcChan) readLoop(place transport.PlaceFunc, from int, deliver func(h *transport.Header, p []byte)) error {
	readFull := c.readFull
	if c.l != nil {
		r := bufio.NewReaderSize(c.l, readBuf)
		readFull = func(p []byte) error {
			_, err := io.ReadFull(r, p)
			return err
		}
	}
	var pre [frame.PrefixSize]byte
	for {
		if err := readFull(pre[:]); err != nil {
			return err
		}
		lane, h, n, remote, err := frame.ParsePrefixRemote(&pre, transport.MaxPayload)
		if err != nil {
			if errors.Is(err, frame.ErrGoodbye) && lane != transport.LaneRPC {
				err = fmt.Errorf("%w: goodbye for lane %v on an RPC channel", frame.ErrMalformed, lane)
			}
			return err
		}
		if lane != transport.LaneRPC {
			return fmt.Errorf("%w: lane %v on an RPC channel", frame.ErrMalformed, lane)
		}
		pid := c.remotePID.Load()
		if remote && (c.r == nil || pid == 0) {
			return fmt.Errorf("%w: remote frame before cross-memory attach was agreed", frame.ErrMalformed)
		}
		var p []byte
		var done func(error)
		if place != nil && n > 0 {
			p, done = place(from, h, n)
			if p != nil && len(p) != n {
				err := fmt.Errorf("bulk: RPC placement of %d bytes for a %d-byte payload", len(p), n)
				done(err)
				return err
			}
		}
		if p == nil {
			p, done = make([]byte, n), nil // the handler's to keep
		}
		if err := c.readPayload(readFull, remote, pid, p); err != nil {
			if done != nil {
				done(err)
			}
			return err
		}
		if done != nil {
			done(nil)
			continue
		}
		deliver(h, p)
	}
}

// readPayload fills p with a frame's payload: from the stream, or for a
// remote frame from the sender's memory (acknowledged once copied).
func (c *rpcChan) readPayload(readFull func([]byte) error, remote bool, pid int64, p []byte) error {
	if !remote {
		err := readFull(p)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	var d [frame.RemoteSize]byte
	err := readFull(d[:])
	var addr uint64
	if err == nil {
		addr, err = frame.RemoteAddr(&d)
	}
	if err == nil {
		err = readRemote(int(pid), addr, p)
	}
	if err != nil {
		return err
	}
	c.r.ack()
	return nil
}

// rpcPaths is the endpoint's RPC channel state. Lock order: Endpoint.mu,
// then mu.
type rpcPaths struct {
	out []atomic.Pointer[rpcChan] // atomic: outbound channel per peer; nil: inner

	// mu guards the fields below.
	mu        sync.Mutex
	waits     []chan struct{}   // per peer: closed once the outbound path is fixed
	in        []*rpcChan        // per peer: inbound channel still reading
	byeSeen   []bool            // per peer: inbound channel ended with a goodbye
	outs      []*rpcChan        // every outbound channel made, for Close
	offers    map[int]*tcpOffer // TCP offers waiting for their connection, by peer
	paths     []string          // per peer: what carries this rank's RPC to it (RPCPaths)
	ringBytes int               // capacity of the RPC rings this process created
}

func newRPCPaths(size int) *rpcPaths {
	p := &rpcPaths{out: make([]atomic.Pointer[rpcChan], size),
		waits: make([]chan struct{}, size), in: make([]*rpcChan, size), byeSeen: make([]bool, size), offers: map[int]*tcpOffer{}, paths: make([]string, size)}
	for i := range p.paths {
		p.paths[i] = "quic"
	}
	return p
}

// sendRPC sends a LaneRPC message to peer over its RPC channel, negotiating
// the channel with the first one; it reports handled false when the
// message is to go over the inner endpoint.
func (e *Endpoint) sendRPC(ctx context.Context, peer int, h *transport.Header, payload []byte) (handled bool, err error) {
	if e.opt.Mode == ModeOff || peer < 0 || peer >= e.size || peer == e.self {
		return false, nil
	}
	ch := e.rpc.out[peer].Load()
	if ch == nil {
		if err := e.rpcConnect(ctx, peer); err != nil {
			return true, err
		}
		if ch = e.rpc.out[peer].Load(); ch == nil {
			return false, nil
		}
	}
	if e.downed[peer].Load() {
		return true, &transport.PeerDownError{Peer: peer, Cause: e.cause(peer)}
	}
	if len(payload) > transport.MaxPayload {
		return true, fmt.Errorf("bulk: payload of %d bytes exceeds %d", len(payload), transport.MaxPayload)
	}
	broken, err := ch.send(ctx, h, payload)
	if err == nil {
		return true, nil
	}
	if e.closed.Load() {
		return true, transport.ErrClosed
	}
	if broken {
		if e.downed[peer].Load() {
			return true, &transport.PeerDownError{Peer: peer, Cause: e.cause(peer)}
		}
		err = fmt.Errorf("bulk: RPC to rank %d over %s: %w", peer, ch.desc, err)
		if ctx.Err() != nil {
			e.report(peer, err) // we cut a frame: the peer sees an abrupt loss
		}
		return true, &transport.PeerDownError{Peer: peer, Cause: err}
	}
	return true, fmt.Errorf("bulk: RPC to rank %d: %w", peer, err)
}

// rpcConnect waits until the RPC path to peer is decided; the first caller
// asks the peer for a channel (evRPCConnect). Nothing went to peer on
// LaneRPC before, so whichever path is chosen keeps the order.
func (e *Endpoint) rpcConnect(ctx context.Context, peer int) error {
	s := e.rpc
	s.mu.Lock()
	w := s.waits[peer]
	if w == nil {
		w = make(chan struct{})
		s.waits[peer] = w
	}
	s.mu.Unlock()
	select {
	case <-w:
		return nil
	default:
	}
	// On e.ctx: a caller giving up must not lose the request that later
	// calls wait on.
	e.negotiate(e.ctx, evRPCConnect{peer})
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bulk: RPC to rank %d: %w", peer, ctx.Err())
	case <-e.ctx.Done():
		return transport.ErrClosed
	}
}

// startRPCReader installs an inbound RPC channel and delivers its frames
// in a goroutine of its own.
func (e *Endpoint) startRPCReader(from int, ch *rpcChan) {
	s := e.rpc
	e.mu.Lock()
	if !e.accepting || e.downed[from].Load() {
		e.mu.Unlock()
		ch.quiet.Store(true)
		ch.close()
		return
	}
	e.wg.Add(1)
	e.mu.Unlock()
	s.mu.Lock()
	old := s.in[from]
	s.in[from] = ch
	s.mu.Unlock()
	if old != nil {
		old.quiet.Store(true)
		old.close()
	}
	go func() {
		defer e.wg.Done()
		err := ch.readLoop(e.opt.Place, from, func(h *transport.Header, p []byte) {
			if e.h != nil {
				e.h(from, transport.LaneRPC, h, p)
			}
		})
		ch.close()
		graceful := errors.Is(err, frame.ErrGoodbye)
		s.mu.Lock()
		if s.in[from] == ch {
			s.in[from] = nil
			s.byeSeen[from] = graceful
		}
		s.mu.Unlock()
		if ch.quiet.Load() || e.closed.Load() {
			return
		}
		if graceful {
			// A departure the inner endpoint reported is told once both
			// inbound channels drained (peerLost).
			e.mu.Lock()
			bye := e.bye[from]
			if e.in[from] != nil && !e.byeSeen[from] {
				bye = nil // the data channel's reader reports it
			}
			e.mu.Unlock()
			if bye != nil {
				e.report(from, bye)
			}
			return
		}
		e.reportLost(from, fmt.Errorf("bulk: RPC from rank %d over %s: %w", from, ch.desc, err))
	}()
}

// chargeRPCRing takes an RPC ring from the RPC allowance, a quarter of
// Options.RingBudget on top of it (so RPC never shrinks a data ring), and
// returns its capacity: a quarter of a data ring, at most rpcRingSize,
// halved while the allowance lacks room; 0 when not even 64 KiB is left.
func (e *Endpoint) chargeRPCRing() int {
	size := min(rpcRingSize, max(e.pairRing()/4, minRing))
	s := e.rpc
	s.mu.Lock()
	defer s.mu.Unlock()
	for size >= minRing && s.ringBytes+size > e.opt.RingBudget/4 {
		size /= 2
	}
	if size < minRing {
		return 0
	}
	s.ringBytes += size
	return size
}

func (e *Endpoint) refundRPCRing(size int) {
	e.rpc.mu.Lock()
	e.rpc.ringBytes -= size
	e.rpc.mu.Unlock()
}

// rpcPending reports whether peer's inbound RPC channel is still open
// (no goodbye read yet). Called with e.mu held (lock order: e.mu, then
// rpc.mu).
func (e *Endpoint) rpcPending(peer int) bool {
	s := e.rpc
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.in[peer] != nil && !s.byeSeen[peer]
}

// rpcPeerDown closes peer's RPC channels (it is down).
func (e *Endpoint) rpcPeerDown(peer int) {
	s := e.rpc
	s.mu.Lock()
	in := s.in[peer]
	s.mu.Unlock()
	for _, ch := range []*rpcChan{e.rpc.out[peer].Load(), in} {
		if ch != nil {
			ch.quiet.Store(true)
			ch.close()
		}
	}
}

// rpcGoodbyes says goodbye on every outbound RPC channel (until deadline).
func (e *Endpoint) rpcGoodbyes(deadline time.Time, wg *sync.WaitGroup) {
	s := e.rpc
	s.mu.Lock()
	outs := append([]*rpcChan(nil), s.outs...)
	s.mu.Unlock()
	for _, ch := range outs {
		wg.Go(func() { ch.goodbye(deadline) })
	}
}

// rpcCloseAll closes every RPC channel and pending TCP offer (Close).
func (e *Endpoint) rpcCloseAll() {
	s := e.rpc
	s.mu.Lock()
	chans := append(append([]*rpcChan(nil), s.in...), s.outs...)
	for _, off := range s.offers {
		for _, c := range off.raws {
			if c != nil {
				c.Close()
			}
		}
	}
	s.offers = nil
	s.mu.Unlock()
	for _, ch := range chans {
		if ch != nil {
			ch.quiet.Store(true)
			ch.close()
		}
	}
}

// rpcAccepted attaches an authorised TCP connection to the RPC offer
// made to from (authorise checked the MAC against it).
func (e *Endpoint) rpcAccepted(from int, c, raw net.Conn) {
	l := connLink{c: c, raw: raw}
	e.startRPCReader(from, newRPCChan(from, "rpc "+e.tcpDesc([]link{l}), l))
}
