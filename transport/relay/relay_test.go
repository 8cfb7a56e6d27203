package relay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/mem"
	"github.com/nexar-go/nexar/transport/relay"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// mesh builds n relaying endpoints over an in-memory mesh laid out as spec.
func mesh(t testing.TB, spec topology.Spec, n int, h []transport.Handler, down []transport.DownHandler, opts relay.Options) ([]*relay.Endpoint, []transport.DataPath) {
	if opts.Linger == 0 {
		opts.Linger = 100 * time.Millisecond // the suite closes ranks one by one
	}
	g, err := topology.New(spec, n)
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]*relay.Endpoint, n)
	ih := make([]transport.Handler, n)
	id := make([]transport.DownHandler, n)
	for i := range rs {
		var hi transport.Handler
		var di transport.DownHandler
		if i < len(h) {
			hi = h[i]
		}
		if i < len(down) {
			di = down[i]
		}
		rs[i] = relay.New(g, i, hi, di, opts)
		ih[i], id[i] = rs[i].Handler(), rs[i].DownHandler()
	}
	inner := mem.NewMesh(n, ih, id)
	out := make([]transport.DataPath, n)
	for i := range rs {
		rs[i].Start(&neighboursOnly{DataPath: inner[i], g: g, t: t})
		out[i] = rs[i]
	}
	return rs, inner
}

// neighboursOnly fails the test on a send to a rank that is not a
// neighbour: the relay must never use the inner path for one.
type neighboursOnly struct {
	transport.DataPath
	g *topology.Graph
	t testing.TB
}

func (n *neighboursOnly) Send(ctx context.Context, peer int, lane transport.Lane, h *transport.Header, p []byte) error {
	if peer != n.Rank() && !n.g.IsNeighbor(n.Rank(), peer) {
		n.t.Errorf("rank %d sent to non-neighbour %d on the inner path", n.Rank(), peer)
	}
	return n.DataPath.Send(ctx, peer, lane, h, p)
}

// closeAll closes the endpoints at once, as the ranks of a job do: one
// that closes alone lingers (Options.Linger) relaying for the others.
func closeAll(rs []*relay.Endpoint) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() { r.Close() })
	}
	wg.Wait()
}

var sparse = []topology.Spec{{Kind: topology.Hypercube}, {Kind: topology.KRegular, N: 2}}

func TestConformance(t *testing.T) {
	for _, spec := range sparse {
		t.Run(spec.String(), func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
				rs, _ := mesh(t, spec, n, h, down, relay.Options{})
				out := make([]transport.Endpoint, n)
				for i := range rs {
					out[i] = rs[i]
				}
				return out
			})
		})
	}
}

func TestDataPath(t *testing.T) {
	for _, spec := range sparse {
		t.Run(spec.String(), func(t *testing.T) {
			transporttest.RunDataPath(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath {
				rs, _ := mesh(t, spec, n, h, down, relay.Options{})
				out := make([]transport.DataPath, n)
				for i := range rs {
					out[i] = rs[i]
				}
				return out
			})
		})
	}
}

type got struct {
	from int
	lane transport.Lane
	seq  uint64
	p    []byte
}

type sink struct {
	mu   sync.Mutex
	msgs [][]got
	lost [][2]int
}

func newSink(n int) *sink { return &sink{msgs: make([][]got, n)} }

func (s *sink) handlers() []transport.Handler {
	hs := make([]transport.Handler, len(s.msgs))
	for i := range hs {
		hs[i] = func(from int, lane transport.Lane, h *transport.Header, p []byte) {
			s.mu.Lock()
			s.msgs[i] = append(s.msgs[i], got{from, lane, binary.LittleEndian.Uint64(h[8:]), p})
			s.mu.Unlock()
		}
	}
	return hs
}

func (s *sink) count(to int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs[to])
}

func hdr(from, seq int) *transport.Header {
	var h transport.Header
	h[0] = 1
	binary.LittleEndian.PutUint32(h[4:], uint32(from))
	binary.LittleEndian.PutUint64(h[8:], uint64(seq))
	return &h
}

func body(from, to, seq, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(from*7 + to*13 + seq + i)
	}
	return p
}

