package chanctx

import (
	"context"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	ch := make(chan struct{})
	ctx := Of(ch)
	if ctx.Err() != nil {
		t.Fatal("done before the channel closed")
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(fired) })
	defer stop()
	close(ch)
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc did not run once the channel closed")
	}
	if ctx.Err() != context.Canceled {
		t.Fatalf("Err = %v, want context.Canceled", ctx.Err())
	}
}
