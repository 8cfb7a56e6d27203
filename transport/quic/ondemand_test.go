package quictransport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// onDemandMesh connects n nodes on demand with room for m connections each.
func onDemandMesh(t testing.TB, n, m int, h []transport.Handler, down []transport.DownHandler) ([]*Node, []transport.Endpoint) {
	nodes, peers := listenN(t, n, Options{OnDemand: m, DialTimeout: 30 * time.Second, HandshakeTimeout: 10 * time.Second})
	return nodes, connectAll(t, nodes, peers, h, down)
}

// The conformance suite on demand, with room for every peer and every
// connection opened first (a departure is told on the connections open
// then; the suite checks that every peer hears of it).
func TestOnDemandConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
		nodes, eps := onDemandMesh(t, n, n-1, h, down)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i, nd := range nodes {
			wg.Go(func() {
				for p := range n {
					if p != i {
						if err := nd.Open(ctx, p); err != nil {
							errs[i] = err
						}
					}
				}
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: Open: %v", i, err)
			}
		}
		return eps
	})
}

// odMsg is one delivered message: sender, lane and its sequence number
// per (sender, lane).
type odMsg struct {
	from int
	lane transport.Lane
	seq  uint64
	ok   bool // the payload is the one sent with that sequence number
}

func odPayload(from, to, seq int) []byte {
	p := make([]byte, 100+seq%300)
	for i := range p {
		p[i] = byte(from*31 + to*17 + seq + i)
	}
	return p
}

// downLog collects what the DownHandlers of a mesh are told.
type downLog struct {
	mu    sync.Mutex
	downs []string
}

// handlers returns n DownHandlers that record into d.
func (d *downLog) handlers(n int) []transport.DownHandler {
	ds := make([]transport.DownHandler, n)
	for i := range ds {
		ds[i] = func(peer int, err error) {
			d.mu.Lock()
			d.downs = append(d.downs, fmt.Sprintf("rank %d: %d down: %v", i, peer, err))
			d.mu.Unlock()
		}
	}
	return ds
}

// list returns what was recorded so far.
func (d *downLog) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.downs)
}

