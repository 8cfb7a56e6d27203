package core

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// worlds returns the ways a test world can be built: the in-memory mesh
// and loopback QUIC with each bulk data path.
func worlds() []struct {
	name string
	make func(t *testing.T, n int) []*Comm
} {
	quicWith := func(bulk string, plaintext bool, path string) func(t *testing.T, n int) []*Comm {
		return func(t *testing.T, n int) []*Comm {
			t.Helper()
			cfg := testConfig()
			cfg.Bulk, cfg.BulkPlaintext = bulk, plaintext
			comms, err := testNewLocalQUIC(n, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeAll(t, comms) })
			// The data must really take the path under test.
			if p := comms[0].Paths()[1]; !strings.HasPrefix(p, path) {
				t.Fatalf("rank 0 sends to rank 1 over %q, want %s", p, path)
			}
			return comms
		}
	}
	return []struct {
		name string
		make func(t *testing.T, n int) []*Comm
	}{
		{"mem", newLocal},
		{"quic", quicWith("off", false, "quic")},
		{"shm", quicWith("shm", false, "shm")},
		{"tcp_tls", quicWith("tcp", false, "tcp x2 tls")},
		{"tcp_plain", quicWith("tcp", true, "tcp x2 plaintext")},
	}
}

// TestCloseIsGraceful: a rank that finishes its last collective and closes
// at once must not fail the others, who may still be finishing theirs, and
// messages it sent before Close are still delivered.
func TestCloseIsGraceful(t *testing.T) {
	for _, w := range worlds() {
		t.Run(w.name, func(t *testing.T) {
			const n = 4
			comms := w.make(t, n)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			payload := bytes.Repeat([]byte("bye!"), 64<<10) // 256 KiB, several frames on shm/tcp
			mustAll(t, each(comms, func(c *Comm) error {
				// Rank 0 is slow to reach the end: the others close first.
				if c.Rank() == 0 {
					time.Sleep(100 * time.Millisecond)
				}
				for i := 0; i < 3; i++ {
					buf := make([]byte, 4<<10)
					if err := c.Allreduce(ctx, nil, buf, collective.Int32, collective.Sum); err != nil {
						return err
					}
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if c.Rank() == 1 {
					if err := c.Send(ctx, payload, 0, 9); err != nil {
						return err
					}
				}
				if c.Rank() != 0 {
					return c.Close() // without waiting for rank 0
				}
				time.Sleep(200 * time.Millisecond) // rank 1 has closed by now
				got := make([]byte, len(payload))
				if _, err := c.Recv(ctx, got, 1, 9); err != nil {
					return fmt.Errorf("receive of a message sent before Close: %v", err)
				}
				if !bytes.Equal(got, payload) {
					return fmt.Errorf("message sent before Close arrived damaged")
				}
				// What needs a departed rank fails at once, naming it; the
				// communicator itself is not failed by a graceful departure.
				start := time.Now()
				err := c.Barrier(ctx)
				if CodeOf(err) != CodePeerDown || !strings.Contains(err.Error(), "destroyed its communicator") {
					return fmt.Errorf("barrier after the others closed: %v", err)
				}
				if d := time.Since(start); d > time.Second {
					return fmt.Errorf("barrier took %v to fail", d)
				}
				if _, err := c.Recv(ctx, make([]byte, 1), 2, 1); CodeOf(err) != CodePeerDown {
					return fmt.Errorf("recv from a departed rank: %v", err)
				}
				if err := c.Send(ctx, []byte{1}, 3, 1); CodeOf(err) != CodePeerDown {
					return fmt.Errorf("send to a departed rank: %v", err)
				}
				return nil
			}))
		})
	}
}

// TestCloseMidCollective: a rank that closes without joining a collective
// fails it on the others quickly (not after the heartbeat timeout), with an
// error naming the rank.
func TestCloseMidCollective(t *testing.T) {
	for _, w := range worlds() {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			errs := each(comms, func(c *Comm) error {
				if c.Rank() == 2 {
					time.Sleep(50 * time.Millisecond)
					return c.Close()
				}
				return c.Allreduce(ctx, nil, make([]byte, 1<<20), collective.Float32, collective.Sum)
			})
			took := time.Since(start)
			if errs[2] != nil {
				t.Fatalf("close: %v", errs[2])
			}
			expectAll(t, errs[:2], CodePeerDown, "rank 2 has destroyed its communicator")
			if took > 2*time.Second {
				t.Errorf("the survivors failed after %v, want well under the heartbeat timeout", took)
			}
			// The two left can still talk to each other.
			mustAll(t, each(comms[:2], func(c *Comm) error {
				b := []byte{byte(c.Rank())}
				if c.Rank() == 0 {
					return c.Send(ctx, b, 1, 4)
				}
				_, err := c.Recv(ctx, b, 0, 4)
				if err == nil && b[0] != 0 {
					err = fmt.Errorf("got %d", b[0])
				}
				return err
			}))
		})
	}
}