// Every pair of a ring (kregular:2, up to 4 hops) and a hypercube talks,
// in order per (source, lane), with messages cut into several fragments.
func TestAllPairsOrderAndFragments(t *testing.T) {
	for _, spec := range []topology.Spec{{Kind: topology.KRegular, N: 2}, {Kind: topology.Hypercube}} {
		for _, n := range []int{5, 8, 11} {
			s := newSink(n)
			rs, _ := mesh(t, spec, n, s.handlers(), nil, relay.Options{FragmentSize: 100})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			const k = 12
			var wg sync.WaitGroup
			for i := range rs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for seq := range k {
						for to := range n {
							for _, lane := range []transport.Lane{transport.LaneData, transport.LaneControl} {
								if err := rs[i].Send(ctx, to, lane, hdr(i, seq), body(i, to, seq, seq*37)); err != nil {
									t.Errorf("%s n=%d: %d->%d: %v", spec, n, i, to, err)
									return
								}
							}
						}
					}
				}()
			}
			wg.Wait()
			for to := range n {
				for s.count(to) < 2*k*n && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				next := map[[2]int]uint64{}
				s.mu.Lock()
				for _, m := range s.msgs[to] {
					key := [2]int{m.from, int(m.lane)}
					if m.seq != next[key] || !bytes.Equal(m.p, body(m.from, to, int(m.seq), int(m.seq)*37)) {
						t.Fatalf("%s n=%d: at %d from %d on %v: seq %d (want %d) or payload wrong", spec, n, to, m.from, m.lane, m.seq, next[key])
					}
					next[key]++
				}
				if len(s.msgs[to]) != 2*k*n {
					t.Fatalf("%s n=%d: rank %d got %d messages, want %d", spec, n, to, len(s.msgs[to]), 2*k*n)
				}
				s.mu.Unlock()
			}
			var fwd int64
			for _, r := range rs {
				fwd += r.Stats().ForwardedBytes
			}
			if fwd == 0 {
				t.Fatalf("%s n=%d: nothing was relayed", spec, n)
			}
			closeAll(rs)
			cancel()
		}
	}
}

