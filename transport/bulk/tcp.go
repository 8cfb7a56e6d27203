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

	nquic "github.com/nexar-go/nexar/transport/quic"
)

// TCP connection preamble, sent by the dialer (inside TLS unless plaintext):
//
//	0  4  magic "NXB1" (data channel) or "NXR1" (RPC channel, rpcchan.go)
//	4  4  dialer rank, u32 LE
//	8  2  connection index, u16 LE
//	10 2  connection count, u16 LE
//	12 32 HMAC-SHA256(nonce, "nexar-bulk/1" ‖ dialer u32 ‖ acceptor u32 ‖ index u16 ‖ count u16)
//
// The acceptor answers one byte, 1, once it has checked the preamble.
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
	stop := context.AfterFunc(e.ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c := raw
	var fp [32]byte
	if !e.opt.Plaintext {
		tc := tls.Server(raw, nquic.ServerTLSConfig(e.opt.Identity, e.knownPeer))
		if err := tc.Handshake(); err != nil {
			e.log.Debug("nexar: bulk: refused TCP connection", "rank", e.self, "remote", raw.RemoteAddr().String(), "err", err)
			return
		}
		fp = sha256.Sum256(tc.ConnectionState().PeerCertificates[0].Raw)
		c = tc
	}
	var b [preambleSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || (string(b[:4]) != "NXB1" && string(b[:4]) != rpcMagic) {
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
	forRPC := string(b[:4]) == rpcMagic
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
	off.conns[idx] = c
	off.raws[idx] = raw
	off.got++
	complete := off.got == len(off.conns)
	if complete {
		delete(offers, from) // the nonce is single use
	}
	mu.Unlock()
	ok = true
	if _, err := c.Write([]byte{1}); err != nil {
		return // the dialer sees the failure and falls back; the offer is spent
	}
	raw.SetDeadline(time.Time{})
	if complete && forRPC {
		e.rpcAccepted(from, c, raw)
	} else if complete {
		links := make([]link, len(off.conns))
		raws := off.raws
		for i, cc := range off.conns {
			links[i] = connLink{cc, raws[i]}
		}
		e.startReader(from, newChannel(from, e.tcpDesc(len(links)), links))
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

// dialTCP opens the connections of an offer from peer and waits for each
// to be accepted.
func (e *Endpoint) dialTCP(ctx context.Context, peer int, addr string, nonce []byte, cnt int, useTLS bool) ([]link, error) {
	return e.dialTCPMagic(ctx, peer, addr, nonce, cnt, useTLS, "NXB1")
}

// dialTCPMagic is dialTCP with the preamble's magic: "NXB1" for data,
// rpcMagic for the RPC channel.
func (e *Endpoint) dialTCPMagic(ctx context.Context, peer int, addr string, nonce []byte, cnt int, useTLS bool, magic string) ([]link, error) {
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
		var d net.Dialer
		raw, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fail(err)
		}
		dl, _ := ctx.Deadline()
		raw.SetDeadline(dl)
		c := raw
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
			c = tc
		}
		var b [preambleSize]byte
		copy(b[:], magic)
		binary.LittleEndian.PutUint32(b[4:], uint32(e.self))
		binary.LittleEndian.PutUint16(b[8:], uint16(i))
		binary.LittleEndian.PutUint16(b[10:], uint16(cnt))
		copy(b[12:], preambleMAC(nonce, e.self, peer, i, cnt))
		var ack [1]byte
		if _, err := c.Write(b[:]); err != nil {
			c.Close()
			return fail(err)
		}
		if _, err := io.ReadFull(c, ack[:]); err != nil || ack[0] != 1 {
			c.Close()
			return fail(fmt.Errorf("not accepted: %v", err))
		}
		raw.SetDeadline(time.Time{})
		links = append(links, connLink{c, raw})
	}
	return links, nil
}

func (e *Endpoint) tcpDesc(n int) string {
	if e.opt.Plaintext {
		return fmt.Sprintf("tcp x%d plaintext", n)
	}
	return fmt.Sprintf("tcp x%d tls", n)
}
