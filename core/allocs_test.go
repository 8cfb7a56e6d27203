package core

import (
	"context"
	"testing"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/internal/race"
)

// allreduceAllocs is what one 8-byte allreduce between two ranks over the
// shared-memory path may allocate, both ranks together: nothing, whether
// the waiter spins or sleeps (docs/performance.md, issue 15 item 3).
const allreduceAllocs = 0

// pairAllocs counts the allocations of call between two ranks meshed as
// two processes on one host (loopback QUIC, shared-memory rings), both
// ranks' together, after 100 calls have made the rings and grown the pools
// and maps.
func pairAllocs(t *testing.T, call func(c *Comm, r int) error) float64 {
	t.Helper()
	comms, err := testNewLocalQUIC(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	start, done := make(chan struct{}), make(chan error)
	go func() {
		for range start {
			done <- call(comms[1], 1)
		}
	}()
	defer close(start)
	both := func() {
		start <- struct{}{}
		if err := call(comms[0], 0); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		both()
	}
	return testing.AllocsPerRun(2000, both)
}

// TestAllreduceAllocs counts the allocations of an 8-byte allreduce
// between two ranks (pairAllocs): the small-message path must not regress.
// A count is deterministic where a time is not, so this is a test;
// background work (heartbeats) adds well under one per call.
func TestAllreduceAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	var bufs [2][2][]byte
	for r := range bufs {
		bufs[r] = [2][]byte{make([]byte, 8), make([]byte, 8)}
	}
	ctx := context.Background()
	got := pairAllocs(t, func(c *Comm, r int) error {
		return c.Allreduce(ctx, bufs[r][0], bufs[r][1], collective.Float32, collective.Sum)
	})
	t.Logf("8 B allreduce, 2 ranks: %.0f allocations per call, both ranks", got)
	if got > allreduceAllocs {
		t.Errorf("8 B allreduce, 2 ranks: %.0f allocations per call, both ranks; want at most %d", got, allreduceAllocs)
	}
}

// TestBarrierAllocs counts the allocations of a barrier between two ranks
// (pairAllocs): benchmarks and programs put one before every small call,
// and garbage from it runs the collector in the middle of their calls
// (docs/performance.md, "A barrier without garbage").
func TestBarrierAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	ctx := context.Background()
	got := pairAllocs(t, func(c *Comm, _ int) error { return c.Barrier(ctx) })
	t.Logf("barrier, 2 ranks: %.0f allocations per call, both ranks", got)
	if got > allreduceAllocs {
		t.Errorf("barrier, 2 ranks: %.0f allocations per call, both ranks; want at most %d", got, allreduceAllocs)
	}
}
