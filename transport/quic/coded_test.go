package quictransport

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// TestConformanceCoded runs the transport contract with every striped
// message coded as on a lossy link (parity parts, done notices).
func TestConformanceCoded(t *testing.T) {
	transporttest.Run(t, meshWith(Options{DataConns: 5, lossyAlways: true}))
}

// close stops the proxy now, so that a goroutine count can follow.
func (p *lossyProxy) close() {
	p.ln.Close()
	p.up.Close()
	p.wg.Wait()
}

// codedPair connects two ranks with 8 connections, rank 0 dialling
// through a proxy that drops loss of the datagrams and delays the rest
// 5 ms, every striped message coded. Rank 1's handler counts LaneData
// messages on got; down reports each rank's DownHandler.
func codedPair(t *testing.T, loss float64) (eps []transport.Endpoint, nodes []*Node, px *lossyProxy, got chan []byte, down [2]chan error) {
	nodes, peers := listenN(t, 2, Options{DataConns: 8, IdleTimeout: 2 * time.Second, lossyAlways: true})
	px = newLossyProxy(t, nodes[1].Addr().(*net.UDPAddr), loss, 5*time.Millisecond, 11)
	peers[1].Addr = px.ln.LocalAddr().String()
	got = make(chan []byte, 64)
	down = [2]chan error{make(chan error, 1), make(chan error, 1)}
	h := func(from int, lane transport.Lane, _ *transport.Header, p []byte) {
		if lane == transport.LaneData {
			got <- p
		}
	}
	d := func(self int) transport.DownHandler {
		return func(peer int, err error) { down[self] <- err }
	}
	eps = connectAll(t, nodes, peers, []transport.Handler{nil, h}, []transport.DownHandler{d(0), d(1)})
	return eps, nodes, px, got, down
}

// sendLoop sends msg from rank 0 to rank 1 until a Send fails, and returns
// that error on the channel.
func sendLoop(ep transport.Endpoint, msg []byte) chan error {
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			if err := ep.Send(ctx, 1, transport.LaneData, nil, msg); err != nil {
				errc <- err
				return
			}
		}
	}()
	return errc
}

