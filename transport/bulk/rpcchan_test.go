package bulk

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// TestRPCChannel checks that LaneRPC messages go over a channel of their
// own (a ring on one host, TCP when forced), arrive whole and in order, on
// LaneRPC, and are not held behind a data lane whose receiver is stuck.
func TestRPCChannel(t *testing.T) {
	for _, m := range []struct {
		name string
		opt  Options
		path string
	}{
		{"shm-copy", Options{Mode: ModeSHM, RingSize: 1 << 20, RemoteMin: -1}, "rpc shm 256 KiB ring"},
		// Payloads of 1 KiB or more copied out of the sender's memory.
		{"shm-remote", Options{Mode: ModeSHM, RingSize: 1 << 20, RemoteMin: 1 << 10}, "rpc shm 256 KiB ring, cross-memory attach from 1 KiB"},
		{"tcp-tls", Options{Mode: ModeTCP}, "rpc tcp x1 tls"},
		{"tcp-plain", Options{Mode: ModeTCP, Plaintext: true}, "rpc tcp x1 plaintext"},
		{"off", Options{Mode: ModeOff}, "quic"},
	} {
		t.Run(m.name, func(t *testing.T) {
			type msg struct {
				lane transport.Lane
				p    []byte
			}
			got := make(chan msg, 64)
			stuck := make(chan struct{})
			var once sync.Once
			unstick := func() { once.Do(func() { close(stuck) }) }
			defer unstick()
			h1 := func(from int, lane transport.Lane, h *transport.Header, p []byte) {
				if lane == transport.LaneData {
					<-stuck // the data lane's reader hangs here
					return
				}
				got <- msg{lane, p}
			}
			eps := mesh(t, 2, m.opt, []transport.Handler{nil, h1}, nil)
			defer func() {
				unstick()
				for _, e := range eps {
					e.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var h transport.Header
			h[0] = 1
			// Fill the data path to rank 1 (its reader is stuck in the
			// handler): the sender blocks once ring or socket buffers are full.
			dataDone := make(chan error, 1)
			go func() {
				big := make([]byte, 4<<20)
				var err error
				for i := 0; i < 8 && err == nil; i++ {
					err = eps[0].Send(ctx, 1, transport.LaneData, &h, big)
				}
				dataDone <- err
			}()
			time.Sleep(50 * time.Millisecond)
			if m.opt.RemoteMin > 0 {
				// Cross-memory attach is agreed a moment after the ring:
				// a first call makes it, then wait for the agreement.
				if err := eps[0].Send(ctx, 1, transport.LaneRPC, &h, []byte{9}); err != nil {
					t.Fatal(err)
				}
				if g := <-got; len(g.p) != 1 {
					t.Fatalf("first RPC: %d bytes", len(g.p))
				}
				for deadline := time.Now().Add(5 * time.Second); !strings.Contains(eps[0].RPCPaths()[1], "cross-memory"); {
					if time.Now().After(deadline) {
						t.Fatalf("RPC path %q: no cross-memory attach", eps[0].RPCPaths()[1])
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			sizes := []int{8, 4 << 10, 1 << 20, 0, 3 << 20}
			for i, n := range sizes {
				p := bytes.Repeat([]byte{byte(i + 1)}, n)
				if err := eps[0].Send(ctx, 1, transport.LaneRPC, &h, p); err != nil {
					t.Fatalf("RPC %d: %v", i, err)
				}
			}
			for i, n := range sizes {
				select {
				case g := <-got:
					if g.lane != transport.LaneRPC || !bytes.Equal(g.p, bytes.Repeat([]byte{byte(i + 1)}, n)) {
						t.Fatalf("RPC %d: got lane %v, %d bytes; want LaneRPC, %d bytes of %d", i, g.lane, len(g.p), n, i+1)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("RPC %d not delivered while the data lane is stuck", i)
				}
			}
			if p := eps[0].RPCPaths()[1]; !strings.HasPrefix(p, m.path) {
				t.Fatalf("RPC path to rank 1 is %q, want %q", p, m.path)
			}
			unstick()
			if err := <-dataDone; err != nil {
				t.Fatalf("data: %v", err)
			}
		})
	}
}

// BenchmarkRPCChannel times a LaneRPC ping-pong (the echo sent from the
// receiving handler) over each path: the transport's share of an RPC
// round trip.
func BenchmarkRPCChannel(b *testing.B) {
	for _, m := range []struct {
		name string
		opt  Options
	}{
		{"shm", Options{Mode: ModeSHM}}, // cross-memory attach from 256 KiB
		{"shm-copy", Options{Mode: ModeSHM, RemoteMin: -1}},
		{"tcp-tls", Options{Mode: ModeTCP}},
		{"quic", Options{Mode: ModeOff}},
	} {
		for _, size := range []int{8, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%d", m.name, size), func(b *testing.B) {
				pong := make(chan struct{}, 1)
				var eps []*Endpoint
				ready := make(chan struct{})
				h1 := func(from int, lane transport.Lane, h *transport.Header, p []byte) {
					<-ready
					if lane == transport.LaneRPC {
						eps[1].Send(context.Background(), 0, transport.LaneRPC, h, p)
					}
				}
				h0 := func(from int, lane transport.Lane, h *transport.Header, p []byte) {
					if lane == transport.LaneRPC {
						pong <- struct{}{}
					}
				}
				eps = mesh(b, 2, m.opt, []transport.Handler{h0, h1}, nil)
				close(ready)
				defer func() {
					for _, e := range eps {
						e.Close()
					}
				}()
				var h transport.Header
				p := make([]byte, size)
				ctx := context.Background()
				b.SetBytes(int64(2 * size))
				b.ResetTimer()
				for range b.N {
					if err := eps[0].Send(ctx, 1, transport.LaneRPC, &h, p); err != nil {
						b.Fatal(err)
					}
					<-pong
				}
			})
		}
	}
}
