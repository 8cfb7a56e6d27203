package hier

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/nccl"
)

// This file is the watcher and the failure flow: NCCL work in flight
// (track, wait), what ends it (abortNCCL), and how a failure reaches every
// rank and the call (fail, failCall).

// watch runs while the Comm is active: whenever a call is in progress or
// NCCL work is pending, it checks the parent, NCCL and the work's deadline
// every pollEvery.
func (h *Comm) watch() {
	defer close(h.done)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		h.wmu.Lock()
		idle := h.busy == 0 && len(h.pending) == 0
		h.wmu.Unlock()
		if idle {
			select {
			case <-h.wake:
				continue
			case <-h.stop:
				return
			}
		}
		select {
		case <-tick.C:
		case <-h.stop:
			return
		}
		h.check()
	}
}

func (h *Comm) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// check acts on what the watcher sees.
func (h *Comm) check() {
	if err := h.parent.Err(); err != nil {
		h.fail(err)
	} else if err := h.asyncError(); err != nil {
		// A peer on this host aborted its NCCL: unblock ours now, and
		// give nexar a moment to say which rank failed.
		h.wmu.Lock()
		if h.nerr == nil {
			h.nerr, h.nerrAt = err, time.Now()
		}
		h.wmu.Unlock()
		h.abortNCCL()
	}
	now := time.Now()
	h.wmu.Lock()
	late := h.reapLocked(now)
	nerr, nerrAt := h.nerr, h.nerrAt
	h.wmu.Unlock()
	switch {
	case late != nil:
		h.fail(&core.Error{Code: core.CodeTimeout, Op: late.op, Rank: h.rank,
			Msg: fmt.Sprintf("rank %d: NCCL work of %s did not complete within %v", h.rank, late.op, h.timeout)})
	case nerr != nil && now.Sub(nerrAt) > asyncGrace && h.parent.Err() == nil:
		h.fail(&core.Error{Code: core.CodeAborted, Op: "nccl", Rank: h.rank,
			Msg: fmt.Sprintf("rank %d: NCCL on this host reported %v, and nexar found no rank failed", h.rank, nerr)})
	}
}

// asyncError is NCCL's asynchronous error, or nil (also while another
// goroutine is inside NCCL: the next tick looks again).
func (h *Comm) asyncError() error {
	if !h.nmu.TryLock() {
		return nil
	}
	defer h.nmu.Unlock()
	if h.dead.Load() {
		return nil
	}
	return h.nc.AsyncError()
}

// abortNCCL aborts this host's NCCL communicator, once: its work waiting
// for a peer completes (outputs undefined) and nothing more is given to it.
func (h *Comm) abortNCCL() {
	if h.nc == nil || !h.dead.CompareAndSwap(false, true) {
		return
	}
	// An enqueue may be blocked inside NCCL (NCCL may connect to its peers
	// on a communicator's first call): ncclCommAbort is what ends it, so
	// after a short wait it goes ahead without the lock. The enqueuer
	// checks dead before touching the communicator again.
	locked := false
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if locked = h.nmu.TryLock(); locked {
			break
		}
	}
	h.nc.Abort()
	if locked {
		h.nmu.Unlock()
	}
}

// fail makes err the failure of the parent (which tells the other ranks),
// ends the Comm's own communicators' calls (which tells their members) and
// aborts NCCL. Idempotent; err keeps the first failure of each.
func (h *Comm) fail(err error) {
	if !h.failed.CompareAndSwap(false, true) {
		h.abortNCCL()
		return
	}
	var e *core.Error
	if !errors.As(err, &e) {
		e = &core.Error{Code: core.CodeInternal, Op: "nccl", Rank: h.rank, Msg: err.Error(), Cause: err}
	}
	h.parent.Abort(e)
	if h.local != nil {
		h.local.Abort(e)
	}
	for _, c := range h.cross {
		if c != nil {
			c.Abort(e)
		}
	}
	h.abortNCCL()
}

