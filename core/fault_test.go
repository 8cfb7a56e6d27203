package core

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport/mem"
)

// expectAll checks that every rank got code and that the messages contain
// every string in want.
func expectAll(t *testing.T, errs []error, code Code, want ...string) {
	t.Helper()
	for r, err := range errs {
		var e *Error
		if !errors.As(err, &e) || e.Code != code {
			t.Errorf("rank %d: got %v, want %v", r, err, code)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d: %q does not name %q", r, err, w)
			}
		}
	}
}

func TestMismatch(t *testing.T) {
	f32 := collective.Float32
	cases := []struct {
		name string
		call func(c *Comm, ctx context.Context) error
		want []string
	}{
		{"allreduce_vs_broadcast", func(c *Comm, ctx context.Context) error {
			if c.Rank() == 2 {
				return c.Broadcast(ctx, make([]byte, 40), f32, 1)
			}
			return c.Allreduce(ctx, nil, make([]byte, 40), f32, collective.Sum)
		}, []string{"allreduce(float32, count=10, sum)", "broadcast(float32, count=10, root=1)"}},
		{"counts", func(c *Comm, ctx context.Context) error {
			n := 10
			if c.Rank() == 1 {
				n = 11
			}
			return c.Allreduce(ctx, nil, make([]byte, 4*n), f32, collective.Sum)
		}, []string{"count=10", "count=11"}},
		{"roots", func(c *Comm, ctx context.Context) error {
			root := 2
			if c.Rank() == 2 {
				root = 0
			}
			return c.Broadcast(ctx, make([]byte, 40), f32, root)
		}, []string{"root=0", "root=2"}},
		{"zero_count", func(c *Comm, ctx context.Context) error {
			if c.Rank() == 3 {
				return c.Barrier(ctx)
			}
			return c.Allreduce(ctx, nil, nil, f32, collective.Sum)
		}, []string{"barrier()", "allreduce(float32, count=0, sum)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := newLocal(t, 4)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			errs := each(comms, func(c *Comm) error { return tc.call(c, ctx) })
			expectAll(t, errs, CodeMismatch, tc.want...)
			t.Logf("detected in %v: %v", time.Since(start), errs[0])
			// Sticky: later calls fail fast with the same cause.
			if err := comms[0].Barrier(ctx); CodeOf(err) != CodeMismatch {
				t.Errorf("later call: %v", err)
			}
		})
	}
}

func TestKillMidAllreduce(t *testing.T) {
	cfg := Config{Timeout: 30 * time.Second, Logger: testConfig().Logger} // default heartbeats: 500ms / 3s
	comms, err := testNewLocal(4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx := context.Background()
	// Rank 3 never joins the allreduce, then dies.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	start := time.Now()
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = comms[r].Allreduce(ctx, nil, make([]byte, 1<<20), collective.Float32, collective.Sum)
		}()
	}
	time.Sleep(200 * time.Millisecond)
	killed := time.Now()
	mem.Kill(comms[3].n.ep)
	wg.Wait()
	took := time.Since(killed)
	t.Logf("survivors failed %v after the kill (%v after the call)", took, time.Since(start))
	expectAll(t, errs, CodePeerDown, "rank 3")
	if took > 5*time.Second {
		t.Errorf("detection took %v, want < 5s", took)
	}
	if err := comms[0].Barrier(ctx); CodeOf(err) != CodePeerDown {
		t.Errorf("later call: %v, want CodePeerDown", err)
	}
}

func TestAbort(t *testing.T) {
	comms := newLocal(t, 3)
	ctx := context.Background()
	errs := each(comms, func(c *Comm) error {
		if c.Rank() == 1 {
			c.Abort(errors.New("user gave up"))
			return c.Err()
		}
		return c.Allreduce(ctx, nil, make([]byte, 4), collective.Int32, collective.Sum)
	})
	expectAll(t, errs, CodeAborted, "user gave up")
}

// TestFrozenRank: a rank that stops answering without closing anything
// (SIGSTOP, a hung host) is detected by heartbeats, and named.
func TestFrozenRank(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
	comms, err := testNewLocal(4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	comms[2].n.freeze()
	defer comms[2].n.thaw()
	ctx := context.Background()
	start := time.Now()
	errs := each(comms, func(c *Comm) error {
		if c.Rank() == 2 {
			return nil // frozen: never calls
		}
		return c.Allreduce(ctx, nil, make([]byte, 4096), collective.Float32, collective.Sum)
	})
	took := time.Since(start)
	expectAll(t, append(errs[:2], errs[3]), CodePeerDown, "rank 2", "no heartbeat")
	if took > 3*cfg.HeartbeatTimeout {
		t.Errorf("detection took %v with a %v heartbeat timeout", took, cfg.HeartbeatTimeout)
	}
	t.Logf("frozen rank detected after %v", took)
}

// TestFrozenRankLargeSend: a rank that sends a large message into a frozen
// rank (its handler blocked, so the transport's send blocks for room) must
// fail once the detector declares that rank down, naming it, not when the
// call's own deadline (here 20 s) or a transport timeout ends the send.
func TestFrozenRankLargeSend(t *testing.T) {
	for _, tr := range []struct {
		name string
		new  func(int, Config) ([]*Comm, error)
	}{{"mem", testNewLocal}, {"quic+bulk", testNewLocalQUIC}} {
		t.Run(tr.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
			comms, err := tr.new(2, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			comms[1].n.freeze()
			defer comms[1].n.thaw()
			start := time.Now()
			err = comms[0].Allreduce(context.Background(), nil, make([]byte, 64<<20), collective.Float32, collective.Sum)
			took := time.Since(start)
			// The frozen rank's own detector, which still runs, may
			// give up on rank 0 first and close the ring: either way
			// rank 1 is named.
			expectAll(t, []error{err}, CodePeerDown, "rank 1")
			if took > cfg.HeartbeatTimeout+2*time.Second {
				t.Errorf("the sender failed after %v with a %v heartbeat timeout", took, cfg.HeartbeatTimeout)
			}
			t.Logf("the sender failed %v after it started", took)
		})
	}
}
