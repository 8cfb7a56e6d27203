package core

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is a context that ends at a deadline and is cancelled by
// nothing else. Its timer and channel are made only when Done is first
// called: most sends on a fast path never wait, and a timer per operation
// costs more than the operation.
type deadlineCtx struct {
	d    time.Time
	once sync.Once
	ch   chan struct{}
	t    *time.Timer
	mu   sync.Mutex
	stop bool
}

func newDeadlineCtx(d time.Time) *deadlineCtx { return &deadlineCtx{d: d} }

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.d, true }
func (c *deadlineCtx) Value(any) any               { return nil }

func (c *deadlineCtx) Done() <-chan struct{} {
	c.once.Do(func() {
		c.ch = make(chan struct{})
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.stop {
			return // released: never fires
		}
		c.t = time.AfterFunc(time.Until(c.d), func() { close(c.ch) })
	})
	return c.ch
}

func (c *deadlineCtx) Err() error {
	if !time.Now().Before(c.d) {
		return context.DeadlineExceeded
	}
	return nil
}

// release stops the timer, if any; the context must not be used after.
func (c *deadlineCtx) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stop = true
	if c.t != nil {
		c.t.Stop()
	}
}
