package bulk

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/nexar-go/nexar/transport/internal/record"
	nquic "github.com/nexar-go/nexar/transport/quic"
)

// TCP connection preamble, sent by the dialer (inside TLS unless plaintext):
//
//	0  4  magic "NXB1" (data channel) or "NXR1" (RPC channel, rpcchan.go);
//	      on a TLS connection "NXB2" or "NXR2": sealed records follow
//	      (sealedMagic)
//	4  4  dialer rank, u32 LE
//	8  2  connection index, u16 LE
//	10 2  connection count, u16 LE
//	12 32 HMAC-SHA256(nonce, "nexar-bulk/1" ‖ dialer u32 ‖ acceptor u32 ‖ index u16 ‖ count u16)
//
// The acceptor answers one byte once it has checked the preamble: 1 on a
// plaintext connection; on a TLS connection the record suite
// (record.Suite: AES-128-GCM, the only one). Both ends then leave TLS's
// record layer for package
// record's: the dialer's bytes after the answer are sealed records keyed
// from the TLS session (the acceptor writes nothing after its answer, and
// session tickets are off, so neither TLS stream holds unread bytes when
// they switch). docs/wire-format.md gives the security argument. Magic and
// answer travel inside TLS, so nobody on the path can alter them.
const (
	preambleSize = 44
	authTimeout  = 5 * time.Second
	maxConns     = 16
)

// tcpOffer is an inbound channel waiting for its connections.
type tcpOffer struct {
	nonce []byte
	conns []net.Conn
	raws  []net.Conn
	got   int
}

// sealedMagic is the preamble magic of a TLS connection: the plaintext
// magic's version digit replaced by 2, sealed records. A dialer of the
// TLS-stream protocol ("NXB1" over TLS, before records) is refused, and
// falls back to QUIC, rather than misread.
func sealedMagic(magic string) string { return magic[:3] + "2" }

// parseMagic reads a preamble's magic: whether it is the RPC channel's,
// and whether it is the one this connection's kind (plaintext or TLS)
// expects.
func parseMagic(m string, plaintext bool) (rpc, ok bool) {
	base := m[:3] + "1"
	rpc = base == rpcMagic
	if !rpc && base != "NXB1" {
		return false, false
	}
	if plaintext {
		return rpc, m[3] == '1'
	}
	return rpc, m[3] == '2'
}

func preambleMAC(nonce []byte, dialer, acceptor, idx, cnt int) []byte {
	m := hmac.New(sha256.New, nonce)
	var b [12]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(dialer))
	binary.LittleEndian.PutUint32(b[4:], uint32(acceptor))
	binary.LittleEndian.PutUint16(b[8:], uint16(idx))
	binary.LittleEndian.PutUint16(b[10:], uint16(cnt))
	m.Write([]byte("nexar-bulk/1"))
	m.Write(b[:])
	return m.Sum(nil)
}

func (e *Endpoint) acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		e.wg.Go(func() { e.authorise(c) })
	}
}

