package core

import (
	"errors"
	"slices"
)

// This file is failure notification: besides failing pending and later
// calls (the sticky error), a communicator reports each member found
// failed, once, on a channel and in a list (ULFM's failure_ack and
// get_acked, NCCL's async error query, as an event stream).

// FailureEvent reports a member of a communicator found failed: dead or
// unreachable, as this rank's detector found or as another member reported
// (an abort or goodbye naming it). Err says why (CodePeerDown, Rank).
type FailureEvent struct {
	Rank int
	Err  *Error
}

// failures is a communicator's record of failed members; guarded by
// Comm.mu.
type failures struct {
	ranks  []int
	events chan FailureEvent // one slot per member: a send never blocks
	closed bool
}

func newFailures(size int) failures {
	return failures{events: make(chan FailureEvent, size)}
}

// Failures returns the channel on which c reports each member found
// failed, once per member, in the order this rank learned of them. A
// report does not wait for a reader (the channel holds one per member), and
// the channel is closed when c is closed. Failures may go on after c
// itself failed: every later loss is reported too. Safe for concurrent
// use; every call returns the same channel.
func (c *Comm) Failures() <-chan FailureEvent { return c.lost.events }

// Failed returns the ranks of the members found failed so far, in the
// order Failures reports them. Safe for concurrent use.
func (c *Comm) Failed() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.lost.ranks...)
}

// noteFailureLocked records the failure err if it names a member other
// than this rank as dead or unreachable. Called with c.mu held.
func (c *Comm) noteFailureLocked(err error) {
	var e *Error
	if !errors.As(err, &e) || e.Code != CodePeerDown {
		return
	}
	f := &c.lost
	r := e.Rank
	if r < 0 || r >= c.size || r == c.rank || f.closed || slices.Contains(f.ranks, r) {
		return
	}
	f.ranks = append(f.ranks, r)
	f.events <- FailureEvent{Rank: r, Err: e}
	c.suspectLocked(r)
}

// closeFailuresLocked ends the stream (Close). Called with c.mu held.
func (c *Comm) closeFailuresLocked() {
	if !c.lost.closed {
		c.lost.closed = true
		close(c.lost.events)
	}
}
