package core

import (
	"context"
	"testing"

	"github.com/nexar-go/nexar/collective"
)

// allreduceAllocs is what one 8-byte allreduce between two ranks over the
// shared-memory path may allocate, both ranks together: nothing, whether
// the waiter spins or sleeps (docs/performance.md, issue 15 item 3).
const allreduceAllocs = 0

// TestAllreduceAllocs counts the allocations of an 8-byte allreduce
// between two ranks meshed as two processes on one host (loopback QUIC,
// shared-memory rings), both ranks' together: the small-message path must
// not regress. A count is deterministic where a time is not, so this is a
// test; background work (heartbeats) adds well under one per call.
func TestAllreduceAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	comms, err := NewLocalQUIC(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx := context.Background()
	var bufs [2][2][]byte
	for r := range bufs {
		bufs[r] = [2][]byte{make([]byte, 8), make([]byte, 8)}
	}
	start, done := make(chan struct{}), make(chan error)
	go func() {
		for range start {
			done <- comms[1].Allreduce(ctx, bufs[1][0], bufs[1][1], collective.Float32, collective.Sum)
		}
	}()
	defer close(start)
	call := func() {
		start <- struct{}{}
		if err := comms[0].Allreduce(ctx, bufs[0][0], bufs[0][1], collective.Float32, collective.Sum); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range 100 { // rings made, pools and maps grown
		call()
	}
	got := testing.AllocsPerRun(2000, call)
	t.Logf("8 B allreduce, 2 ranks: %.0f allocations per call, both ranks", got)
	if got > allreduceAllocs {
		t.Errorf("8 B allreduce, 2 ranks: %.0f allocations per call, both ranks; want at most %d", got, allreduceAllocs)
	}
}

// TestBarrierAllocs counts the allocations of a barrier between two ranks
// as TestAllreduceAllocs does: benchmarks and programs put one before
// every small call, and garbage from it runs the collector in the middle
// of their calls (docs/performance.md).
func TestBarrierAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	comms, err := NewLocalQUIC(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx := context.Background()
	start, done := make(chan struct{}), make(chan error)
	go func() {
		for range start {
			done <- comms[1].Barrier(ctx)
		}
	}()
	defer close(start)
	call := func() {
		start <- struct{}{}
		if err := comms[0].Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		call()
	}
	got := testing.AllocsPerRun(2000, call)
	t.Logf("barrier, 2 ranks: %.0f allocations per call, both ranks", got)
	if got > allreduceAllocs {
		t.Errorf("barrier, 2 ranks: %.0f allocations per call, both ranks; want at most %d", got, allreduceAllocs)
	}
}
