package core

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// A started collective that nobody waits on still runs (call.go,
// deferCall): rank 1's blocking allreduce completes while rank 0 only
// started its own, and rank 0's result is there when it waits later.
func TestStartedCollectiveProgressesUnwaited(t *testing.T) {
	comms := newLocal(t, 2)
	in0 := make([]byte, 8)
	binary.LittleEndian.PutUint64(in0, 5)
	req := comms[0].IAllreduce(nil, in0, collective.Int64, collective.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	in1 := make([]byte, 8)
	binary.LittleEndian.PutUint64(in1, 7)
	if err := comms[1].Allreduce(ctx, nil, in1, collective.Int64, collective.Sum); err != nil {
		t.Fatalf("rank 1, with rank 0's allreduce started and not waited on: %v", err)
	}
	if got := binary.LittleEndian.Uint64(in1); got != 12 {
		t.Fatalf("rank 1 got %d, want 12", got)
	}
	// Rank 0's call ran without a waiter: its request is done before Wait.
	deadline := time.Now().Add(20 * time.Second)
	for {
		done, err := req.Test()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 0's started allreduce never completed")
		}
		time.Sleep(time.Millisecond)
	}
	if err := req.Wait(context.Background()); err != nil || binary.LittleEndian.Uint64(in0) != 12 {
		t.Fatalf("rank 0: %v, %d; want 12", err, binary.LittleEndian.Uint64(in0))
	}
}

// At most one started collective is deferred: starting (or calling)
// another hands the earlier one to a goroutine; the waiter runs the last
// itself. Waited in any order, every result is right.
func TestStartedCollectivesDeferOne(t *testing.T) {
	comms := newLocal(t, 2)
	for _, c := range comms {
		// No timer takes a call between its start and the check below:
		// on a loaded machine a millisecond passed there, and the check
		// failed (and the other rank waited for its peer until the
		// deadline).
		c.deferWait = time.Hour
	}
	const k = 4
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := comms[r]
			bufs := make([][]byte, k)
			reqs := make([]*Request, k)
			for i := range k {
				bufs[i] = make([]byte, 8)
				binary.LittleEndian.PutUint64(bufs[i], uint64(10*i+r))
				reqs[i] = c.IAllreduce(nil, bufs[i], collective.Int64, collective.Sum)
				if got := c.deferred.Load(); got != reqs[i].started {
					errs[r] = fmt.Errorf("after start %d the deferred call is %p, want %p", i, got, reqs[i].started)
					return
				}
			}
			order := []int{3, 1, 0, 2}
			if r == 1 {
				order = []int{0, 1, 2, 3}
			}
			for _, i := range order {
				if err := reqs[i].Wait(context.Background()); err != nil {
					errs[r] = err
					return
				}
				if got, want := binary.LittleEndian.Uint64(bufs[i]), uint64(20*i+1); got != want {
					errs[r] = fmt.Errorf("call %d: %d, want %d", i, got, want)
					return
				}
			}
			if c.deferred.Load() != nil {
				errs[r] = fmt.Errorf("a call is still deferred after every wait")
			}
		}()
	}
	wg.Wait()
	mustAll(t, errs)
}

// Closing a communicator with a deferred collective fails that collective
// (closed) at once instead of waiting for it.
func TestCloseWithDeferredCollective(t *testing.T) {
	comms, err := testNewLocal(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	req := comms[0].IAllreduce(nil, make([]byte, 8), collective.Int64, collective.Sum)
	start := time.Now()
	comms[0].Close()
	comms[1].Close()
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Close took %v with a deferred collective", took)
	}
	if err := req.Wait(context.Background()); CodeOf(err) != CodeClosed && CodeOf(err) != CodePeerDown {
		t.Fatalf("the deferred allreduce after Close: %v, want closed", err)
	}
}

// A started collective of deferMax bytes or more is not deferred: it starts
// in a goroutine at once and overlaps the caller's computation.
func TestLargeStartedCollectiveNotDeferred(t *testing.T) {
	comms := newLocal(t, 2)
	var reqs [2]*Request
	bufs := [2][]byte{make([]byte, deferMax), make([]byte, deferMax)}
	for r := range comms {
		reqs[r] = comms[r].IAllreduce(nil, bufs[r], collective.Float32, collective.Sum)
		if comms[r].deferred.Load() != nil {
			t.Fatalf("rank %d: a %d-byte allreduce was deferred", r, deferMax)
		}
	}
	for r, q := range reqs {
		if err := q.Wait(context.Background()); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
