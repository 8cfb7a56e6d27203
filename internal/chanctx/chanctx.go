// Package chanctx turns a channel that is closed once into a
// context.Context, for context.AfterFunc and selects that take contexts.
// It holds no state; its values are safe for concurrent use.
package chanctx

import (
	"context"
	"time"
)

// Of returns a context that is done once ch is closed (context.Canceled),
// with no deadline and no values.
func Of(ch <-chan struct{}) context.Context { return done(ch) }

type done <-chan struct{}

func (d done) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d done) Done() <-chan struct{}       { return d }
func (d done) Err() error {
	select {
	case <-d:
		return context.Canceled
	default:
		return nil
	}
}
func (d done) Value(any) any { return nil }
