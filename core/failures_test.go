package core

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport/mem"
)

// Every survivor's communicators (the world and a split child) report each
// dead member once, by channel and by list, with its rank in their
// numbering, including a death after the communicator had already failed;
// no call needs to be in progress. The channel closes with the
// communicator.
func TestFailureNotification(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 50*time.Millisecond, 500*time.Millisecond
	comms, err := testNewLocal(4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	// A child of ranks 1, 2, 3 (in that order: key = world rank), color 0.
	kids := make([]*Comm, 4)
	errs := each(comms, func(c *Comm) error {
		color := 0
		if c.Rank() == 0 {
			color = -1
		}
		k, err := c.Split(context.Background(), color, c.Rank())
		kids[c.Rank()] = k
		return err
	})
	mustAll(t, errs)
	if kids[0] != nil {
		t.Fatal("rank 0 got a child with a negative color")
	}
	defer func() {
		for _, k := range kids[1:] {
			k.Close()
		}
	}()
	recv := func(c *Comm) FailureEvent {
		t.Helper()
		select {
		case ev := <-c.Failures():
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("rank %d: no failure reported", c.Rank())
			return FailureEvent{}
		}
	}
	mem.Kill(comms[3].n.ep)
	for _, c := range comms[:3] {
		ev := recv(c)
		if ev.Rank != 3 || ev.Err == nil || ev.Err.Code != CodePeerDown || ev.Err.Rank != 3 {
			t.Errorf("world rank %d: event %+v, want rank 3 down", c.Rank(), ev)
		}
	}
	for _, k := range kids[1:3] {
		if ev := recv(k); ev.Rank != 2 { // world rank 3 is the child's rank 2
			t.Errorf("child rank %d: event for rank %d, want 2", k.Rank(), ev.Rank)
		}
	}
	// The world has failed; a second death is reported all the same.
	mem.Kill(comms[2].n.ep)
	for _, c := range comms[:2] {
		if ev := recv(c); ev.Rank != 2 {
			t.Errorf("world rank %d: second event for rank %d, want 2", c.Rank(), ev.Rank)
		}
		if got := c.Failed(); !slices.Equal(got, []int{3, 2}) {
			t.Errorf("world rank %d: Failed() = %v, want [3 2]", c.Rank(), got)
		}
		select {
		case ev := <-c.Failures():
			t.Errorf("world rank %d: a failure reported twice: %+v", c.Rank(), ev)
		default:
		}
	}
	comms[0].Close()
	select {
	case _, ok := <-comms[0].Failures():
		if ok {
			t.Error("an event after Close")
		}
	case <-time.After(5 * time.Second):
		t.Error("Failures not closed by Close")
	}
}
