package core

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDeadlineCtxErrAfterDone: once Done is closed, every call of Err
// says why (the context contract), although Err reads the clock only at
// every 8th look otherwise; before the deadline it says nothing.
func TestDeadlineCtxErrAfterDone(t *testing.T) {
	c := newDeadlineCtx(time.Now().Add(20 * time.Millisecond))
	for i := range 16 {
		if err := c.Err(); err != nil {
			t.Fatalf("look %d before the deadline: %v", i, err)
		}
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10 s after a 20 ms deadline")
	}
	for i := range 16 {
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("look %d after Done closed: %v, want %v", i, err, context.DeadlineExceeded)
		}
	}
	c.release()
}

// TestContextsReleaseDisarms: a released context arms nothing, whether
// Done is first called before release (its timer is stopped) or after (no
// lock was taken by release, and Done must still arm nothing): the
// channel never closes at the deadline.
func TestContextsReleaseDisarms(t *testing.T) {
	c := newLocal(t, 1)[0]
	const d = 20 * time.Millisecond
	closes := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(5 * d):
			return false
		}
	}
	for _, doneFirst := range []bool{true, false} {
		dc := newDeadlineCtx(time.Now().Add(d))
		parent, cancel := context.WithTimeout(context.Background(), d)
		oc := c.newOpCtx(parent)
		var dch, och <-chan struct{}
		if doneFirst {
			dch, och = dc.Done(), oc.Done()
		}
		dc.release()
		oc.release()
		if !doneFirst {
			dch, och = dc.Done(), oc.Done()
		}
		if closes(dch) {
			t.Errorf("Done before release %v: a released deadline context closed at its deadline", doneFirst)
		}
		if closes(och) {
			t.Errorf("Done before release %v: a released operation context closed at its deadline", doneFirst)
		}
		cancel()
	}
}
