package bulk

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/internal/race"
	"github.com/nexar-go/nexar/transport"
	nquic "github.com/nexar-go/nexar/transport/quic"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// mesh builds n composite endpoints over real QUIC on loopback.
func mesh(t testing.TB, n int, opt Options, h []transport.Handler, down []transport.DownHandler) []*Endpoint {
	t.Helper()
	return meshWith(t, n, opt, h, down, nil)
}

// meshWith is mesh with a hook run on each endpoint between New and Start.
func meshWith(t testing.TB, n int, opt Options, h []transport.Handler, down []transport.DownHandler, before func(int, *Endpoint)) []*Endpoint {
	t.Helper()
	nodes := make([]*nquic.Node, n)
	peers := make([]nquic.Peer, n)
	ids := make([]*nquic.Identity, n)
	fps := make([][32]byte, n)
	for i := range nodes {
		id, err := nquic.NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		nd, err := nquic.Listen(id, nquic.Options{BindAddr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i], ids[i], fps[i] = nd, id, id.Fingerprint
		peers[i] = nquic.Peer{Rank: i, Addr: nd.Addr().String(), Fingerprint: id.Fingerprint}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	eps := make([]*Endpoint, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		var hi transport.Handler
		var di transport.DownHandler
		if i < len(h) {
			hi = h[i]
		}
		if i < len(down) {
			di = down[i]
		}
		o := opt
		o.Identity, o.Fingerprints, o.BindHost, o.AdvertiseHost = ids[i], fps, "127.0.0.1", "127.0.0.1"
		wg.Go(func() {
			e, err := New(i, n, o, hi, di)
			if err != nil {
				errs[i] = err
				return
			}
			eps[i] = e
			if before != nil {
				before(i, e)
			}
			inner, err := nodes[i].Connect(ctx, i, peers, e.Handler(), e.DownHandler())
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = e.Start(ctx, inner)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, e := range eps {
				if e != nil {
					e.Close()
				}
			}
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	return eps
}

var modes = []struct {
	name string
	opt  Options
	path string
}{
	// Rings made by the first message of each pair (the others are made
	// up front by waitPaths).
	{"shm", Options{Mode: ModeSHM, RingSize: 1 << 20}, "shm"},
	// Every payload of 1 KiB or more copied out of the sender's memory.
	{"shm-remote", Options{Mode: ModeSHM, RingSize: 1 << 20, RemoteMin: 1 << 10}, "shm 1 MiB ring, cross-memory attach from 1 KiB"},
	{"shm-copy", Options{Mode: ModeSHM, RingSize: 1 << 20, RemoteMin: -1}, "shm 1 MiB ring"},
	{"tcp-tls", Options{Mode: ModeTCP}, "tcp x2 tls"},
	{"tcp-plain", Options{Mode: ModeTCP, Conns: 3, Plaintext: true}, "tcp x3 plaintext"},
}

// waitPaths waits until every endpoint's path to every peer starts with
// want (cross-memory attach is agreed a moment after Start returns). Unless
// want is just "shm", it first has each pair make the rings that would
// otherwise wait for its first message.
func waitPaths(t testing.TB, eps []*Endpoint, want string) {
	t.Helper()
	if want != "shm" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i, e := range eps {
			for r := range eps {
				if r != i && e.lazy[r].Load() {
					if err := e.connect(ctx, r); err != nil {
						t.Fatalf("rank %d: ring to %d: %v", i, r, err)
					}
				}
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		bad := ""
		for i, e := range eps {
			for r, p := range e.Paths() {
				if r != i && !strings.HasPrefix(p, want) {
					bad = fmt.Sprintf("rank %d: path to %d is %q, want %q", i, r, p, want)
				}
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConformance(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
				eps := mesh(t, n, m.opt, h, down)
				waitPaths(t, eps, m.path)
				if m.opt.RemoteMin < 0 {
					for i, e := range eps {
						for r, p := range e.Paths() {
							if strings.Contains(p, "cross-memory") {
								t.Fatalf("rank %d: path to %d is %q with cross-memory attach turned off", i, r, p)
							}
						}
					}
				}
				out := make([]transport.Endpoint, n)
				for i, e := range eps {
					out[i] = e
				}
				return out
			})
		})
	}
}

func TestDataPath(t *testing.T) {
	all := append(modes[:len(modes):len(modes)], struct {
		name string
		opt  Options
		path string
	}{"off", Options{Mode: ModeOff}, "quic"})
	for _, m := range all {
		t.Run(m.name, func(t *testing.T) {
			transporttest.RunDataPath(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath {
				eps := mesh(t, n, m.opt, h, down)
				out := make([]transport.DataPath, n)
				for i, e := range eps {
					out[i] = e
				}
				return out
			})
		})
	}
}

// TestLarge streams 256 MiB (32 MiB under -short or -race) through each
// path in MaxPayload messages and checks every byte.
func TestLarge(t *testing.T) {
	total := 256 << 20
	if testing.Short() || race.Enabled {
		total = 32 << 20
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			msg := min(total, transport.MaxPayload)
			src := make([]byte, msg)
			rand.NewChaCha8([32]byte{7}).Read(src)
			got := make(chan []byte, 4)
			h := []transport.Handler{nil, func(_ int, lane transport.Lane, _ *transport.Header, p []byte) {
				if lane == transport.LaneData {
					got <- p
				}
			}}
			eps := mesh(t, 2, m.opt, h, nil)
			defer eps[1].Close()
			defer eps[0].Close()
			errc := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				for off := 0; off < total; off += msg {
					if err := eps[0].Send(ctx, 1, transport.LaneData, nil, src); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			start := time.Now()
			for off := 0; off < total; off += msg {
				select {
				case p := <-got:
					if !bytes.Equal(p, src) {
						t.Fatalf("message at %d corrupted", off)
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("timeout after %d bytes", off)
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d MiB in %v (%.2f GB/s, in-process)", m.name, total>>20, time.Since(start), float64(total)/time.Since(start).Seconds()/1e9)
		})
	}
}

// TestUnauthorisedTCP: connections that do not present a valid preamble
// (or no TLS client certificate) are dropped and deliver nothing.
func TestUnauthorisedTCP(t *testing.T) {
	for _, plain := range []bool{false, true} {
		opt := Options{Mode: ModeTCP, Plaintext: plain}
		delivered := make(chan struct{}, 1)
		h := []transport.Handler{func(_ int, lane transport.Lane, _ *transport.Header, _ []byte) {
			if lane == transport.LaneData {
				delivered <- struct{}{}
			}
		}}
		eps := mesh(t, 2, opt, h, nil)
		eps[0].mu.Lock()
		addr := eps[0].ln.Addr().String()
		eps[0].mu.Unlock()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var conn net.Conn = c
		if !plain {
			// A stranger's certificate is refused in the handshake.
			id, _ := nquic.NewIdentity()
			tc := tls.Client(c, nquic.ClientTLSConfig(id, func([32]byte) error { return nil }))
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err == nil {
				_, err = tc.Read(make([]byte, 1))
				if err == nil {
					t.Fatalf("TLS with a stranger's certificate was accepted")
				}
			}
			conn = tc
		} else {
			// Right shape, wrong MAC: claims to be rank 1.
			b := make([]byte, preambleSize)
			copy(b, "NXB1")
			b[4] = 1
			b[10] = 2
			c.Write(b)
			c.SetReadDeadline(time.Now().Add(authTimeout + 5*time.Second))
			if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
				t.Fatalf("forged preamble: read %d bytes, err %v; want the connection dropped", n, err)
			}
			lp := make([]byte, 100)
			c.Write(lp)
		}
		conn.Close()
		select {
		case <-delivered:
			t.Fatalf("plaintext=%v: data delivered from an unauthorised connection", plain)
		case <-time.After(100 * time.Millisecond):
		}
		eps[0].Close()
		eps[1].Close()
	}
}

// TestPeerKilledMidTransfer: when the receiver goes away during a large
// transfer, the sender's Send fails with PeerDownError and its down handler
// fires, within a bound.
func TestPeerKilledMidTransfer(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			downs := make(chan error, 4)
			started := make(chan struct{})
			var once sync.Once
			h := []transport.Handler{nil, func(_ int, lane transport.Lane, _ *transport.Header, _ []byte) {
				once.Do(func() { close(started) })
				time.Sleep(50 * time.Millisecond) // slow receiver keeps the channel full
			}}
			dh := []transport.DownHandler{func(peer int, err error) { downs <- err }, nil}
			eps := mesh(t, 2, m.opt, h, dh)
			defer eps[0].Close()
			errc := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				buf := make([]byte, 4<<20)
				for {
					if err := eps[0].Send(ctx, 1, transport.LaneData, nil, buf); err != nil {
						errc <- err
						return
					}
				}
			}()
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("nothing delivered")
			}
			go eps[1].Close()
			select {
			case err := <-errc:
				var pd *transport.PeerDownError
				if !errors.As(err, &pd) && !errors.Is(err, transport.ErrClosed) {
					t.Fatalf("Send to a killed peer: %v, want PeerDownError", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Send hung after the peer was killed")
			}
			select {
			case err := <-downs:
				var pd *transport.PeerDownError
				if !errors.As(err, &pd) || pd.Peer != 1 {
					t.Fatalf("down: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("peer down not reported")
			}
		})
	}
}

func TestStripes(t *testing.T) {
	tests := []struct{ n, k, parts int }{
		{0, 4, 1}, {100, 4, 1}, {2*stripeMin - 1, 4, 1}, {2 * stripeMin, 4, 2},
		{64 << 20, 4, 4}, {64 << 20, 1, 1}, {3*stripeMin + 5, 8, 3},
	}
	for _, tc := range tests {
		parts, per := stripes(tc.n, tc.k)
		if parts != tc.parts {
			t.Errorf("stripes(%d, %d) = %d parts, want %d", tc.n, tc.k, parts, tc.parts)
		}
		p := make([]byte, tc.n)
		sum := 0
		for i := range parts {
			sum += len(part(p, i, per))
		}
		if sum != tc.n {
			t.Errorf("stripes(%d, %d): parts cover %d bytes", tc.n, tc.k, sum)
		}
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeAuto, "auto": ModeAuto, "off": ModeOff, "TCP": ModeTCP, "shm": ModeSHM, "rdma": ModeRDMA} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseMode("ib"); err == nil {
		t.Errorf("ParseMode(ib) succeeded")
	}
}

// TestRingBudget: rings are made on a pair's first message, sized for the
// local peers within the budget, and a direction whose ring no longer fits
// goes over the inner endpoint, delivering the same data.
func TestRingBudget(t *testing.T) {
	const n = 3
	got := make(chan string, 16)
	h := make([]transport.Handler, n)
	for i := range h {
		h[i] = func(from int, lane transport.Lane, _ *transport.Header, p []byte) {
			if lane == transport.LaneData {
				got <- fmt.Sprintf("%d->%d %s", from, i, p)
			}
		}
	}
	// Room for one 64 KiB ring per process: rank 0's second sender falls
	// back to QUIC.
	eps := mesh(t, n, Options{Mode: ModeSHM, RingSize: 1 << 20, RingBudget: 64 << 10}, h, nil)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	for i, e := range eps {
		if e.LocalPeers() != n-1 {
			t.Fatalf("rank %d: %d local peers, want %d", i, e.LocalPeers(), n-1)
		}
		for r, p := range e.Paths() {
			if r != i && p != "shm ring on first use" {
				t.Fatalf("rank %d: path to %d is %q before any message", i, r, p)
			}
		}
		e.mu.Lock()
		made := e.ringBytes != 0 || len(e.rings) != 0
		e.mu.Unlock()
		if made {
			t.Fatalf("rank %d made rings before any message", i)
		}
		for r := range n {
			if r != i && !e.DataUnused(r) {
				t.Fatalf("rank %d: DataUnused(%d) is false before any message", i, r)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, from := range []int{1, 2} {
		if err := eps[from].Send(ctx, 0, transport.LaneData, nil, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if want := fmt.Sprintf("%d->0 hi", from); m != want {
				t.Fatalf("got %q, want %q", m, want)
			}
		case <-ctx.Done():
			t.Fatalf("no message from rank %d", from)
		}
	}
	p1, p2 := eps[1].Paths()[0], eps[2].Paths()[0]
	if !strings.HasPrefix(p1, "shm 64 KiB ring") || p2 != "quic" {
		t.Fatalf("paths to rank 0: %q from rank 1, %q from rank 2; want a 64 KiB ring, then quic (budget spent)", p1, p2)
	}
	eps[0].mu.Lock()
	charged := eps[0].ringBytes
	eps[0].mu.Unlock()
	if charged != 64<<10 {
		t.Fatalf("rank 0 charged %d bytes of rings, want %d", charged, 64<<10)
	}
	if p := eps[1].Paths()[2]; p != "shm ring on first use" {
		t.Fatalf("rank 1's unused path to rank 2 is %q", p)
	}
	// Used (by a ring, or by QUIC once the budget was spent) or not.
	for _, c := range []struct {
		from, to int
		unused   bool
	}{{1, 0, false}, {2, 0, false}, {1, 2, true}, {2, 1, true}, {1, 1, false}, {1, -1, false}} {
		if got := eps[c.from].DataUnused(c.to); got != c.unused {
			t.Errorf("rank %d: DataUnused(%d) = %v, want %v", c.from, c.to, got, c.unused)
		}
	}
}