// failCall fails the Comm for a call of op that ran into err, and returns
// the error the call reports.
func (h *Comm) failCall(op string, err error) error {
	h.failFor(op, err)
	return h.callErr(op)
}

// failFor fails the Comm for a call of op that ran into err: with the
// parent's failure if it has one (a rank found dead fails the parent and
// the Comm's communicators at once), else with err, naming this rank.
func (h *Comm) failFor(op string, err error) {
	switch perr := h.parent.Err(); {
	case perr != nil:
		h.fail(perr)
	case errors.Is(err, errDiffer):
		h.fail(err)
	case !errors.Is(err, errAborted):
		code := core.CodeOf(err)
		if code == core.CodeInternal && !isCoreError(err) {
			code = core.CodeUnavailable // a CUDA or NCCL call failed: the message names it
		}
		h.fail(&core.Error{Code: code, Op: op, Rank: h.rank, Msg: fmt.Sprintf("rank %d: %v", h.rank, err), Cause: err})
	}
}

func isCoreError(err error) bool {
	var e *core.Error
	return errors.As(err, &e)
}

// callErr is the error of a call of op that found NCCL aborted: the
// parent's failure, which names the rank and what happened (waiting, at
// most asyncGrace and a little, for the watcher to set it).
func (h *Comm) callErr(op string) error {
	deadline := time.Now().Add(asyncGrace + time.Second)
	for {
		if err := h.parent.Err(); err != nil {
			return relabel(err, op)
		}
		if time.Now().After(deadline) {
			return &core.Error{Code: core.CodeAborted, Op: op, Rank: h.rank,
				Msg: fmt.Sprintf("rank %d: NCCL was aborted", h.rank)}
		}
		time.Sleep(time.Millisecond)
	}
}

// relabel returns err as a core error of op, keeping code, rank and message.
func relabel(err error, op string) error {
	var e *core.Error
	if !errors.As(err, &e) {
		return &core.Error{Code: core.CodeInternal, Op: op, Rank: -1, Msg: err.Error(), Cause: err}
	}
	if e.Op == op {
		return e
	}
	c := *e
	c.Op, c.Cause = op, e
	return &c
}

// enqueue gives NCCL work to the communicator, unless it was aborted.
func (h *Comm) enqueue(fn func(c *nccl.Comm) error) error {
	h.nmu.Lock()
	defer h.nmu.Unlock()
	if h.dead.Load() {
		return errAborted
	}
	err := fn(h.nc)
	if h.dead.Load() {
		return errAborted
	}
	return err
}

// track records the end of the work enqueued on stream so far as pending
// NCCL work of op, and returns its event.
func (h *Comm) track(op string, stream cuda.Stream) (cuda.Event, error) {
	h.wmu.Lock()
	var ev cuda.Event
	if n := len(h.events); n > 0 {
		ev = h.events[n-1]
		h.events = h.events[:n-1]
	}
	h.wmu.Unlock()
	if ev == 0 {
		var err error
		if ev, err = h.rt.EventCreate(); err != nil {
			return 0, fmt.Errorf("hier: creating an event: %w", err)
		}
	}
	if err := h.rt.EventRecord(ev, stream); err != nil {
		h.rt.EventDestroy(ev)
		return 0, fmt.Errorf("hier: recording an event on stream %#x: %w", uintptr(stream), err)
	}
	h.wmu.Lock()
	h.pending = append(h.pending, pending{ev: ev, since: time.Now(), op: op})
	h.wmu.Unlock()
	h.poke()
	return ev, nil
}

// wait waits for ev (the watcher bounds it: a late or failed call aborts
// NCCL, which completes the work).
func (h *Comm) wait(ev cuda.Event) error {
	deadline := time.Now().Add(h.timeout + asyncGrace + time.Second)
	for i := 0; ; i++ {
		done, err := h.rt.EventQuery(ev)
		if err != nil {
			return fmt.Errorf("hier: waiting for NCCL work: %w", err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hier: NCCL work still running after %v", h.timeout)
		}
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
