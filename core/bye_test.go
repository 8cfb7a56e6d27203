package core

import (
	"context"
	"sync"
	"testing"

	"github.com/nexar-go/nexar/transport"
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
	rec := &laneRecorder{unused: map[int]bool{2: true}, byes: map[int]transport.Lane{}}
	comms, err := testNewLocalWrapped(3, Config{}, func(i int, ep transport.DataPath) transport.DataPath {
		if i != 0 {
			return ep
		}
		rec.DataPath = ep
		return rec
	})
	if err != nil {
		t.Fatal(err)
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
