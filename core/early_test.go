package core

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// Chunks that arrive before their receive is posted are read into the
// communicator's early-arrival pool and go back to it once copied: over
// the bulk paths (shared memory and TCP, which place payloads), a rank
// that posts each receive, or enters each allreduce, late still gets
// every byte right, through rounds that reuse the same buffers. Over TCP,
// whose reader takes what comes as it comes, the pool then holds them. A
// shared-memory ring may keep a frame until its receive is posted (no
// reader runs for it), and then nothing arrives early: there the pool is
// not checked.
func TestEarlyChunksPooled(t *testing.T) {
	for _, w := range worlds() {
		switch w.name {
		case "shm", "tcp_tls", "tcp_plain":
		default:
			continue // no placement there: the Handler buffers
		}
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t, 2)
			if comms[0].early.max <= 0 {
				t.Fatalf("early pool bound %d: the test needs one", comms[0].early.max)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// pooled empties rank 0's pool and reports whether it held
			// anything.
			pooled := func() bool {
				p := &comms[0].early
				p.mu.Lock()
				defer p.mu.Unlock()
				had := p.idle > 0
				p.class, p.idle = [len(p.class)][][]byte{}, 0
				return had
			}
			pooled()
			mustPool := w.name != "shm"
			// first lets the peer's chunks arrive before rank 0's receive:
			// over TCP it waits until rank 0 holds some unmatched (a sleep
			// alone left that to the scheduler on a loaded machine); a ring
			// may hold them unread, so there the peer gets a head start.
			first := func() {
				if !mustPool {
					time.Sleep(30 * time.Millisecond)
					return
				}
				for end := time.Now().Add(10 * time.Second); comms[0].Stats().BytesBuffered == 0 && time.Now().Before(end); {
					time.Sleep(time.Millisecond)
				}
			}
			const size = 1 << 20 // several frames on every path
			for round := range 4 {
				mustAll(t, each(comms, func(c *Comm) error {
					if c.Rank() == 1 {
						msg := make([]byte, size)
						for i := range msg {
							msg[i] = byte(i*7 + round)
						}
						return c.Send(ctx, msg, 0, 5)
					}
					first() // the message comes first
					got := make([]byte, size)
					if _, err := c.Recv(ctx, got, 1, 5); err != nil {
						return err
					}
					for i, b := range got {
						if b != byte(i*7+round) {
							t.Errorf("round %d: received byte %d = %d, want %d", round, i, b, byte(i*7+round))
							break
						}
					}
					return nil
				}))
			}
			if !pooled() && mustPool {
				t.Error("rank 0's pool is empty after the receives: the early chunks were not pooled or not given back")
			}
			const n = size / 4 // float32s: the ring (pipelined over TCP)
			for round := range 4 {
				mustAll(t, each(comms, func(c *Comm) error {
					b := make([]byte, 4*n)
					for i := range n {
						binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(i%1000+c.Rank()*10000+round*100000)))
					}
					if c.Rank() == 0 {
						first() // the peer's chunks come first
					}
					if err := c.Allreduce(ctx, nil, b, collective.Float32, collective.Sum); err != nil {
						return err
					}
					for i := range n {
						want := float32(2*(i%1000) + 10000 + 2*round*100000)
						if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); got != want {
							t.Errorf("rank %d round %d: element %d = %v, want %v", c.Rank(), round, i, got, want)
							return nil
						}
					}
					return nil
				}))
			}
			if !pooled() && mustPool {
				t.Error("rank 0's pool is empty after the allreduces: the early chunks were not pooled or not given back")
			}
		})
	}
}