// authorise checks one inbound TCP connection and attaches it to the
// pending offer it names; anything else is dropped.
func (e *Endpoint) authorise(raw net.Conn) {
	ok := false
	defer func() {
		if !ok {
			raw.Close()
		}
	}()
	raw.SetDeadline(time.Now().Add(authTimeout))
	keepAlive(raw)
	stop := context.AfterFunc(e.ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c := raw // the preamble and the answer; TLS unless plaintext
	var cs tls.ConnectionState
	var fp [32]byte
	if !e.opt.Plaintext {
		tc := tls.Server(raw, nquic.ServerTLSConfig(e.opt.Identity, e.knownPeer))
		if err := tc.Handshake(); err != nil {
			e.log.Debug("nexar: bulk: refused TCP connection", "rank", e.self, "remote", raw.RemoteAddr().String(), "err", err)
			return
		}
		cs = tc.ConnectionState()
		fp = sha256.Sum256(cs.PeerCertificates[0].Raw)
		c = tc
	}
	var b [preambleSize]byte
	_, err := io.ReadFull(c, b[:])
	forRPC, okMagic := parseMagic(string(b[:4]), e.opt.Plaintext)
	if err != nil || !okMagic {
		e.log.Debug("nexar: bulk: refused TCP connection without preamble", "rank", e.self, "remote", raw.RemoteAddr().String())
		return
	}
	from := int(binary.LittleEndian.Uint32(b[4:]))
	idx := int(binary.LittleEndian.Uint16(b[8:]))
	cnt := int(binary.LittleEndian.Uint16(b[10:]))
	if from < 0 || from >= e.size || from == e.self {
		return
	}
	if !e.opt.Plaintext && !nquic.Equal(fp, e.opt.Fingerprints[from]) {
		e.log.Warn("nexar: bulk: TLS certificate does not match the rank named", "rank", e.self, "claimed", from)
		return
	}
	// What the channel reads and writes: sealed records after the answer
	// on a TLS connection.
	stream, answer := raw, byte(1)
	if !e.opt.Plaintext {
		suite := record.AES128GCM
		sc, err := record.NewConn(raw, &cs, false, suite, &e.records)
		if err != nil {
			e.log.Warn("nexar: bulk: refused TCP connection", "rank", e.self, "claimed", from, "err", err)
			return
		}
		stream, answer = sc, byte(suite)
	}
	mu := &e.mu
	if forRPC {
		mu = &e.rpc.mu
	}
	mu.Lock()
	offers := e.offers
	if forRPC {
		offers = e.rpc.offers
	}
	off := offers[from]
	valid := off != nil && cnt == len(off.conns) && idx < cnt && off.conns[idx] == nil &&
		hmac.Equal(b[12:], preambleMAC(off.nonce, from, e.self, idx, cnt))
	if !valid {
		mu.Unlock()
		e.log.Warn("nexar: bulk: refused unauthorised TCP connection", "rank", e.self, "claimed", from, "remote", raw.RemoteAddr().String())
		return
	}
	off.conns[idx] = stream
	off.raws[idx] = raw
	off.got++
	complete := off.got == len(off.conns)
	if complete {
		delete(offers, from) // the nonce is single use
	}
	mu.Unlock()
	ok = true
	if _, err := c.Write([]byte{answer}); err != nil {
		return // the dialer sees the failure and falls back; the offer is spent
	}
	raw.SetDeadline(time.Time{})
	if complete && forRPC {
		e.rpcAccepted(from, stream, raw)
	} else if complete {
		links := make([]link, len(off.conns))
		raws := off.raws
		for i, cc := range off.conns {
			links[i] = connLink{c: cc, raw: raws[i]}
		}
		e.startReader(from, newChannel(from, e.tcpDesc(links), links))
	}
}

// Keepalives on every bulk TCP connection, so that the peer's kernel
// answers at least every keepAliveIdle*2 while the connection lives, also
// when no data moves and while the peer's process is stopped or starved
// (PeerAlive). Count only bounds how long the kernel keeps a connection
// nobody answers; the failure detector decides long before.
const (
	keepAliveIdle  = 500 * time.Millisecond
	keepAliveCount = 60
	// kernelFresh is how recent the peer's kernel's last answer must be for
	// PeerAlive to count it: two keepalive rounds and a margin.
	kernelFresh = 2 * time.Second
)

func keepAlive(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveIdle, Count: keepAliveCount})
	}
}

// knownPeer accepts the certificate of any rank in the table; the preamble
// then says which rank, and authorise checks that they match.
func (e *Endpoint) knownPeer(fp [32]byte) error {
	found := false
	for r, f := range e.opt.Fingerprints {
		if r != e.self && nquic.Equal(fp, f) {
			found = true
		}
	}
	if !found {
		return errors.New("bulk: unknown certificate")
	}
	return nil
}

