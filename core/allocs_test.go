package core

import (
	"context"
	"runtime"
	"testing"
	"time"

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
	return pairAllocsWith(t, testConfig(), call)
}

// pairAllocsWith is pairAllocs with the ranks' configuration cfg.
func pairAllocsWith(t *testing.T, cfg Config, call func(c *Comm, r int) error) float64 {
	t.Helper()
	comms, err := testNewLocalQUIC(2, cfg)
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

// tcpAllreduceAllocs bounds what one 8-byte allreduce between two ranks
// over TCP (the path between hosts) may allocate on its fast path (the
// waiter reads the socket itself), both ranks together: nothing but
// background work (heartbeats), well under one per call. Each frame's
// write used to watch its context, which armed the context's timer and
// kept the call's state from reuse (docs/performance.md, "Small messages
// between hosts").
const tcpAllreduceAllocs = 1

// TestAllreduceAllocsTCP counts the allocations of an 8-byte allreduce
// between two ranks of this process over TCP, with TLS (the default
// between hosts) and in plaintext. Not AllocsPerRun, which runs one P:
// two ranks that spin in one process need two (each waiter spins on the
// socket while the other rank runs), and a long SpinWait keeps every
// wait on that path, also on a loaded host.
func TestAllreduceAllocsTCP(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two Ps: one per spinning rank")
	}
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "plaintext"}[plain], func(t *testing.T) {
			cfg := testConfig()
			cfg.Bulk, cfg.BulkPlaintext, cfg.SpinWait = "tcp", plain, 5*time.Second
			comms, err := testNewLocalQUIC(2, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			ctx := context.Background()
			run := func(n int) {
				errs := each(comms, func(c *Comm) error {
					send, recv := make([]byte, 8), make([]byte, 8)
					for range n {
						if err := c.Allreduce(ctx, send, recv, collective.Float32, collective.Sum); err != nil {
							return err
						}
					}
					return nil
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
			}
			run(200) // channels made, pools grown
			const n = 5000
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			run(n)
			runtime.ReadMemStats(&m1)
			got := float64(m1.Mallocs-m0.Mallocs) / n
			t.Logf("8 B allreduce over TCP, 2 ranks: %.1f allocations per call, both ranks", got)
			if got > tcpAllreduceAllocs {
				t.Errorf("8 B allreduce over TCP, 2 ranks: %.1f allocations per call, both ranks; want at most %d", got, tcpAllreduceAllocs)
			}
		})
	}
}

// TestRecycleKeepsSendContexts: a call that sent to more than its two
// built-in send contexts' destinations (a barrier of 4 ranks: Bruck's
// allgather sends to three) is idle once done, so it is recycled, and it
// keeps the extra context for its next use, which then allocates nothing.
// Such calls were left to the collector: a barrier of 4 ranks allocated 3
// objects per rank, about 800 bytes (docs/performance.md, "Garbage between
// hosts"). A unit test: end to end, a loaded host makes frames arrive
// before their receives are posted, which allocates on its own.
func TestRecycleKeepsSendContexts(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	comms, err := testNewLocalQUIC(4, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	c, cc := comms[0], new(collCall)
	use := func() {
		cc.l = link{c: c, cc: cc}
		for peer := 1; peer < 4; peer++ {
			_ = cc.l.sendCtx(peer)
		}
		cc.releaseSends()
		if !cc.idle() {
			t.Fatal("a call with three send destinations is not idle once done: it would not be recycled")
		}
		cc.reset()
	}
	if got := testing.AllocsPerRun(100, use); got != 0 {
		t.Errorf("a reused call with three send destinations allocates %.1f times per use, want 0", got)
	}
}
