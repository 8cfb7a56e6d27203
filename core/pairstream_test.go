package core

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// TestTwoRankAllreducePaths: a 2-rank allreduce of several chunks per half,
// in and out of place, over every data path: streaming paths (TCP, QUIC)
// take the fused, pipelined ring (collective's pairStream, link.Stream),
// shared memory the plain one; every rank gets the exact sum, call after
// call (a ring made on first use changes the path between calls).
func TestTwoRankAllreducePaths(t *testing.T) {
	for _, w := range worlds() {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const count = 9<<20/4 + 3 // 9 MiB of int32: 2 chunks and a bit per half
			want := make([]byte, 4*count)
			for i := range count {
				binary.LittleEndian.PutUint32(want[4*i:], uint32(4*i+1))
			}
			mustAll(t, each(comms, func(c *Comm) error {
				for call := range 3 {
					in := make([]byte, 4*count)
					for i := range count {
						binary.LittleEndian.PutUint32(in[4*i:], uint32(i+c.Rank()*(2*i+1)))
					}
					out := make([]byte, len(in))
					send := in
					if call == 1 {
						send, out = nil, in // in place
					}
					if err := c.Allreduce(ctx, send, out, collective.Int32, collective.Sum); err != nil {
						return err
					}
					if !bytes.Equal(out, want) {
						return fmt.Errorf("call %d: wrong sum", call)
					}
				}
				return nil
			}))
		})
	}
}

// TestTwoRankAllreducePeerLeaves: the peer closes while this rank is in a
// fused, pipelined allreduce with every receive posted: it fails at once,
// naming the peer, on every path.
func TestTwoRankAllreducePeerLeaves(t *testing.T) {
	for _, w := range worlds() {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			errs := each(comms, func(c *Comm) error {
				if c.Rank() == 1 {
					time.Sleep(50 * time.Millisecond)
					return c.Close()
				}
				return c.Allreduce(ctx, nil, make([]byte, 9<<20), collective.Float32, collective.Sum)
			})
			if errs[1] != nil {
				t.Fatalf("close: %v", errs[1])
			}
			expectAll(t, errs[:1], CodePeerDown, "rank 1 has destroyed its communicator")
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("rank 0 failed after %v, want well under the heartbeat timeout", took)
			}
		})
	}
}
