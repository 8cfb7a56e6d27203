package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// The payload pool (RPC's and the early arrivals') keeps buffers by
// power-of-two class, hands back what it kept, never keeps more than its
// bound nor small or foreign buffers.
func TestBufPool(t *testing.T) {
	p := bufPool{max: 3 << 20}
	if b := p.get(100); len(b) != 100 || cap(b) != 100 {
		t.Fatalf("small get: len %d cap %d", len(b), cap(b))
	}
	a := p.get(1<<20 - 5)
	if len(a) != 1<<20-5 || cap(a) != 1<<20 {
		t.Fatalf("get: len %d cap %d, want %d and %d", len(a), cap(a), 1<<20-5, 1<<20)
	}
	a[0] = 42
	p.put(a)
	b := p.get(1 << 20)
	if &b[0] != &a[:1][0] || b[0] != 42 {
		t.Fatal("get after put did not reuse the buffer")
	}
	if c := p.get(1 << 20); &c[0] == &b[0] {
		t.Fatal("one buffer handed out twice")
	}
	p.put(make([]byte, 1<<20+1)) // not a class's capacity: dropped
	p.put(make([]byte, 100))
	for range 5 {
		p.put(make([]byte, 1<<20))
	}
	if p.idle != 3<<20 {
		t.Fatalf("idle %d bytes, want the bound %d", p.idle, 3<<20)
	}
	if poolClass(transport.MaxPayload+1) != -1 || poolClass(poolMin-1) != -1 {
		t.Fatal("a payload over MaxPayload or under poolMin has a class")
	}
}

// A lent handler gets the request, its reply is sent and released exactly
// once, on every outcome; large payloads (pooled, read straight into the
// pool over the RPC ring) arrive intact, and CallRPCInto lends the reply.
func TestRPCLent(t *testing.T) {
	t.Run("mem", func(t *testing.T) { testRPCLent(t, newLocal(t, 2)) })
	t.Run("quic", func(t *testing.T) {
		comms, err := testNewLocalQUIC(2, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer closeAll(t, comms)
		testRPCLent(t, comms)
	})
}

func testRPCLent(t *testing.T, comms []*Comm) {
	var released atomic.Int64
	var early atomic.Bool
	for _, c := range comms {
		rank := c.Rank()
		c.RegisterLent(1, func(_ context.Context, from int, req []byte) ([]byte, func(), error) {
			reply := make([]byte, len(req)+1) // the request's buffer is reused: copy
			reply[0] = byte(rank)
			copy(reply[1:], req)
			return reply, func() { released.Add(1) }, nil
		})
		c.RegisterLent(2, func(_ context.Context, from int, req []byte) ([]byte, func(), error) {
			return nil, func() { released.Add(1) }, errors.New("refused")
		})
		c.RegisterLent(3, func(context.Context, int, []byte) ([]byte, func(), error) { panic("boom") })
		c.RegisterLent(4, func(_ context.Context, _ int, req []byte) ([]byte, func(), error) { return req, nil, nil })
		pool := &c.rpc.pool
		c.RegisterLent(5, func(_ context.Context, _ int, req []byte) ([]byte, func(), error) {
			// Released once sent: the request's buffer, which is the
			// reply, must not be back in the pool before then.
			return req, func() {
				if inPool(pool, req) {
					early.Store(true)
				}
			}, nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	calls := int64(0)
	for _, size := range []int{0, 10, 1 << 20, 3<<20 + 7} {
		for _, c := range comms {
			for peer := range comms {
				req := make([]byte, size)
				for i := range req {
					req[i] = byte(i*7 + size + c.Rank())
				}
				for i := range 3 { // again, from reused buffers
					want := append([]byte{byte(peer)}, req...)
					got, err := c.CallRPC(ctx, peer, 1, req)
					calls++
					if err != nil {
						t.Fatalf("%d bytes, rank %d to %d: %v", size, c.Rank(), peer, err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("%d bytes, rank %d to %d, call %d: wrong reply (%d bytes)", size, c.Rank(), peer, i, len(got))
					}
					var into []byte
					err = c.CallRPCInto(ctx, peer, 1, req, func(r []byte) error { into = append(into[:0], r...); return nil })
					calls++
					if err != nil || !bytes.Equal(into, want) {
						t.Fatalf("%d bytes, rank %d to %d, CallRPCInto: err %v, reply right %v", size, c.Rank(), peer, err, bytes.Equal(into, want))
					}
				}
			}
		}
	}
	for _, c := range comms {
		for peer := range comms {
			_, err := c.CallRPC(ctx, peer, 2, []byte("x"))
			calls++
			if code := CodeOf(err); code != CodeInternal || err == nil || !bytes.Contains([]byte(err.Error()), []byte("refused")) {
				t.Fatalf("handler error from %d: %v (code %v)", peer, err, code)
			}
			_, err = c.CallRPC(ctx, peer, 3, nil)
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte("panicked")) {
				t.Fatalf("handler panic from %d: %v", peer, err)
			}
			useErr := fmt.Errorf("use failed")
			if err := c.CallRPCInto(ctx, peer, 1, []byte("y"), func([]byte) error { return useErr }); err != useErr {
				t.Fatalf("CallRPCInto: %v, want use's error", err)
			}
			calls++
		}
	}
	// An echo of the request's own (pooled) buffer, many calls in flight:
	// each buffer is reused only once its reply has gone.
	for _, c := range comms {
		var calls []*Call
		var reqs [][]byte
		for i := range 8 {
			req := bytes.Repeat([]byte{byte(i + 10*c.Rank())}, 1<<20)
			reqs = append(reqs, req)
			calls = append(calls, c.ICall(i%len(comms), 4, req))
		}
		for i, call := range calls {
			got, err := call.Wait(ctx)
			if err != nil || !bytes.Equal(got, reqs[i]) {
				t.Fatalf("echo %d from rank %d: err %v, reply right %v", i, c.Rank(), err, bytes.Equal(got, reqs[i]))
			}
			if &got[0] == &reqs[i][0] {
				t.Fatalf("echo %d from rank %d: the reply is the request's own memory", i, c.Rank())
			}
			call.Recycle()
			call.Recycle()
		}
	}
	big := make([]byte, 1<<20)
	for _, c := range comms {
		for peer := range comms {
			for range 3 {
				if got, err := c.CallRPC(ctx, peer, 5, big); err != nil || len(got) != len(big) {
					t.Fatalf("echo from rank %d: %v", peer, err)
				}
			}
		}
	}
	if early.Load() {
		t.Fatal("a request's buffer went back to the pool before its reply was sent")
	}
	// Releases run after the reply is sent, so the last may trail the call.
	deadline := time.Now().Add(10 * time.Second)
	for released.Load() != calls && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := released.Load(); got != calls {
		t.Fatalf("%d releases for %d lent replies", got, calls)
	}
}

// inPool reports whether b's memory is among p's idle buffers.
func inPool(p *bufPool, b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.class {
		for _, x := range l {
			if &x[:1][0] == &b[:1][0] {
				return true
			}
		}
	}
	return false
}
