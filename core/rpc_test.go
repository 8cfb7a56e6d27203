package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport/mem"
)

func echo(rank int) RPCHandler {
	return func(_ context.Context, from int, req []byte) ([]byte, error) {
		return append([]byte(fmt.Sprintf("%d<-%d:", rank, from)), req...), nil
	}
}

// Every rank calls every rank (itself too), many calls in flight at once;
// each reply is the one for its request: in memory, and over QUIC (the RPC
// lane's own streams) with the shared-memory data path beside it.
func TestRPCCalls(t *testing.T) {
	t.Run("mem", func(t *testing.T) { testRPCCalls(t, newLocal(t, 3)) })
	t.Run("quic", func(t *testing.T) {
		comms, err := testNewLocalQUIC(3, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer closeAll(t, comms)
		testRPCCalls(t, comms)
	})
}

func testRPCCalls(t *testing.T, comms []*Comm) {
	for _, c := range comms {
		c.Register(1, echo(c.Rank()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mustAll(t, each(comms, func(c *Comm) error {
		var calls []*Call
		for i := range 50 {
			calls = append(calls, c.ICall(i%c.Size(), 1, []byte(fmt.Sprint(i))))
		}
		for i, call := range calls {
			got, err := call.Wait(ctx)
			if err != nil {
				return err
			}
			if want := fmt.Sprintf("%d<-%d:%d", i%c.Size(), c.Rank(), i); string(got) != want {
				return fmt.Errorf("call %d: reply %q, want %q", i, got, want)
			}
		}
		return nil
	}))
}

func TestRPCErrors(t *testing.T) {
	comms := newLocal(t, 2)
	server := comms[1]
	server.Register(2, func(context.Context, int, []byte) ([]byte, error) {
		return nil, &Error{Code: CodeUnavailable, Msg: "no such model"}
	})
	server.Register(3, func(context.Context, int, []byte) ([]byte, error) { return nil, errors.New("plain failure") })
	server.Register(4, func(context.Context, int, []byte) ([]byte, error) { panic("boom") })
	server.Register(5, func(ctx context.Context, _ int, _ []byte) ([]byte, error) {
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
		}
		return []byte("late"), nil
	})
	ctx := context.Background()
	for _, tc := range []struct {
		fn   uint32
		code Code
		msg  string
	}{
		{9, CodeInvalidArgument, "rank 1 has no handler for function 9"},
		{2, CodeUnavailable, "rank 1, function 2: no such model"},
		{3, CodeInternal, "plain failure"},
		{4, CodeInternal, "handler panicked: boom"},
	} {
		_, err := comms[0].CallRPC(ctx, 1, tc.fn, nil)
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Rank != 1 || !strings.Contains(e.Msg, tc.msg) {
			t.Errorf("function %d: got %v, want %v naming rank 1 and %q", tc.fn, err, tc.code, tc.msg)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := comms[0].CallRPC(short, 1, 5, nil); CodeOf(err) != CodeTimeout || time.Since(start) > 2*time.Second {
		t.Errorf("deadline: %v after %v, want CodeTimeout at once", err, time.Since(start))
	}
	// A non-blocking call with a deadline ends at it, with nobody waiting.
	dl, cancelDL := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelDL()
	call := comms[0].ICallContext(dl, 1, 5, nil)
	if done, _, _ := call.Test(); done {
		t.Errorf("ICallContext: done at once")
	}
	select {
	case <-call.Done():
		if done, _, err := call.Test(); !done || CodeOf(err) != CodeTimeout {
			t.Errorf("ICallContext past its deadline: done %v, %v; want CodeTimeout", done, err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("ICallContext: not done 2 s after its 100 ms deadline")
	}
	// One that finishes in time is not failed by its deadline later.
	long, cancelLong := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancelLong()
	ok := comms[0].ICallContext(long, 1, 9, nil)
	<-ok.Done()
	time.Sleep(200 * time.Millisecond)
	if _, _, err := ok.Test(); CodeOf(err) != CodeInvalidArgument {
		t.Errorf("ICallContext to an unknown function: %v, want CodeInvalidArgument", err)
	}
	if _, err := comms[0].CallRPC(ctx, 7, 1, nil); CodeOf(err) != CodeInvalidArgument {
		t.Errorf("peer out of range: %v", err)
	}
	// The communicator still works after all that.
	server.Register(1, echo(1))
	if got, err := comms[0].CallRPC(ctx, 1, 1, []byte("x")); err != nil || string(got) != "1<-0:x" {
		t.Errorf("after the errors: %q, %v", got, err)
	}
}

// A call to a rank that dies before it replies fails naming that rank,
// and so does a call made after.
func TestRPCPeerDown(t *testing.T) {
	comms, err := testNewLocal(3, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	entered := make(chan struct{})
	comms[2].Register(1, func(ctx context.Context, _ int, _ []byte) ([]byte, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	call := comms[0].ICall(2, 1, nil)
	<-entered
	mem.Kill(comms[2].n.ep)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-call.Done(): // Done alone, without Wait, ends
	case <-ctx.Done():
		t.Fatal("the call to the dead rank never ended")
	}
	if _, err := call.Wait(ctx); CodeOf(err) != CodePeerDown || !strings.Contains(err.Error(), "rank 2") {
		t.Fatalf("got %v, want CodePeerDown naming rank 2", err)
	}
	if _, err := comms[1].CallRPC(ctx, 0, 1, nil); CodeOf(err) != CodePeerDown {
		t.Fatalf("a later call: %v, want the communicator's failure", err)
	}
}

// No more than Config.RPCHandlers handlers run at once.
func TestRPCHandlerBound(t *testing.T) {
	cfg := testConfig()
	cfg.RPCHandlers = 2
	comms, err := testNewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	var now, most atomic.Int32
	comms[1].Register(1, func(context.Context, int, []byte) ([]byte, error) {
		n := now.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		now.Add(-1)
		return nil, nil
	})
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := comms[0].CallRPC(context.Background(), 1, 1, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m != 2 {
		t.Fatalf("%d handlers ran at once, want the bound, 2", m)
	}
}

// A handler that blocks does not hold up collectives, and RPC works on a
// split communicator with its own ranks.
func TestRPCBesideCollectives(t *testing.T) {
	comms := newLocal(t, 4)
	release := make(chan struct{})
	comms[1].Register(1, func(context.Context, int, []byte) ([]byte, error) {
		<-release
		return []byte("done"), nil
	})
	call := comms[0].ICall(1, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mustAll(t, each(comms, func(c *Comm) error {
		return c.Allreduce(ctx, nil, make([]byte, 1<<16), collective.Float32, collective.Sum)
	}))
	close(release)
	if got, err := call.Wait(ctx); err != nil || string(got) != "done" {
		t.Fatalf("%q, %v", got, err)
	}
	kids := make([]*Comm, 4)
	mustAll(t, each(comms, func(c *Comm) error {
		k, err := c.Split(ctx, c.Rank()%2, -c.Rank()) // reversed order
		kids[c.Rank()] = k
		if err == nil {
			k.Register(7, echo(k.Rank()))
		}
		return err
	}))
	defer func() {
		for _, k := range kids {
			k.Close()
		}
	}()
	// Odd child: world 3 is rank 0, world 1 is rank 1.
	got, err := kids[3].CallRPC(ctx, 1, 7, []byte("k"))
	if err != nil || !bytes.Equal(got, []byte("1<-0:k")) {
		t.Fatalf("split: %q, %v", got, err)
	}
}

// TestRPCOnShrunkComm: after a member dies, the survivors' communicator
// serves RPC between its own ranks (renumbered), and a call to the dead
// rank on the old one fails naming it.
func TestRPCOnShrunkComm(t *testing.T) {
	comms := newRecoverLocal(t, 3, PolicyManual)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mem.Kill(comms[1].n.ep)
	if _, err := comms[0].CallRPC(ctx, 1, 7, []byte("x")); CodeOf(err) != CodePeerDown {
		t.Fatalf("call to the dead rank: %v, want CodePeerDown", err)
	}
	kids := shrinkAll(t, []*Comm{comms[0], comms[2]})
	for _, k := range kids {
		k.Register(7, echo(k.Rank()))
	}
	// Old rank 2 is rank 1 of the survivors.
	got, err := kids[0].CallRPC(ctx, 1, 7, []byte("s"))
	if err != nil || !bytes.Equal(got, []byte("1<-0:s")) {
		t.Fatalf("shrunk: %q, %v", got, err)
	}
	got, err = kids[1].CallRPC(ctx, 0, 7, []byte("t"))
	if err != nil || !bytes.Equal(got, []byte("0<-1:t")) {
		t.Fatalf("shrunk, the other way: %q, %v", got, err)
	}
}