// A relay killed while a stream crosses it: the destination never sees a
// message twice or out of order, and whatever it misses is reported as lost
// through the dead relay; the stream continues on another route.
func TestRelayKilled(t *testing.T) {
	const n, k = 8, 400
	spec := topology.Spec{Kind: topology.KRegular, N: 4} // 0 reaches 4 via 2 (or 6)
	s := newSink(n)
	var lmu sync.Mutex
	var lost [][2]int
	opts := relay.Options{Lost: func(src, via int) {
		lmu.Lock()
		lost = append(lost, [2]int{src, via})
		lmu.Unlock()
	}}
	rs, inner := mesh(t, spec, n, s.handlers(), nil, opts)
	defer closeAll(rs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	via := rs[0].Graph()
	path, _ := via.Route(0, 4, nil)
	relayRank := path[0]
	for seq := range k {
		if seq == k/4 {
			mem.Kill(inner[relayRank])
			rs[relayRank].Abandon(0, nil) // its own view ends too
		}
		if err := rs[0].Send(ctx, 4, transport.LaneData, hdr(0, seq), body(0, 4, seq, 64)); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		last := len(s.msgs[4]) > 0 && s.msgs[4][len(s.msgs[4])-1].seq == k-1
		s.mu.Unlock()
		if last {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := -1
	for _, m := range s.msgs[4] {
		if int(m.seq) <= prev || !bytes.Equal(m.p, body(0, 4, int(m.seq), 64)) {
			t.Fatalf("seq %d after %d: duplicate, out of order or corrupt", m.seq, prev)
		}
		prev = int(m.seq)
	}
	if prev != k-1 {
		t.Fatalf("stream did not continue past the dead relay %d: last seq %d", relayRank, prev)
	}
	lmu.Lock()
	defer lmu.Unlock()
	missing := len(s.msgs[4]) < k
	if missing && len(lost) == 0 {
		t.Fatalf("%d of %d delivered and no loss reported", len(s.msgs[4]), k)
	}
	for _, l := range lost {
		if l[0] != 0 || l[1] != relayRank {
			t.Fatalf("loss reported as (src %d, via %d), want (0, %d)", l[0], l[1], relayRank)
		}
	}
	t.Logf("relay %d killed: %d of %d delivered, losses reported %v", relayRank, len(s.msgs[4]), k, lost)
}

// A broadcast reaches each recipient once, from its source, with its
// payload, in the order its source sent; non-recipients forward it and get
// nothing; with ranks killed on the tree, the frames go around them.
func TestBroadcast(t *testing.T) {
	for _, spec := range []topology.Spec{{Kind: topology.KRegular, N: 2}, {Kind: topology.KRegular, N: 4}, {Kind: topology.Hypercube}} {
		for _, n := range []int{5, 16, 29} {
			for _, kill := range []bool{false, true} {
				s := newSink(n)
				rs, inner := mesh(t, spec, n, s.handlers(), nil, relay.Options{})
				g := rs[0].Graph()
				dead := -1
				if kill {
					// A rank in the middle of trees: every rank knows it
					// died (core's failure gossip tells them), and routes
					// and trees go around it.
					dead = g.Neighbors(0)[len(g.Neighbors(0))-1]
					mem.Kill(inner[dead])
					for p := range rs {
						rs[p].Abandon(dead, nil)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				want := make([]int, n) // messages each rank should get
				const k = 3
				for src := range n {
					if src == dead {
						continue
					}
					var to []int
					for r := range n {
						// Every other non-neighbour, so that some ranks only forward.
						if r != src && r != dead && !g.IsNeighbor(src, r) && (r+src)%2 == 0 {
							to = append(to, r)
							want[r] += k
						}
					}
					for seq := range k {
						if err := rs[src].Broadcast(ctx, transport.LaneControl, hdr(src, seq), body(src, 0, seq, 10+seq), to); err != nil {
							t.Fatalf("%s n=%d: broadcast from %d: %v", spec, n, src, err)
						}
					}
				}
				for r := range n {
					for s.count(r) < want[r] && ctx.Err() == nil {
						time.Sleep(5 * time.Millisecond)
					}
				}
				time.Sleep(20 * time.Millisecond) // nothing more may come
				s.mu.Lock()
				for r := range n {
					next := map[int]uint64{}
					for _, m := range s.msgs[r] {
						if m.seq != next[m.from] || !bytes.Equal(m.p, body(m.from, 0, int(m.seq), 10+int(m.seq))) || m.lane != transport.LaneControl {
							t.Fatalf("%s n=%d kill=%v: rank %d from %d: seq %d (want %d) or payload or lane wrong", spec, n, kill, r, m.from, m.seq, next[m.from])
						}
						next[m.from]++
					}
					if len(s.msgs[r]) != want[r] {
						t.Fatalf("%s n=%d kill=%v: rank %d got %d broadcast messages, want %d", spec, n, kill, r, len(s.msgs[r]), want[r])
					}
				}
				s.mu.Unlock()
				closeAll(rs)
				cancel()
			}
		}
	}
}

// A rank that closes while others still talk through it keeps relaying
// (Options.Linger) until every other rank said goodbye, then leaves at
// once: messages sent through it after its Close began all arrive.
func TestCloseLingers(t *testing.T) {
	const n = 6
	spec := topology.Spec{Kind: topology.KRegular, N: 2} // 2 reaches 4 through 3
	s := newSink(n)
	rs, _ := mesh(t, spec, n, s.handlers(), nil, relay.Options{Linger: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if h, _ := rs[2].Graph().NextHop(2, 4, nil); h != 3 {
		t.Fatalf("2's route to 4 goes through %d, want 3", h)
	}
	closed := make(chan time.Duration, 1)
	start := time.Now()
	go func() { rs[3].Close(); closed <- time.Since(start) }()
	time.Sleep(100 * time.Millisecond) // rank 3 is closing
	const k = 50
	for seq := range k {
		if err := rs[2].Send(ctx, 4, transport.LaneData, hdr(2, seq), body(2, 4, seq, 100)); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
	}
	for s.count(4) < k && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if got := s.count(4); got != k {
		t.Fatalf("rank 4 got %d of %d messages relayed by the closing rank 3", got, k)
	}
	select {
	case d := <-closed:
		t.Fatalf("rank 3's Close returned after %v, before the others said goodbye", d)
	default:
	}
	var wg sync.WaitGroup
	for r, e := range rs {
		if r != 3 {
			wg.Go(func() { e.Close() })
		}
	}
	wg.Wait()
	select {
	case d := <-closed:
		if d > 20*time.Second {
			t.Fatalf("rank 3's Close took %v: it waited for its linger, not for the goodbyes", d)
		}
	case <-ctx.Done():
		t.Fatal("rank 3's Close did not return once every rank had said goodbye")
	}
}
