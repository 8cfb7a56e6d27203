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

// opCtx bounds one operation: by the caller's context, by a deadline, and
// by the communicator's failure or close. Like deadlineCtx it makes its
// channel, timer and watchers only when Done is first called, which the
// fast paths never do.
type opCtx struct {
	parent context.Context
	d      time.Time
	c      *Comm

	once  sync.Once
	ch    chan struct{}
	mu    sync.Mutex
	err   error
	stops []func() bool
	done  bool // released
}

func (c *Comm) newOpCtx(parent context.Context) *opCtx {
	o := new(opCtx)
	o.init(c, parent)
	return o
}

// init prepares a zero opCtx (one embedded in a larger allocation).
func (o *opCtx) init(c *Comm, parent context.Context) {
	if parent == nil {
		parent = context.Background()
	}
	d, ok := parent.Deadline()
	if limit := time.Now().Add(c.cfg.Timeout); !ok || limit.Before(d) {
		d = limit
	}
	o.parent, o.d, o.c = parent, d, c
}

func (o *opCtx) Deadline() (time.Time, bool) { return o.d, true }
func (o *opCtx) Value(k any) any             { return o.parent.Value(k) }

func (o *opCtx) Err() error {
	o.mu.Lock()
	err := o.err
	o.mu.Unlock()
	if err != nil {
		return err
	}
	if err := o.parent.Err(); err != nil {
		return err
	}
	if o.c.ctx.Err() != nil {
		return context.Canceled
	}
	if !time.Now().Before(o.d) {
		return context.DeadlineExceeded
	}
	return nil
}

func (o *opCtx) Done() <-chan struct{} {
	o.once.Do(func() {
		o.ch = make(chan struct{})
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.done {
			return
		}
		t := time.AfterFunc(time.Until(o.d), func() { o.cancel(context.DeadlineExceeded) })
		o.stops = append(o.stops, t.Stop,
			context.AfterFunc(o.c.ctx, func() { o.cancel(context.Canceled) }),
			context.AfterFunc(o.parent, func() { o.cancel(o.parent.Err()) }))
	})
	return o.ch
}

func (o *opCtx) cancel(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		o.err = err
		close(o.ch)
	}
}

// release stops the watchers, if any; the context must not be used after.
func (o *opCtx) release() {
	o.mu.Lock()
	o.done = true
	stops := o.stops
	o.stops = nil
	o.mu.Unlock()
	for _, s := range stops {
		s()
	}
}
