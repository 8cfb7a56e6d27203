package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport/mem"
)

func TestP2P(t *testing.T) {
	comms := newLocal(t, 3)
	ctx := context.Background()
	t.Run("out_of_order_tags", func(t *testing.T) {
		mustAll(t, each(comms[:2], func(c *Comm) error {
			if c.Rank() == 0 {
				for tag := uint64(1); tag <= 3; tag++ {
					if err := c.Send(ctx, []byte{byte(tag)}, 1, tag); err != nil {
						return err
					}
				}
				return nil
			}
			for _, tag := range []uint64{3, 1, 2} {
				b := make([]byte, 1)
				st, err := c.Recv(ctx, b, 0, tag)
				if err != nil {
					return err
				}
				if b[0] != byte(tag) || st.Tag != tag || st.Source != 0 || st.Count != 1 {
					return fmt.Errorf("tag %d: got %v %+v", tag, b, st)
				}
			}
			return nil
		}))
	})
	t.Run("any_source_and_order", func(t *testing.T) {
		const per = 50
		mustAll(t, each(comms, func(c *Comm) error {
			if c.Rank() != 0 {
				var reqs []*Request
				for i := 0; i < per; i++ {
					reqs = append(reqs, c.ISend([]byte{byte(c.Rank()), byte(i)}, 0, 7))
				}
				for _, r := range reqs {
					if err := r.Wait(ctx); err != nil {
						return err
					}
				}
				return nil
			}
			next := map[int]int{}
			for i := 0; i < 2*per; i++ {
				b := make([]byte, 2)
				st, err := c.Recv(ctx, b, AnySource, 7)
				if err != nil {
					return err
				}
				if int(b[0]) != st.Source || int(b[1]) != next[st.Source] {
					return fmt.Errorf("from %d got message %d, want %d", st.Source, b[1], next[st.Source])
				}
				next[st.Source]++
			}
			return nil
		}))
	})
	t.Run("truncated", func(t *testing.T) {
		mustAll(t, each(comms[:2], func(c *Comm) error {
			if c.Rank() == 0 {
				return c.Send(ctx, make([]byte, 100), 1, 9)
			}
			_, err := c.Recv(ctx, make([]byte, 10), 0, 9)
			if CodeOf(err) != CodeTruncated {
				return fmt.Errorf("got %v, want CodeTruncated", err)
			}
			return nil
		}))
	})
	t.Run("recv_timeout_withdraws", func(t *testing.T) {
		c := comms[2]
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := c.Recv(tctx, make([]byte, 1), 0, 99); CodeOf(err) != CodeTimeout {
			t.Fatalf("got %v, want CodeTimeout", err)
		}
		if c.Err() != nil {
			t.Fatalf("a withdrawn receive failed the comm: %v", c.Err())
		}
	})
}

func TestLargeP2PMem(t *testing.T) {
	size := 256 << 20
	if testing.Short() || raceEnabled {
		size = 70 << 20 // still more than one transport.MaxPayload chunk
	}
	comms := newLocal(t, 2)
	mustAll(t, each(comms, func(c *Comm) error {
		if c.Rank() == 0 {
			b := make([]byte, size)
			for i := 0; i < size; i += 4093 {
				b[i] = byte(i / 4093)
			}
			return c.Send(context.Background(), b, 1, 1)
		}
		b := make([]byte, size)
		if _, err := c.Recv(context.Background(), b, 0, 1); err != nil {
			return err
		}
		for i := 0; i < size; i += 4093 {
			if b[i] != byte(i/4093) {
				return fmt.Errorf("byte %d differs", i)
			}
		}
		return nil
	}))
}

func TestNonBlocking(t *testing.T) {
	comms := newLocal(t, 4)
	mustAll(t, each(comms, func(c *Comm) error {
		const k = 6
		bufs := make([][]byte, k)
		reqs := make([]*Request, k)
		for i := range reqs {
			bufs[i] = make([]byte, 8*(i+1))
			for j := 0; j <= i; j++ {
				putI64(bufs[i], j, int64(c.Rank()+i))
			}
			reqs[i] = c.IAllreduce(nil, bufs[i], collective.Int64, collective.Sum)
		}
		bar := c.IBarrier()
		for i := k - 1; i >= 0; i-- { // complete in reverse order
			if err := reqs[i].Wait(context.Background()); err != nil {
				return err
			}
			if got, want := i64(bufs[i], 0), int64(6+4*i); got != want {
				return fmt.Errorf("op %d: %d, want %d", i, got, want)
			}
		}
		return bar.Wait(context.Background())
	}))
}

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
	comms, err := NewLocal(4, cfg)
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

func TestSplit(t *testing.T) {
	comms := newLocal(t, 5)
	ctx := context.Background()
	mustAll(t, each(comms, func(c *Comm) error {
		color := c.Rank() % 2
		if c.Rank() == 4 {
			color = -1
		}
		ch, err := c.Split(ctx, color, -c.Rank()) // keys reverse the order
		if err != nil {
			return err
		}
		// A parent collective in flight while the children work.
		preq := c.IAllreduce(nil, make([]byte, 8), collective.Int64, collective.Sum)
		if color < 0 {
			if ch != nil {
				return fmt.Errorf("color -1 got a communicator")
			}
			return preq.Wait(ctx)
		}
		defer ch.Close()
		if ch.Size() != 2 || ch.Rank() != 1-c.Rank()/2 {
			return fmt.Errorf("child rank %d size %d", ch.Rank(), ch.Size())
		}
		a := make([]byte, 8)
		putI64(a, 0, int64(c.Rank()))
		if err := ch.Allreduce(ctx, nil, a, collective.Int64, collective.Sum); err != nil {
			return err
		}
		if want := int64(2*color + 2); i64(a, 0) != want {
			return fmt.Errorf("child sum %d, want %d", i64(a, 0), want)
		}
		if err := preq.Wait(ctx); err != nil {
			return err
		}
		sreq := ch.ISend([]byte{byte(c.Rank())}, 1-ch.Rank(), 5)
		b := make([]byte, 1)
		if _, err := ch.Recv(ctx, b, 1-ch.Rank(), 5); err != nil {
			return err
		}
		if int(b[0]) != c.Rank()^2 {
			return fmt.Errorf("child p2p got %d", b[0])
		}
		return sreq.Wait(ctx)
	}))
}

// TestFrozenRank: a rank that stops answering without closing anything
// (SIGSTOP, a hung host) is detected by heartbeats, and named.
func TestFrozenRank(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
	comms, err := NewLocal(4, cfg)
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
	}{{"mem", NewLocal}, {"quic+bulk", NewLocalQUIC}} {
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
