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
)

// fuzzRanks is the world of FuzzFrames: a ring of 8, where rank 0 reaches
// ranks 2 to 6 through relays.
const fuzzRanks = 8

var fuzzSpec = topology.Spec{Kind: topology.KRegular, N: 2}

// A fuzz input is a run of records, each one frame that rank 0's inner
// path hands its relay: [from: a neighbour, by index][lane][56 header
// bytes][payload length][payload].
func appendRecord(b []byte, fromIdx int, lane transport.Lane, h *transport.Header, p []byte) []byte {
	b = append(b, byte(fromIdx), byte(lane))
	b = append(b, h[:]...)
	b = append(b, byte(len(p)))
	return append(b, p...)
}

type record struct {
	fromIdx int
	lane    transport.Lane
	h       transport.Header
	p       []byte
}

func parseRecords(b []byte) []record {
	var out []record
	for len(b) >= 2+transport.HeaderSize+1 {
		r := record{fromIdx: int(b[0]), lane: transport.Lane(b[1]) % transport.NumLanes}
		copy(r.h[:], b[2:])
		n := int(b[2+transport.HeaderSize])
		b = b[3+transport.HeaderSize:]
		n = min(n, len(b))
		r.p, b = b[:n], b[n:]
		out = append(out, r)
	}
	return out
}

// fuzzMesh builds the fuzz world's relays over an in-memory mesh; tap, when
// set, sees every frame rank 0's inner path delivers.
func fuzzMesh(t testing.TB, h []transport.Handler, opts relay.Options, tap transport.Handler) ([]*relay.Endpoint, *topology.Graph) {
	g, err := topology.New(fuzzSpec, fuzzRanks)
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]*relay.Endpoint, fuzzRanks)
	ih := make([]transport.Handler, fuzzRanks)
	id := make([]transport.DownHandler, fuzzRanks)
	for i := range rs {
		rs[i] = relay.New(g, i, h[i], nil, opts)
		ih[i], id[i] = rs[i].Handler(), rs[i].DownHandler()
	}
	if tap != nil {
		inner0 := ih[0]
		ih[0] = func(from int, lane transport.Lane, hd *transport.Header, p []byte) {
			tap(from, lane, hd, p)
			inner0(from, lane, hd, p)
		}
	}
	inner := mem.NewMesh(fuzzRanks, ih, id)
	for i := range rs {
		rs[i].Start(inner[i])
	}
	return rs, g
}

// closeWithin closes the relays at once and fails if that takes long: a
// frame must not leave a relay unable to close.
func closeWithin(t testing.TB, rs []*relay.Endpoint, d time.Duration) {
	done := make(chan struct{})
	go func() {
		closeAll(rs)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("the relays did not close within %v", d)
	}
}

// fuzzSeeds records the relay frames that reach rank 0 while the others
// send it relayed messages in fragments, broadcast and say goodbye.
func fuzzSeeds(f *testing.F) [][]byte {
	var mu sync.Mutex
	var recs [][]byte
	g, _ := topology.New(fuzzSpec, fuzzRanks)
	nb := g.Neighbors(0)
	tap := func(from int, lane transport.Lane, h *transport.Header, p []byte) {
		if h == nil || h[0] < transport.OwnerTransport || len(p) > 255 {
			return
		}
		idx := bytes.IndexByte([]byte{byte(nb[0]), byte(nb[len(nb)-1])}, byte(from))
		mu.Lock()
		recs = append(recs, appendRecord(nil, max(idx, 0), lane, h, p))
		mu.Unlock()
	}
	hs := make([]transport.Handler, fuzzRanks)
	rs, _ := fuzzMesh(f, hs, relay.Options{FragmentSize: 64, Linger: time.Millisecond}, tap)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var h transport.Header
	h[0], h[8] = 1, 42
	for _, src := range []int{3, 4} {
		if err := rs[src].Send(ctx, 0, transport.LaneData, &h, bytes.Repeat([]byte{byte(src)}, 150)); err != nil {
			f.Fatal(err)
		}
		if err := rs[src].Send(ctx, 0, transport.LaneControl, &h, []byte("small")); err != nil {
			f.Fatal(err)
		}
	}
	if err := rs[4].Broadcast(ctx, transport.LaneControl, &h, []byte("cast"), []int{0, 1, 2, 6}); err != nil {
		f.Fatal(err)
	}
	closeWithin(f, rs, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(recs) == 0 {
		f.Fatal("no relay frame reached rank 0")
	}
	return recs
}

// sinkPath is the inner path of the relay under fuzzing: it takes every
// send at once and checks that it goes to a neighbour.
type sinkPath struct {
	transport.DataPath // nil: the relay calls nothing else here
	g                  *topology.Graph
	mu                 sync.Mutex
	bad                []string
}

func (s *sinkPath) Send(_ context.Context, peer int, _ transport.Lane, _ *transport.Header, _ []byte) error {
	if !s.g.IsNeighbor(0, peer) {
		s.mu.Lock()
		s.bad = append(s.bad, "a send to a rank that is not a neighbour")
		s.mu.Unlock()
	}
	return nil
}

func (s *sinkPath) Close() error { return nil }

// FuzzFrames hands rank 0's relay, in a ring of 8, frames as a
// neighbour's inner path would: none may panic it or keep it from closing,
// it forwards to neighbours only, and whatever its layer above receives
// must be a message the frames carried (a header from a frame's payload,
// at most the bytes fed in, from a source some frame named).
func FuzzFrames(f *testing.F) {
	recs := fuzzSeeds(f)
	for _, r := range recs {
		f.Add(r)
	}
	f.Add(bytes.Join(recs, nil))
	g, err := topology.New(fuzzSpec, fuzzRanks)
	if err != nil {
		f.Fatal(err)
	}
	nb := g.Neighbors(0)

	f.Fuzz(func(t *testing.T, data []byte) {
		in := parseRecords(data)
		headers := map[transport.Header]bool{}
		srcs := map[int]bool{}
		fed := 0
		bm := (fuzzRanks + 7) / 8
		for i := range in {
			in[i].h[0] = transport.OwnerTransport | 0x52 // a relay frame: others go up untouched
			for _, off := range []int{0, bm} {
				if len(in[i].p) >= off+transport.HeaderSize {
					var oh transport.Header
					copy(oh[:], in[i].p[off:])
					headers[oh] = true
				}
			}
			srcs[int(binary.LittleEndian.Uint32(in[i].h[8:]))] = true
			fed += len(in[i].p)
		}
		var mu sync.Mutex
		var bad []string
		up := func(from int, lane transport.Lane, h *transport.Header, p []byte) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case h == nil || !headers[*h]:
				bad = append(bad, "a header no frame carried")
			case !srcs[from]:
				bad = append(bad, "a message from a source no frame named")
			case len(p) > fed:
				bad = append(bad, "a message longer than every frame together")
			}
		}
		e := relay.New(g, 0, up, nil, relay.Options{Linger: time.Millisecond})
		inner := &sinkPath{g: g}
		e.Start(inner)
		h0 := e.Handler()
		for _, r := range in {
			h0(nb[r.fromIdx%len(nb)], r.lane, &r.h, r.p)
		}
		closeWithin(t, []*relay.Endpoint{e}, 10*time.Second)
		mu.Lock()
		defer mu.Unlock()
		bad = append(bad, inner.bad...)
		if len(bad) > 0 {
			t.Fatalf("%d bad deliveries or sends, first: %s", len(bad), bad[0])
		}
	})
}
