package quictransport

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// listenN starts n nodes on loopback and returns them with their peer table.
func listenN(t testing.TB, n int, opt Options) ([]*Node, []Peer) {
	t.Helper()
	if opt.BindAddr == "" {
		opt.BindAddr = "127.0.0.1:0"
	}
	nodes := make([]*Node, n)
	peers := make([]Peer, n)
	for i := range nodes {
		id, err := NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		nd, err := Listen(id, opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
		peers[i] = Peer{Rank: i, Addr: nd.Addr().String(), Fingerprint: id.Fingerprint}
	}
	return nodes, peers
}

// connectAll runs Connect on every node concurrently.
func connectAll(t testing.TB, nodes []*Node, peers []Peer, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	eps := make([]transport.Endpoint, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		var hi transport.Handler
		var di transport.DownHandler
		if i < len(h) {
			hi = h[i]
		}
		if i < len(down) {
			di = down[i]
		}
		wg.Go(func() { eps[i], errs[i] = nd.Connect(ctx, i, peers, hi, di) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Connect: %v", i, err)
		}
	}
	return eps
}

// meshWith makes meshes of nodes with opt.
func meshWith(opt Options) transporttest.NewMesh {
	return func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
		nodes, peers := listenN(t, n, opt)
		return connectAll(t, nodes, peers, h, down)
	}
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, meshWith(Options{}))
}