// TestCodedFaults: a peer that dies while coded messages to it are under
// way, a data connection that closes while parity is in flight, and Close
// during a coded Send each end the Send with an error naming the peer (or
// ErrClosed) in bounded time, and leave no goroutine behind.
func TestCodedFaults(t *testing.T) {
	msg := make([]byte, 4<<20)
	crand.Read(msg)
	for _, c := range []struct {
		name  string
		fault func(t *testing.T, eps []transport.Endpoint, nodes []*Node)
		want  func(error) bool
	}{
		{"peer dies", func(t *testing.T, eps []transport.Endpoint, nodes []*Node) {
			// Rank 1 stops answering at all: its socket is gone.
			nodes[1].udp.Close()
		}, isPeerDown(1)},
		{"data connection closes", func(t *testing.T, eps []transport.Endpoint, nodes []*Node) {
			eps[0].(*endpoint).conns[1].stripes[4].conn.CloseWithError(99, "test")
		}, isPeerDown(1)},
		{"Close", func(t *testing.T, eps []transport.Endpoint, nodes []*Node) {
			eps[0].Close()
		}, func(err error) bool { return errors.Is(err, transport.ErrClosed) || isPeerDown(1)(err) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			eps, nodes, px, got, _ := codedPair(t, 0.05)
			errc := sendLoop(eps[0], msg)
			// Let a few messages through, then fault mid-transfer.
			for range 3 {
				select {
				case p := <-got:
					if !bytes.Equal(p, msg) {
						t.Fatal("a coded message arrived changed")
					}
				case err := <-errc:
					t.Fatalf("send before the fault: %v", err)
				case <-time.After(20 * time.Second):
					t.Fatal("no message in 20 s")
				}
			}
			start := time.Now()
			c.fault(t, eps, nodes)
			select {
			case err := <-errc:
				t.Logf("Send failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
				if !c.want(err) {
					t.Errorf("Send: %v, want an error naming rank 1", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Send still running 10 s after the fault")
			}
			for _, ep := range eps {
				ep.Close()
			}
			px.close()
			transporttest.CheckGoroutines(t, before)
		})
	}
}

func isPeerDown(peer int) func(error) bool {
	return func(err error) bool {
		var pd *transport.PeerDownError
		return errors.As(err, &pd) && pd.Peer == peer
	}
}

// TestCodedDoneNotices: over a lossy link the receiver completes coded
// messages from their first k parts and says so: the sender sees done
// notices for them, and every message arrives intact and in order.
func TestCodedDoneNotices(t *testing.T) {
	eps, _, _, got, _ := codedPair(t, 0.05)
	defer eps[0].Close()
	defer eps[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const count = 20
	msgs := make([][]byte, count)
	for i := range msgs {
		msgs[i] = make([]byte, stripeMin+i*37<<10)
		crand.Read(msgs[i])
	}
	sent := make(chan error, 1)
	go func() {
		for i := range msgs {
			if err := eps[0].Send(ctx, 1, transport.LaneData, nil, msgs[i]); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	for i := range count {
		select {
		case p := <-got:
			if !bytes.Equal(p, msgs[i]) {
				t.Fatalf("message %d: %d bytes, not what was sent", i, len(p))
			}
		case <-ctx.Done():
			t.Fatalf("message %d: %v", i, ctx.Err())
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	pc := eps[0].(*endpoint).conns[1]
	if d, s := pc.doneSeq.Load(), pc.sentSeq.Load(); d == 0 || d > s {
		t.Errorf("done notices up to message %d of %d sent", d, s)
	}
}

// TestPartStopped: a part's stream that the receiver stops once its Write
// is done fails the Close, not with a StreamError; that still counts as a
// part the receiver did not need (a Send failed with "close called for
// canceled stream" before this was seen), and a stop for another reason
// does not.
func TestPartStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	any := func([32]byte) error { return nil }
	conf := Options{}.withDefaults().quicConfig()
	ln, err := quic.ListenAddr("127.0.0.1:0", ServerTLSConfig(id, any), conf)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := quic.DialAddr(ctx, ln.Addr().String(), ClientTLSConfig(id, any), conf)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	peer, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.CloseWithError(0, "")
	for _, code := range []quic.StreamErrorCode{codePartDone, codePartCancel} {
		s, err := conn.OpenUniStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("part")); err != nil {
			t.Fatal(err)
		}
		rs, err := peer.AcceptUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rs.CancelRead(code)
		select {
		case <-s.Context().Done():
		case <-ctx.Done():
			t.Fatal("no STOP_SENDING")
		}
		err = s.Close()
		if err == nil {
			t.Fatal("Close of a stopped stream succeeded")
		}
		var se *quic.StreamError
		t.Logf("Close: %v (a StreamError: %v)", err, errors.As(err, &se))
		if got, want := partStopped(s), code == codePartDone; got != want {
			t.Errorf("stopped with code %d, Close: %v: partStopped = %v, want %v", code, err, got, want)
		}
	}
}

// TestMalformedPartsFromPeer: what a peer sends on a data connection or as
// a datagram that breaks the part rules closes the pair, and each side is
// told why, naming the peer.
func TestMalformedPartsFromPeer(t *testing.T) {
	n := 1 << 20
	hdr := func(index int, seq uint64, parts, k int) []byte {
		var b [partHeaderSize]byte
		partHeader{index: index, seq: seq, n: n, parts: parts, k: k}.marshal(&b)
		return b[:]
	}
	size := func(k int) int { return partSize(n, k) }
	type stream struct {
		b   []byte
		fin bool
	}
	for _, c := range []struct {
		name    string
		streams []stream // on data connection 1 (part index 0)
		dgram   []byte   // on the first connection
		want    string
	}{
		{name: "garbage header", streams: []stream{{b: bytes.Repeat([]byte{0xAB}, partHeaderSize)}}, want: "part header"},
		{name: "wrong connection", streams: []stream{{b: hdr(1, 1, 2, 2)}}, want: "part 1 on data connection 1"},
		{name: "header cut", streams: []stream{{b: hdr(0, 1, 2, 2)[:7], fin: true}}, want: "inside a part header"},
		{name: "short part", streams: []stream{{b: append(hdr(0, 1, 2, 2), 1, 2, 3), fin: true}}, want: "shorter than"},
		// (3 parts, 2 data: one part does not complete the message, whose
		// done notice would name a message rank 0 never sent.)
		{name: "long coded part", streams: []stream{{b: append(hdr(0, 1, 3, 2), make([]byte, size(2)+1)...), fin: true}}, want: "longer than"},
		{name: "coded after plain", streams: []stream{{b: append(append(hdr(0, 1, 2, 2), make([]byte, size(2))...), hdr(0, 2, 2, 1)...)}}, want: "after other parts"},
		{name: "duplicate", streams: []stream{{b: hdr(0, 1, 2, 1)}, {b: hdr(0, 1, 2, 1)}}, want: "received twice"},
		{name: "split differs", streams: []stream{{b: hdr(0, 1, 2, 1)}, {b: hdr(0, 1, 2, 2)}}, want: "then as"},
		{name: "done too early", dgram: []byte{dgDone, 1, 0, 0, 0, 0, 0, 0, 0}, want: "beyond the last sent"},
		{name: "unknown datagram", dgram: []byte{9}, want: "unknown kind"},
	} {
		t.Run(c.name, func(t *testing.T) {
			downs := [2]chan error{make(chan error, 1), make(chan error, 1)}
			down := func(self int) transport.DownHandler {
				return func(peer int, err error) { downs[self] <- err }
			}
			nodes, peers := listenN(t, 2, Options{DataConns: 4})
			eps := connectAll(t, nodes, peers, nil, []transport.DownHandler{down(0), down(1)})
			defer eps[0].Close()
			defer eps[1].Close()
			pc := eps[0].(*endpoint).conns[1]
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, st := range c.streams {
				s, err := pc.stripes[0].conn.OpenUniStreamSync(ctx)
				if err != nil {
					t.Fatal(err)
				}
				s.Write(st.b)
				if st.fin {
					s.Close()
				}
			}
			if c.dgram != nil {
				pc.conn.SendDatagram(c.dgram)
			}
			// Rank 1 finds the fault and says why; rank 0 may learn of it
			// through any of the pair's connections.
			for r, want := range [][]string{{"rank 1"}, {"bad frame from rank 0", c.want}} {
				select {
				case err := <-downs[r]:
					for _, w := range want {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("rank %d: down error %q, want one with %q", r, err, w)
						}
					}
				case <-ctx.Done():
					t.Fatalf("rank %d: no down notification", r)
				}
			}
		})
	}
}
