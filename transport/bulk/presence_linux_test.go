package bulk

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// TestPresenceWord: what a ring's reader publishes (polling sessions, a
// sleep, beats while it polls) is what its producer reads back, and a
// session's end leaves it out of any call.
func TestPresenceWord(t *testing.T) {
	cons, prod := ringPair(t)
	var p presence
	p.add(cons)
	read := func() (state uint64, cpu int, beat uint32) {
		v := prod.presence()
		return v & 0xff, int(uint16(v>>8)) - 1, uint32(v >> 24)
	}
	if v := prod.presence(); v != 0 {
		t.Fatalf("presence %#x before anything was published", v)
	}
	p.enter()
	st, cpu, b1 := read()
	if st != presPolling || b1 == 0 || cpu < -1 {
		t.Fatalf("in a polling session: state %d cpu %d beat %d", st, cpu, b1)
	}
	p.enter() // a second goroutine polls too: nothing changes
	p.leave()
	if st, _, _ := read(); st != presPolling {
		t.Fatalf("one of two sessions ended: state %d, want polling", st)
	}
	p.publish(presAsleep)
	if st, _, b2 := read(); st != presAsleep || b2 == b1 {
		t.Fatalf("asleep: state %d beat %d (was %d)", st, b2, b1)
	}
	p.leave()
	if st, _, _ := read(); st != 0 {
		t.Fatalf("every session ended: state %d, want 0", st)
	}
	p.clear()
	before := prod.presence()
	p.enter() // rings cleared: nothing is written (they may be unmapped)
	p.leave()
	if prod.presence() != before {
		t.Fatal("published after clear")
	}
}

// TestPresenceInProcess: ranks of one process know each other as such from
// their hellos (Presence.InProcess), so that core's waiter does not yield
// its thread for a peer that is a goroutine of the same runtime.
func TestPresenceInProcess(t *testing.T) {
	got := make(chan struct{}, 2)
	h := func(_ int, lane transport.Lane, _ *transport.Header, _ []byte) {
		if lane == transport.LaneData {
			got <- struct{}{}
		}
	}
	eps := mesh(t, 2, Options{Mode: ModeSHM}, []transport.Handler{h, h}, nil)
	defer eps[1].Close()
	defer eps[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, e := range eps { // a message each way makes the rings
		if err := e.Send(ctx, 1-i, transport.LaneData, nil, []byte{1}); err != nil {
			t.Fatal(err)
		}
		<-got
	}
	for i, e := range eps {
		peer := 1 - i
		stop := func() {}
		if poll, s := eps[peer].StartPolling(i); poll != nil {
			stop = s // the peer publishes its presence in the ring it reads
		}
		p, ok := e.PeerPresence(peer)
		stop()
		if !ok || !p.InProcess {
			t.Fatalf("rank %d: PeerPresence(%d) = %+v, %v; want a presence marked InProcess", i, peer, p, ok)
		}
	}
}

// TestWaitingBeforeRing: a goroutine that blocks on a peer's data before
// the peer's ring exists (rings are made by the first message) is counted
// on the ring once it is made, so that the producer wakes the ring's reader
// for what it writes. Before, such a wait was counted nowhere and the data
// waited for the reader's next timed wake-up (up to 200 ms).
func TestWaitingBeforeRing(t *testing.T) {
	got := make(chan []byte, 4)
	h := []transport.Handler{nil, func(from int, lane transport.Lane, hd *transport.Header, p []byte) {
		got <- bytes.Clone(p)
	}}
	eps := mesh(t, 2, Options{Mode: ModeSHM, RingSize: 1 << 20}, h, nil)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	if eps[1].polled[0].Load() != nil {
		t.Fatal("a ring from rank 0 before its first message")
	}
	done := eps[1].Waiting(0) // no ring yet: counted, not on a ring
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eps[0].Send(ctx, 1, transport.LaneData, &transport.Header{}, []byte("first")); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if string(p) != "first" {
			t.Fatalf("got %q", p)
		}
	case <-ctx.Done():
		t.Fatal("first message not delivered")
	}
	ch := eps[1].polled[0].Load()
	if ch == nil {
		t.Fatal("no ring from rank 0 after its first message")
	}
	if n := atomic.LoadUint32(ch.ring.u32(offWaiting)); n != 1 {
		t.Fatalf("the ring counts %d waiting goroutines, want 1 (the wait began before the ring)", n)
	}
	done()
	if n := atomic.LoadUint32(ch.ring.u32(offWaiting)); n != 0 {
		t.Fatalf("the ring counts %d waiting goroutines after the wait ended, want 0", n)
	}
	done2 := eps[1].Waiting(0) // a ring now: counted on it at once
	if n := atomic.LoadUint32(ch.ring.u32(offWaiting)); n != 1 {
		t.Fatalf("the ring counts %d waiting goroutines, want 1", n)
	}
	done2()
	if n := atomic.LoadUint32(ch.ring.u32(offWaiting)); n != 0 {
		t.Fatalf("the ring counts %d waiting goroutines after the wait ended, want 0", n)
	}
}