func (e *Endpoint) dial(ctx context.Context, addr string) (net.Conn, error) {
	if e.dialHook != nil {
		return e.dialHook(ctx, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// dialTCP opens the connections of an offer from peer, with the
// preamble's magic ("NXB1" for data, rpcMagic for the RPC channel), and
// waits for each to be accepted.
func (e *Endpoint) dialTCP(ctx context.Context, peer int, addr string, nonce []byte, cnt int, useTLS bool, magic string) ([]link, error) {
	if cnt < 1 || cnt > maxConns || len(nonce) != 32 {
		return nil, fmt.Errorf("bulk: offer from rank %d: %d connections, %d-byte nonce", peer, cnt, len(nonce))
	}
	if useTLS == e.opt.Plaintext {
		return nil, fmt.Errorf("bulk: rank %d offers TLS=%v, this rank wants TLS=%v", peer, useTLS, !e.opt.Plaintext)
	}
	ctx, cancel := context.WithTimeout(ctx, authTimeout)
	defer cancel()
	links := make([]link, 0, cnt)
	fail := func(err error) ([]link, error) {
		for _, l := range links {
			l.Close()
		}
		return nil, fmt.Errorf("bulk: connect to rank %d at %s: %w", peer, addr, err)
	}
	for i := range cnt {
		raw, err := e.dial(ctx, addr)
		if err != nil {
			return fail(err)
		}
		keepAlive(raw)
		dl, _ := ctx.Deadline()
		raw.SetDeadline(dl)
		c := raw // as in authorise
		var cs tls.ConnectionState
		m := magic
		if useTLS {
			tc := tls.Client(raw, nquic.ClientTLSConfig(e.opt.Identity, func(fp [32]byte) error {
				if !nquic.Equal(fp, e.opt.Fingerprints[peer]) {
					return fmt.Errorf("bulk: rank %d presented certificate %x, not the pinned one", peer, fp[:8])
				}
				return nil
			}))
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return fail(err)
			}
			c, cs, m = tc, tc.ConnectionState(), sealedMagic(magic)
		}
		var b [preambleSize]byte
		copy(b[:], m)
		binary.LittleEndian.PutUint32(b[4:], uint32(e.self))
		binary.LittleEndian.PutUint16(b[8:], uint16(i))
		binary.LittleEndian.PutUint16(b[10:], uint16(cnt))
		copy(b[12:], preambleMAC(nonce, e.self, peer, i, cnt))
		var ack [1]byte
		if _, err := c.Write(b[:]); err != nil {
			raw.Close()
			return fail(err)
		}
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			raw.Close()
			return fail(fmt.Errorf("not accepted: %v", err))
		}
		var stream net.Conn = raw
		if !useTLS && ack[0] != 1 {
			raw.Close()
			return fail(fmt.Errorf("not accepted: answer %d", ack[0]))
		}
		if useTLS {
			suite := record.Suite(ack[0])
			if suite != record.AES128GCM {
				raw.Close()
				return fail(fmt.Errorf("not accepted: answer %d (record suite not offered)", ack[0]))
			}
			sc, err := record.NewConn(raw, &cs, true, suite, &e.records)
			if err != nil {
				raw.Close()
				return fail(err)
			}
			stream = sc
		}
		raw.SetDeadline(time.Time{})
		w := newSockWriter(raw)
		if sc, ok := stream.(*record.Conn); ok && w != nil {
			sc.WriteSink(w)
		}
		links = append(links, connLink{stream, raw, w})
	}
	return links, nil
}

// tcpDesc describes a channel over links: their count, and TLS with the
// record suite, or plaintext.
func (e *Endpoint) tcpDesc(links []link) string {
	if e.opt.Plaintext {
		return fmt.Sprintf("tcp x%d plaintext", len(links))
	}
	if l, ok := links[0].(connLink); ok {
		if sc, ok := l.c.(*record.Conn); ok {
			return fmt.Sprintf("tcp x%d tls %s", len(links), sc.Suite())
		}
	}
	return fmt.Sprintf("tcp x%d tls", len(links))
}