// TestStrangerRefused: a node with its own fresh identity, not in anyone's
// table, can neither connect to a rank nor get a message delivered.
func TestStrangerRefused(t *testing.T) {
	var mu sync.Mutex
	var got int
	h := func(int, transport.Lane, *transport.Header, []byte) { mu.Lock(); got++; mu.Unlock() }
	nodes, peers := listenN(t, 2, Options{HandshakeTimeout: 2 * time.Second})
	eps := connectAll(t, nodes, peers, []transport.Handler{h, h}, nil)
	defer eps[0].Close()
	defer eps[1].Close()

	// The listener was closed once the mesh was complete; a stranger must
	// be refused either way. Also try against a node still accepting.
	stranger, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	target, tpeers := listenN(t, 2, Options{HandshakeTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	// Rank 1 waits for rank 0 (which never comes): it is accepting.
	connErr := make(chan error, 1)
	go func() {
		_, err := target[1].Connect(ctx, 1, tpeers, h, nil)
		connErr <- err
	}()
	time.Sleep(100 * time.Millisecond)

	for _, addr := range []string{peers[1].Addr, tpeers[1].Addr} {
		pin := ClientTLSConfig(stranger, func([32]byte) error { return nil })
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := quic.DialAddr(dctx, addr, pin, &quic.Config{HandshakeIdleTimeout: time.Second})
		if err == nil {
			// TLS 1.3 clients finish before the server checks their
			// certificate; the server must then kill the connection.
			s, serr := conn.OpenUniStreamSync(dctx)
			if serr == nil {
				s.Write([]byte("NX\x01\x00\x00\x00\x00\x00"))
				s.Write(make([]byte, transport.HeaderSize))
			}
			select {
			case <-conn.Context().Done():
			case <-dctx.Done():
				t.Errorf("%s: stranger's connection stayed open", addr)
			}
			conn.CloseWithError(0, "")
		}
		dcancel()
	}
	if err := <-connErr; err == nil {
		t.Fatalf("rank 1 completed Connect with only a stranger dialing")
	}
	mu.Lock()
	defer mu.Unlock()
	if got != 0 {
		t.Fatalf("%d messages from a stranger were delivered", got)
	}
}

// TestWrongRankInHello: a peer with a valid certificate that claims another
// rank in its hello is refused.
func TestWrongPeerTable(t *testing.T) {
	nodes, peers := listenN(t, 2, Options{})
	bad := append([]Peer(nil), peers...)
	other, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	bad[1].Fingerprint = other.Fingerprint // rank 0 pins the wrong key for 1
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var err0, err1 error
	wg.Go(func() { _, err0 = nodes[0].Connect(ctx, 0, bad, nil, nil) })
	wg.Go(func() { _, err1 = nodes[1].Connect(ctx, 1, peers, nil, nil) })
	wg.Wait()
	if err0 == nil || err1 == nil {
		t.Fatalf("Connect with a mismatched pin: got %v, %v; want errors on both ranks", err0, err1)
	}
}

// TestGarbageDatagrams: random UDP datagrams to a live node neither crash it
// nor disturb the mesh.
func TestGarbageDatagrams(t *testing.T) {
	var mu sync.Mutex
	var got int
	h := func(int, transport.Lane, *transport.Header, []byte) { mu.Lock(); got++; mu.Unlock() }
	nodes, peers := listenN(t, 2, Options{})
	eps := connectAll(t, nodes, peers, []transport.Handler{h, h}, nil)
	defer eps[0].Close()
	defer eps[1].Close()
	u, err := net.Dial("udp", peers[1].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2000 {
		b := make([]byte, 1+i%1400)
		rand.Read(b)
		if i%3 == 0 {
			b[0] |= 0xc0 // looks like a long-header (Initial) packet
		}
		u.Write(b)
		if i%100 == 0 {
			if err := eps[0].Send(ctx, 1, transport.LaneControl, nil, b); err != nil {
				t.Fatalf("Send during garbage: %v", err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := got
		mu.Unlock()
		if n == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d of 20 messages while under garbage", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	if o.BindAddr != ":0" || o.IdleTimeout != 5*time.Second || o.HandshakeTimeout != 10*time.Second ||
		o.MaxStreamWindow != 16<<20 || o.MaxConnWindow != uint64(transport.NumLanes)*16<<20 {
		t.Fatalf("defaults: %+v", o)
	}
	o = Options{MaxStreamWindow: 1 << 20, MaxConnWindow: 1}.withDefaults()
	if o.MaxConnWindow != uint64(transport.NumLanes)<<20 {
		t.Fatalf("MaxConnWindow below its minimum was kept: %d", o.MaxConnWindow)
	}
}

func TestConnectArguments(t *testing.T) {
	nodes, peers := listenN(t, 2, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	dup := []Peer{peers[0], peers[0]}
	tests := []struct {
		name  string
		self  int
		peers []Peer
	}{
		{"duplicate rank", 0, dup},
		{"self out of range", 2, peers},
		{"self fingerprint", 1, peers}, // node 0 claiming rank 1
	}
	for _, tc := range tests {
		nd, err := Listen(&Identity{Cert: nodes[0].id.Cert, Fingerprint: nodes[0].id.Fingerprint}, Options{BindAddr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nd.Connect(ctx, tc.self, tc.peers, nil, nil); err == nil {
			t.Errorf("%s: Connect succeeded", tc.name)
		}
		nd.Close()
	}
	if _, err := Listen(nil, Options{}); err == nil {
		t.Errorf("Listen(nil identity) succeeded")
	}
}

func TestHello(t *testing.T) {
	h := hello{status: 0, rank: 7, size: 9}
	got, err := parseHello(h.marshal())
	if err != nil || got != h {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, b := range [][]byte{nil, []byte("NH\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00"), []byte("XX\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00")} {
		if _, err := parseHello(b); err == nil {
			t.Errorf("parseHello(%q) succeeded", b)
		}
	}
}

func FuzzHello(f *testing.F) {
	f.Add(hello{rank: 1, size: 2}.marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err == nil && string(h.marshal()) != string(b) {
			t.Fatalf("re-encoded hello differs")
		}
	})
}

// TestMalformedFrameFromPeer: an authenticated peer that sends a bad frame
// loses its connection, and the error names it; nothing panics.
func TestMalformedFrameFromPeer(t *testing.T) {
	downs := make(chan error, 2)
	down := func(peer int, err error) { downs <- err }
	nodes, peers := listenN(t, 2, Options{})
	eps := connectAll(t, nodes, peers, nil, []transport.DownHandler{down, down})
	defer eps[0].Close()
	defer eps[1].Close()
	conn := eps[0].(*endpoint).conns[1].conn
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := conn.OpenUniStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("NX\x07\x00\x00\x00\x00\x00")) // unknown version
	s.Write(make([]byte, transport.HeaderSize))
	for range 2 {
		select {
		case err := <-downs:
			if !strings.Contains(err.Error(), "rank") {
				t.Errorf("down error does not name the peer: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("no down notification after a malformed frame")
		}
	}
	if err := eps[0].Send(ctx, 1, transport.LaneControl, nil, nil); err == nil {
		t.Fatal("Send over a connection closed for a protocol error succeeded")
	}
}

// BenchmarkQUICThroughput streams 4 MiB messages from rank 0 to rank 1 on
// LaneData over loopback.
func BenchmarkQUICThroughput(b *testing.B) {
	const size = 4 << 20
	var mu sync.Mutex
	var got int
	done := make(chan struct{}, 1)
	h := func(_ int, _ transport.Lane, _ *transport.Header, p []byte) {
		mu.Lock()
		got++
		mu.Unlock()
		done <- struct{}{}
	}
	nodes, peers := listenN(b, 2, Options{})
	eps := connectAll(b, nodes, peers, []transport.Handler{nil, h}, nil)
	defer eps[0].Close()
	defer eps[1].Close()
	msg := make([]byte, size)
	ctx := context.Background()
	b.SetBytes(size)
	b.ResetTimer()
	go func() {
		for range b.N {
			if err := eps[0].Send(ctx, 1, transport.LaneData, nil, msg); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	for range b.N {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.Fatal("timed out")
		}
	}
}

// TestLateHelloReplyRetried: a hello that misses its handshake deadline
// on one side (a process starved while 64 ranks form on 2 cores) is
// dialled again, and the mesh forms with nobody reported down. The
// acceptor's reply comes late ("reply": refused there, never
// registered), or the dialer reads it late ("read": the acceptor had
// registered the connection, and the dialer, past its deadline, still
// reads the reply that is there within a grace instead of abandoning a
// pair made on the other side, which the acceptor would report lost).
func TestLateHelloReplyRetried(t *testing.T) {
	for _, c := range []struct {
		name           string
		dialer, accept Options
		slowed         int
	}{
		{"reply", Options{HandshakeTimeout: 500 * time.Millisecond}, Options{HandshakeTimeout: 500 * time.Millisecond, slowReply: 1500 * time.Millisecond}, 1},
		{"read", Options{HandshakeTimeout: 500 * time.Millisecond, slowRead: 1500 * time.Millisecond}, Options{HandshakeTimeout: 5 * time.Second}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var downs []string
			down := func(peer int, err error) {
				mu.Lock()
				downs = append(downs, fmt.Sprintf("peer %d: %v", peer, err))
				mu.Unlock()
			}
			dialer, dp := listenN(t, 1, c.dialer)
			acceptor, ap := listenN(t, 1, c.accept)
			ap[0].Rank = 1
			nodes, peers := []*Node{dialer[0], acceptor[0]}, []Peer{dp[0], ap[0]}
			eps := connectAll(t, nodes, peers, nil, []transport.DownHandler{down, down})
			defer eps[0].Close()
			defer eps[1].Close()
			if !nodes[c.slowed].slowed.Load() {
				t.Fatalf("rank %d was never held: the test did not test", c.slowed)
			}
			time.Sleep(time.Second)
			mu.Lock()
			defer mu.Unlock()
			if len(downs) > 0 {
				t.Fatalf("a late hello was reported as a loss: %v", downs)
			}
		})
	}
}
