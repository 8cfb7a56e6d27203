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
