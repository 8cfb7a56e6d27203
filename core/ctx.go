package core

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// deadlineCtx is a context that ends at a deadline and, when down is set,
// when the detector declares the destination of the sends it bounds down;
// nothing else cancels it. Its timer and channel are made only when Done is
// first called: most sends on a fast path never wait, and a timer per
// operation costs more than the operation.
type deadlineCtx struct {
	d    time.Time
	down *downSignal // nil: the deadline only
	peer int         // the world rank down is for
	once sync.Once
	ch   chan struct{}
	t    *time.Timer
	mu   sync.Mutex
	cut  func() bool // stops the watch on down

	looks deadlineLooks
	fired atomic.Bool // ch closed (written under mu): Err says why at every call from then on
	// watched is set by Done before it arms anything, released by
	// release: a release that finds Done never called is two atomics,
	// not a lock (sequentially consistent: either release sees watched,
	// or Done sees released and arms nothing).
	watched, released atomic.Bool
}

func newDeadlineCtx(d time.Time) *deadlineCtx { return &deadlineCtx{d: d} }

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.d, true }
func (c *deadlineCtx) Value(any) any               { return nil }

func (c *deadlineCtx) Done() <-chan struct{} {
	c.once.Do(func() {
		c.ch = make(chan struct{})
		c.watched.Store(true)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.released.Load() {
			return // released: never fires
		}
		c.t = time.AfterFunc(time.Until(c.d), c.close)
		if c.down != nil {
			// The node's signal is a cancelCtx: AfterFunc registers
			// with it, no goroutine.
			c.cut = context.AfterFunc(c.down.ctx, c.close)
		}
	})
	return c.ch
}

func (c *deadlineCtx) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fired.Load() {
		c.fired.Store(true)
		close(c.ch)
	}
}

func (c *deadlineCtx) Err() error {
	if c.down != nil && c.down.is.Load() {
		return c.down.err
	}
	if c.fired.Load() || c.looks.passed(c.d) {
		return context.DeadlineExceeded
	}
	return nil
}

// deadlineLooks counts the looks at a context's deadline by Err, which
// reads the clock at the first look and at every 8th after: Err is asked
// once or more per message, and a clock read costs 20-40 ns on a VM
// against about a microsecond for an 8 B collective, while a deadline is
// seconds away and whoever waits for it asks again and again (every loop
// that waits calls Err, or reads the clock itself). Safe for concurrent
// use.
type deadlineLooks struct{ n atomic.Uint32 }

// passed reports whether d has passed, as far as this look tells.
func (l *deadlineLooks) passed(d time.Time) bool {
	// time.Until reads only the monotonic clock when d carries a
	// monotonic reading (the deadlines here do), time.Now both clocks.
	return l.n.Add(1)&7 == 1 && time.Until(d) <= 0
}

// release stops the timer and the watch, if any; the context must not be
// used after.
func (c *deadlineCtx) release() {
	c.released.Store(true)
	if !c.watched.Load() {
		return // nothing armed, and Done arms nothing from now on
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t != nil {
		c.t.Stop()
	}
	if c.cut != nil {
		c.cut()
	}
}

// downSignal tells, for one world rank, that the detector declared it down
// (node.peerDown; not a graceful departure). Safe for concurrent use.
type downSignal struct {
	ctx    context.Context // cancelled when declared down
	cancel context.CancelFunc
	is     atomic.Bool
	err    error // set before is: a *sendDownError
}

// sendDownError ends a transport send to a world rank declared down. It is
// a *transport.PeerDownError naming the rank and a context.Canceled, so
// that a transport treats it as a cancelled send.
type sendDownError struct{ pd *transport.PeerDownError }

func (e *sendDownError) Error() string   { return e.pd.Error() }
func (e *sendDownError) Unwrap() []error { return []error{e.pd, context.Canceled} }

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

	looks deadlineLooks
	// canceled is set once err is (under mu): Err takes mu only then.
	// watched and released are deadlineCtx's: a release with Done never
	// called takes no lock.
	canceled, watched, released atomic.Bool
}

func (c *Comm) newOpCtx(parent context.Context) *opCtx {
	o := new(opCtx)
	o.init(c, parent)
	return o
}

// init prepares a zero opCtx (one embedded in a larger allocation).
func (o *opCtx) init(c *Comm, parent context.Context) { o.initAt(c, parent, time.Now()) }

// initAt is init for an operation begun at now: Config.Timeout counts
// from there.
func (o *opCtx) initAt(c *Comm, parent context.Context, now time.Time) {
	if parent == nil {
		parent = context.Background()
	}
	d, ok := parent.Deadline()
	if limit := now.Add(c.cfg.Timeout); !ok || limit.Before(d) {
		d = limit
	}
	o.parent, o.d, o.c = parent, d, c
}

func (o *opCtx) Deadline() (time.Time, bool) { return o.d, true }
func (o *opCtx) Value(k any) any             { return o.parent.Value(k) }

func (o *opCtx) Err() error {
	if o.canceled.Load() {
		o.mu.Lock()
		err := o.err
		o.mu.Unlock()
		return err
	}
	if err := o.parent.Err(); err != nil {
		return err
	}
	if o.c.ctx.Err() != nil {
		return context.Canceled
	}
	if o.looks.passed(o.d) {
		return context.DeadlineExceeded
	}
	return nil
}

func (o *opCtx) Done() <-chan struct{} {
	o.once.Do(func() {
		o.ch = make(chan struct{})
		o.watched.Store(true)
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.released.Load() {
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
		o.canceled.Store(true)
		close(o.ch)
	}
}

// release stops the watchers, if any; the context must not be used after.
func (o *opCtx) release() {
	o.released.Store(true)
	if !o.watched.Load() {
		return // nothing armed, and Done arms nothing from now on
	}
	o.mu.Lock()
	stops := o.stops
	o.stops = nil
	o.mu.Unlock()
	for _, s := range stops {
		s()
	}
}
