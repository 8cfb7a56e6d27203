package core

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/nexar-go/nexar/core/internal/match"
)

// Request is a pending non-blocking operation. Wait, Test and Status are
// safe for concurrent use. The buffers given to the operation must stay
// untouched until it completes. A small non-blocking collective runs in
// the goroutine that first waits for it if nothing has begun it by then,
// else in a goroutine of its own (call.go, deferCall).
type Request struct {
	c      *Comm
	op     string
	worker bool // a goroutine runs the op and finishes the request itself
	// done is the channel closed when the request completes, made only
	// when someone waits on it (doneCh): a blocking call, run in its
	// caller's goroutine, completes before anyone looks and costs none.
	done match.Signal
	// finishing is claimed by the one finish that completes the request
	// (a CAS: sync.Once's first Do takes a mutex, on every call).
	finishing atomic.Bool
	err       error
	st        Status
	// pendingOp, when set, is the operation, not begun yet; it is taken
	// (by the goroutine that created the request, before the request is
	// shared) by start or wait, and runs exactly once.
	pendingOp func()
	coll      *collCall // a collective not yet started: run by start or wait like pendingOp
	// started is the collective that start deferred (call.go, deferCall):
	// Wait runs it itself if no goroutine has begun it (executeOnce), as a
	// blocking call would. Set before the request is shared.
	started *collCall
	src     int    // a receive's source (AnySource allowed), else noSource
	fr      uint64 // the operation's flight record entry (core/flight.go); 0: none
}

// noSource marks requests that are not receives.
const noSource = -2

func newRequest(c *Comm, op string, worker bool) *Request {
	r := new(Request)
	r.init(c, op, worker)
	return r
}

// init prepares a zero Request (one embedded in a larger allocation).
func (r *Request) init(c *Comm, op string, worker bool) {
	r.c, r.op, r.worker, r.src = c, op, worker, noSource
}

// doneCh returns the channel closed when r completes.
func (r *Request) doneCh() <-chan struct{} { return r.done.C() }

// fired and ch make r a completion (for spin and await).
func (r *Request) fired() bool         { return r.done.Fired() }
func (r *Request) ch() <-chan struct{} { return r.done.C() }

func doneRequest(c *Comm, op string, err error) *Request {
	r := newRequest(c, op, false)
	r.finish(Status{}, err)
	return r
}

// finish completes r with st and err, once: a later finish returns once r
// is complete, with what the first one set (as sync.Once.Do would).
func (r *Request) finish(st Status, err error) {
	if !r.finishing.CompareAndSwap(false, true) {
		<-r.done.C()
		return
	}
	r.st, r.err = st, err
	if r.fr != 0 {
		r.c.flightEnd(r.fr, err)
	}
	r.done.Fire()
}

// failedCh is the channel that ends a wait early: the comm's failure for
// requests no goroutine finishes (receives), nil otherwise.
func (r *Request) failedCh() <-chan struct{} {
	if r.worker || r.c == nil {
		return nil
	}
	return r.c.failed
}

// Wait blocks until the operation completes or ctx ends (a ctx without a
// deadline gets the communicator's Timeout). When ctx ends first, Wait
// returns a CodeTimeout error and the operation stays pending.
func (r *Request) Wait(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	// Only a wait that nothing but the communicator's timeout bounds may
	// run the operation itself (which the same timeout bounds): a caller's
	// deadline or cancellation must end the wait, not the operation.
	mayRun := ctx.Done() == nil
	if cc := r.started; cc != nil && mayRun && r.c.runHere(cc, true) {
		// A started collective that no goroutine had begun, run here as a
		// blocking call would be (deferCall): it finished r.
		return r.err
	}
	if _, ok := ctx.Deadline(); !ok && r.c != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.c.cfg.Timeout)
		defer cancel()
	}
	if r.src != noSource && r.c != nil {
		// A receive: progress it, then let the transport know we block.
		if r.src == AnySource || !(r.c.spin(r.src, r) || r.c.await(ctx, r.src, r)) {
			defer r.c.blocking(r.src)()
		}
	} else if r.worker && r.c != nil {
		// One running elsewhere often ends within a short spin, and waking
		// this goroutine (an OS thread that called in from C) after it
		// blocked costs more. Under a caller's deadline a deferred
		// collective is handed to a goroutine first.
		if cc := r.started; cc != nil {
			r.c.runHere(cc, false)
		}
		r.c.spinDone(r)
	}
	select {
	case <-r.doneCh():
		return r.err
	case <-r.failedCh():
		return r.failedErr()
	case <-ctx.Done():
		select {
		case <-r.doneCh():
			return r.err
		default:
		}
		return &Error{Code: CodeTimeout, Op: r.op, Rank: -1,
			Msg: fmt.Sprintf("wait: %v (the operation is still pending)", ctx.Err()), Cause: ctx.Err()}
	}
}

// start begins a non-blocking call: an operation with its own pendingOp
// in a goroutine of its own; a small collective is deferred (call.go,
// deferCall): run by its waiter, or in a goroutine once anything else
// happens on the communicator or a short while has passed; a large one in
// a goroutine of its own.
func (r *Request) start() *Request {
	if f := r.pendingOp; f != nil {
		r.pendingOp = nil
		go f()
	}
	if cc := r.coll; cc != nil {
		r.coll = nil
		r.started = cc
		if sig := &cc.l.sig; sig.count*uint64(sig.dt.Size()) < deferMax {
			r.c.deferCall(cc)
		} else {
			go cc.executeOnce()
		}
	}
	return r
}

// launch is start with a collective handed to a goroutine at once (an
// internal pipeline whose caller overlaps work with it: bucket.go).
func (r *Request) launch() *Request {
	if cc := r.coll; cc != nil {
		r.coll = nil
		r.started = cc
		go cc.executeOnce()
	}
	return r.start()
}

// wait runs the operation in the calling goroutine if it has not started
// (blocking calls: no goroutine hand-off), then blocks until it completes;
// the operation bounds itself.
func (r *Request) wait() error {
	if f := r.pendingOp; f != nil {
		r.pendingOp = nil
		f()
	}
	if cc := r.coll; cc != nil {
		r.coll = nil
		cc.execute() // finishes r, which is &cc.req: the call is over
		err := r.err
		cc.recycle(err) // r is not to be touched after this
		return err
	}
	select {
	case <-r.doneCh():
		return r.err
	case <-r.failedCh():
		return r.failedErr()
	}
}

func (r *Request) failedErr() error {
	select {
	case <-r.doneCh():
		return r.err
	default:
	}
	r.finish(Status{}, r.c.failure(r.op))
	return r.err
}

// Test reports whether the operation has completed and, if so, its error.
// For a receive it first takes in what has arrived from its source (MPI
// semantics: testing makes progress).
func (r *Request) Test() (done bool, err error) {
	if r.src >= 0 && r.c != nil {
		r.c.pollOnce(r.src)
	}
	if cc := r.started; cc != nil {
		r.c.runHere(cc, false) // testing starts a deferred collective
	}
	select {
	case <-r.doneCh():
		return true, r.err
	case <-r.failedCh():
		return true, r.failedErr()
	default:
		return false, nil
	}
}

// Status describes a completed receive (zero for other operations).
func (r *Request) Status() Status {
	select {
	case <-r.doneCh():
		return r.st
	default:
		return Status{}
	}
}
