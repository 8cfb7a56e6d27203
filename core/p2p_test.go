package core

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/internal/race"
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
	if testing.Short() || race.Enabled {
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

// TestWaitDeadlineOnCollective: a non-blocking collective waited on with a
// caller's deadline must end the wait at that deadline (CodeTimeout, the
// operation still pending), not run the operation in the waiter until the
// communicator's timeout; waited on again later, it completes.
func TestWaitDeadlineOnCollective(t *testing.T) {
	comms := newLocal(t, 2)
	buf := make([]byte, 8)
	req := comms[0].IAllreduce(nil, buf, collective.Int64, collective.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := req.Wait(ctx)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Wait with a 200 ms deadline returned after %v", took)
	}
	if CodeOf(err) != CodeTimeout {
		t.Fatalf("Wait: %v, want CodeTimeout", err)
	}
	if err := comms[1].Allreduce(context.Background(), nil, make([]byte, 8), collective.Int64, collective.Sum); err != nil {
		t.Fatal(err)
	}
	if err := req.Wait(context.Background()); err != nil {
		t.Fatalf("the pending allreduce then: %v", err)
	}
}

// Unexpected messages beyond Config.MaxBufferedBytes wait for room: the
// handler holds the rest back until receives take what is buffered, and
// every message arrives whole and in order.
func TestBufferBudgetBackPressure(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBufferedBytes = 4096
	comms, err := testNewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const msgs, size = 8, 3000 // two never fit together
	sent := make(chan error, 1)
	go func() {
		for i := range msgs {
			b := bytes.Repeat([]byte{byte(i + 1)}, size)
			if err := comms[1].Send(ctx, b, 0, 5); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(200 * time.Millisecond) // let them pile up against the budget
	if held := comms[0].n.buffered.Load(); held > cfg.MaxBufferedBytes {
		t.Fatalf("%d bytes buffered, over the %d-byte budget", held, cfg.MaxBufferedBytes)
	}
	for i := range msgs {
		buf := make([]byte, size)
		if _, err := comms[0].Recv(ctx, buf, 1, 5); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(buf, bytes.Repeat([]byte{byte(i + 1)}, size)) {
			t.Fatalf("message %d arrived out of order or damaged", i)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if held := comms[0].n.buffered.Load(); held != 0 {
		t.Fatalf("%d bytes still accounted after every message was received", held)
	}
}
