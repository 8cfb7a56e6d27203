package bulk

import "testing"

// TestPresenceWord: what a ring's reader publishes (polling sessions, a
// sleep, beats while it polls) is what its producer reads back, and a
// session's end leaves it out of any call.
func TestPresenceWord(t *testing.T) {
	cons, path, cookie, err := createRing(1 << 16)
	if err != nil {
		t.Skipf("no shared-memory ring here: %v", err)
	}
	defer cons.release()
	prod, err := openRing(path, 1<<16, cookie)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.release()
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
