package core

import (
	"context"
	"sync"
	"testing"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/mem"
)

// laneRecorder is a mem endpoint that declares the LaneData path to the
// peers in unused as never used (as transport/bulk does for a local peer
// whose ring is made on first use) and records the lane of every goodbye.
type laneRecorder struct {
	transport.DataPath
	unused map[int]bool
	mu     sync.Mutex
	byes   map[int]transport.Lane
}

func (l *laneRecorder) Caps() transport.Caps {
	c := l.DataPath.Caps()
	c.LazyData = true
	return c
}

func (l *laneRecorder) DataUnused(peer int) bool { return l.unused[peer] }

func (l *laneRecorder) Send(ctx context.Context, peer int, lane transport.Lane, th *transport.Header, p []byte) error {
	if h, err := decodeHeader(th); err == nil && h.kind == kindControl && h.sub == ctlBye {
		l.mu.Lock()
		l.byes[peer] = lane
		l.mu.Unlock()
	}
	return l.DataPath.Send(ctx, peer, lane, th, p)
}

// TestByeSkipsUnusedDataPath: a goodbye goes behind the data on LaneData,
// except to a peer no data ever went to, where it takes the control lane:
// at 64 local ranks, a goodbye on LaneData made a shared-memory ring for
// every pair at Close, and the CPU it took starved heartbeats into false
// "no heartbeat" failures of the ranks still closing.
func TestByeSkipsUnusedDataPath(t *testing.T) {
	const n = 3
	cfg := Config{}.withDefaults()
	nodes := make([]*node, n)
	hs := make([]transport.Handler, n)
	ds := make([]transport.DownHandler, n)
	for i := range nodes {
		nodes[i] = newNode(cfg, i, n)
		hs[i] = nodes[i].handle
		ds[i] = nodes[i].onDown
	}
	eps := mem.NewMesh(n, hs, ds)
	rec := &laneRecorder{DataPath: eps[0], unused: map[int]bool{2: true}, byes: map[int]transport.Lane{}}
	comms := []*Comm{worldComm(nodes[0], rec), worldComm(nodes[1], eps[1]), worldComm(nodes[2], eps[2])}
	for _, nd := range nodes {
		nd.start()
	}
	mustAll(t, each(comms, func(c *Comm) error { return c.Barrier(context.Background()) }))
	closeAll(t, comms)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.byes[1]; got != transport.LaneData {
		t.Errorf("goodbye to rank 1 (data path used) went on %v, want %v", got, transport.LaneData)
	}
	if got, ok := rec.byes[2]; !ok || got != transport.LaneControl {
		t.Errorf("goodbye to rank 2 (data path unused) went on %v (sent: %v), want %v", got, ok, transport.LaneControl)
	}
}