// With room for M < N-1 connections, every pair of N ranks talks on two
// lanes, all at once: nothing is lost, duplicated or reordered per (sender,
// lane) although connections are closed and made again all the time, and
// no rank ever holds more than M.
func TestOnDemandEveryPairTalks(t *testing.T) {
	for _, tc := range []struct{ n, m, k int }{{6, 2, 40}, {9, 3, 25}, {5, 1, 20}} {
		t.Run(fmt.Sprintf("n=%d,m=%d", tc.n, tc.m), func(t *testing.T) {
			n, m, k := tc.n, tc.m, tc.k
			var mu sync.Mutex
			got := make([][]odMsg, n)
			hs := make([]transport.Handler, n)
			for i := range hs {
				hs[i] = func(from int, lane transport.Lane, h *transport.Header, p []byte) {
					seq := binary.LittleEndian.Uint64(h[8:])
					mu.Lock()
					got[i] = append(got[i], odMsg{from, lane, seq, bytes.Equal(p, odPayload(from, i, int(seq)))})
					mu.Unlock()
				}
			}
			var dl downLog
			ds := dl.handlers(n)
			nodes, eps := onDemandMesh(t, n, m, hs, ds)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, n*n)
			for i := range n {
				for to := range n {
					if to == i {
						continue
					}
					wg.Go(func() { // one sender per (pair, lane): sequence order is send order
						for _, lane := range []transport.Lane{transport.LaneData, transport.LaneControl} {
							for seq := range k {
								var h transport.Header
								binary.LittleEndian.PutUint64(h[8:], uint64(seq))
								if err := eps[i].Send(ctx, to, lane, &h, odPayload(i, to, seq)); err != nil {
									errs <- fmt.Errorf("%d->%d %v seq %d: %w", i, to, lane, seq, err)
									return
								}
							}
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			want := 2 * k * (n - 1)
			for to := range n {
				for {
					mu.Lock()
					c := len(got[to])
					mu.Unlock()
					if c >= want || ctx.Err() != nil {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			mu.Lock()
			for to := range n {
				next := map[[2]int]uint64{}
				for _, g := range got[to] {
					key := [2]int{g.from, int(g.lane)}
					if g.seq != next[key] || !g.ok {
						t.Fatalf("rank %d from %d on %v: seq %d, want %d (payload ok: %v)", to, g.from, g.lane, g.seq, next[key], g.ok)
					}
					next[key]++
				}
				if len(got[to]) != want {
					t.Fatalf("rank %d got %d messages, want %d", to, len(got[to]), want)
				}
			}
			mu.Unlock()
			for i, nd := range nodes {
				open, most := nd.OpenConns()
				if most > m || open > m {
					t.Fatalf("rank %d held %d connections at once (%d now), room for %d", i, most, open, m)
				}
				if most == 0 {
					t.Fatalf("rank %d never held a connection", i)
				}
			}
			if downs := dl.list(); len(downs) > 0 {
				t.Fatalf("connections closed to make room were reported as losses: %v", downs)
			}
			for _, ep := range eps {
				ep.Close()
			}
		})
	}
}

// A rank killed while no connection to it is open is found when a rank next
// sends to it: the send fails naming it, the DownHandler is told, and it is
// not dialled again.
func TestOnDemandDeadPeerFoundAtNextUse(t *testing.T) {
	const n = 3
	downs := make(chan [2]int, 8)
	ds := make([]transport.DownHandler, n)
	for i := range ds {
		ds[i] = func(peer int, err error) { downs <- [2]int{i, peer} }
	}
	nodes, eps := onDemandMesh(t, n, 1, make([]transport.Handler, n), ds)
	for _, nd := range nodes {
		nd.opt.DialTimeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var h transport.Header
	if err := eps[0].Send(ctx, 2, transport.LaneData, &h, []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Rank 0's one connection moves to rank 1: the one to rank 2 closes.
	if err := eps[0].Send(ctx, 1, transport.LaneData, &h, []byte("x")); err != nil {
		t.Fatal(err)
	}
	for !func() bool { _, most := nodes[0].OpenConns(); return !nodes[0].Connected(2) && most == 1 }() {
		time.Sleep(5 * time.Millisecond)
	}
	// Rank 2 dies without a word: its socket goes.
	nodes[2].closeSocket()
	start := time.Now()
	err := eps[0].Send(ctx, 2, transport.LaneData, &h, []byte("x"))
	var pd *transport.PeerDownError
	if !errors.As(err, &pd) || pd.Peer != 2 {
		t.Fatalf("send to the dead rank 2: %v, want a *PeerDownError naming it", err)
	}
	select {
	case d := <-downs:
		if d != [2]int{0, 2} {
			t.Fatalf("down %v, want rank 0 told of rank 2", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0 was not told that rank 2 is down")
	}
	t.Logf("found dead after %v: %v", time.Since(start), err)
	again := time.Now()
	if err := eps[0].Send(ctx, 2, transport.LaneData, &h, []byte("x")); !errors.As(err, &pd) || time.Since(again) > time.Second {
		t.Fatalf("second send to the dead rank: %v after %v, want a *PeerDownError at once", err, time.Since(again))
	}
	eps[0].Close()
	eps[1].Close()
}

// A Send whose connection is closed to make room after the Send chose it,
// and ends before the Send writes, goes to the pair's next connection: the
// graceful end of that connection is no failure. It was reported as "peer
// down: drained" (seen under -race on a loaded machine in
// TestOnDemandEveryPairTalks) when the Send saw the end before it took the
// lane, or, waiting for the lane, picked the end over the close (select
// picks either; so that subtest runs 20 times).
func TestOnDemandSendOutlivesItsConnection(t *testing.T) {
	for _, tc := range []struct {
		stage string
		runs  int
	}{{"chosen", 1}, {"checked", 20}} {
		t.Run(tc.stage, func(t *testing.T) {
			for range tc.runs {
				sendOutlivesItsConnection(t, tc.stage)
			}
		})
	}
}

// sendOutlivesItsConnection runs TestOnDemandSendOutlivesItsConnection
// once, the connection ending at the Send's stage.
func sendOutlivesItsConnection(t *testing.T, stage string) {
	const n = 3
	var mu sync.Mutex
	var got []string
	hs := make([]transport.Handler, n)
	hs[1] = func(from int, lane transport.Lane, h *transport.Header, p []byte) {
		mu.Lock()
		got = append(got, string(p))
		mu.Unlock()
	}
	var dl downLog
	nodes, eps := onDemandMesh(t, n, 1, hs, dl.handlers(n))
	defer func() {
		for _, ep := range eps {
			ep.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes[0].mu.Lock()
	e := nodes[0].ep
	nodes[0].mu.Unlock()
	// Armed for the second Send: at stage, on rank 0's connection to rank
	// 1, rank 0 moves its one connection to rank 2, which closes that one
	// gracefully, and the Send goes on only after it has ended.
	var armed, ended atomic.Bool
	e.picked = func(pc *peerConn, at string) {
		if at != stage || pc.rank != 1 || !armed.CompareAndSwap(true, false) {
			return
		}
		if err := nodes[0].Open(ctx, 2); err != nil {
			t.Errorf("open rank 0's connection to rank 2: %v", err)
			return
		}
		select {
		case <-pc.conn.Context().Done():
			ended.Store(true)
		case <-ctx.Done():
		}
	}
	var h transport.Header
	if err := eps[0].Send(ctx, 1, transport.LaneData, &h, []byte("first")); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if err := eps[0].Send(ctx, 1, transport.LaneData, &h, []byte("second")); err != nil {
		t.Fatalf("send after its connection was closed to make room: %v", err)
	}
	if !ended.Load() {
		t.Fatal("the chosen connection had not ended before the send went on: the test did not test")
	}
	for {
		mu.Lock()
		c := len(got)
		mu.Unlock()
		if c >= 2 || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	if fmt.Sprint(got) != "[first second]" {
		t.Errorf("rank 1 got %q, want [first second]", got)
	}
	mu.Unlock()
	if downs := dl.list(); len(downs) > 0 {
		t.Errorf("a connection closed to make room was reported as a loss: %v", downs)
	}
}
