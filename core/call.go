package core

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// This file is the lifecycle of a collective call: its sequence number,
// signature, request and contexts (startColl, collCall), and the signature
// agreement that ends calls whose data flow need not reach every rank.

// startColl assigns the next sequence number now, in the caller's
// goroutine, and returns a request that runs body when started: in the
// caller's goroutine by wait (blocking calls), or in a goroutine of its own
// by start (non-blocking calls).
func (c *Comm) startColl(ctx context.Context, sig signature, body func(ctx context.Context, l *link) error) *Request {
	if c.deferred.Load() != nil {
		c.launchDeferred() // a later call: the earlier one runs now
	}
	op := sig.kind.String()
	sig.tuning = c.tuningDigest
	cc, _ := c.calls.Get().(*collCall)
	if cc == nil {
		cc = new(collCall)
	}
	cc.body, cc.ctx = body, ctx
	cc.posted = c.n.now()
	req := &cc.req
	req.init(c, op, true)
	c.mu.Lock()
	if c.err != nil {
		err := withOp(c.err, op)
		c.mu.Unlock()
		req.finish(Status{}, err)
		return req
	}
	seq := c.nextSeq
	c.nextSeq++
	if err := c.collDepartedLocked(op, seq); err != nil {
		if s := c.callTab.get(seq); s != nil {
			s.hasRemote = false
			c.callTab.tidy(s)
		}
		c.mu.Unlock()
		req.finish(Status{}, err)
		return req
	}
	s := c.callTab.at(seq)
	if s.hasRemote && !s.remote.matches(sig) {
		c.mismatchLocked(sig, s.from, s.remote)
	}
	s.hasRemote = false
	s.mine, s.hasMine = sig, true
	c.ops.Add(1)
	req.fr = c.flight.startColl(seq, sig, cc.posted)
	c.mu.Unlock()
	cc.l = link{c: c, seq: seq, sig: sig, cc: cc}
	req.coll = cc
	return req
}

// collCall is one collective call: its request, link and contexts in one
// allocation (a small collective costs about a microsecond, and each
// allocation a few percent of it).
type collCall struct {
	req  Request
	l    link
	op   opCtx
	ctx  context.Context
	body func(ctx context.Context, l *link) error
	// posted is when the call was made: its timeout counts from there,
	// and the flight recorder's entry starts there (one clock read).
	posted time.Time
	args   collArgs // body's arguments, for bodies that are not closures

	claimed atomic.Bool // run begun, by start's goroutine or by Wait (executeOnce)

	smu   sync.Mutex     // guards the send contexts
	sends [2]deadlineCtx // the first destinations' (most calls have one or two)
	nsend int            // sends in use
	more  []*deadlineCtx // further destinations' (kept, zeroed, past len by recycle)
}

// collArgs are a collective's arguments, held in its call so that its
// body need not be a closure (an allocation) over them.
type collArgs struct {
	send, recv []byte
	dt         collective.DType
	op         collective.Op
}

// recycle gives a blocking call's collCall back to its communicator once
// its request completed with err and nothing can refer to it any more: its
// caller (Request.wait) is done with it, and it is idle, so a call that
// waited long or failed is left to the collector.
func (cc *collCall) recycle(err error) {
	if err != nil || !cc.idle() {
		return
	}
	c := cc.l.c
	cc.reset()
	c.calls.Put(cc)
}

// idle reports whether no timer, watcher or goroutine was started on the
// call's contexts (whose callbacks could still be running): only then may
// it be reused.
func (cc *collCall) idle() bool {
	if cc.op.ch != nil {
		return false
	}
	for i := range cc.nsend {
		if cc.sends[i].ch != nil {
			return false
		}
	}
	for _, s := range cc.more {
		if s.ch != nil {
			return false
		}
	}
	return true
}

// reset zeroes the call for its next use. The send contexts past the first
// two (more) stay with it, zeroed: a barrier of 4 ranks or more (Bruck's
// allgather) sends to more than two ranks, and its call would otherwise
// allocate them every time.
func (cc *collCall) reset() {
	more := cc.more
	for _, s := range more {
		*s = deadlineCtx{}
	}
	*cc = collCall{more: more[:0]}
}

// releaseSends releases the send contexts once the call's sends are over.
func (cc *collCall) releaseSends() {
	cc.smu.Lock()
	defer cc.smu.Unlock()
	for i := range cc.nsend {
		cc.sends[i].release()
	}
	for _, s := range cc.more {
		s.release()
	}
}

// executeOnce runs the call unless another goroutine has begun it; it reports
// whether it ran it.
func (cc *collCall) executeOnce() bool {
	if !cc.claimed.CompareAndSwap(false, true) {
		return false
	}
	cc.execute()
	return true
}

// execute performs the call (once: executeOnce) and finishes its request.
func (cc *collCall) execute() {
	req, l := &cc.req, &cc.l
	c, op, seq := l.c, req.op, l.seq
	defer c.ops.Done()
	cc.op.initAt(c, cc.ctx, cc.posted)
	defer cc.op.release()
	ctx := context.Context(&cc.op)
	defer cc.releaseSends() // transport sends have their own (link.sendCtx)
	err := cc.body(ctx, l)
	if err == nil {
		l.ringCheck() // a call that only sent, never to its successor
	}
	if err != nil {
		err = c.opError(op, ctx, err)
	}
	c.mu.Lock()
	if s := c.callTab.get(seq); s != nil {
		s.hasMine = false
		c.callTab.tidy(s)
	}
	if err != nil {
		c.callTab.minFailed = min(c.callTab.minFailed, seq)
	}
	if e, ok := err.(*Error); ok && CodeOf(err) != CodeClosed && !isDeparture(err) {
		// A member's departure fails the collectives it did not
		// complete on every rank alike: not a failure of c.
		c.failAndTellLocked(e)
	}
	c.mu.Unlock()
	req.finish(Status{}, err)
}

// A small non-blocking collective (Request.start) is deferred rather than
// handed to a goroutine at once: a new goroutine waits for an idle thread
// to be woken, and the caller, who often waits at once (torch's async_op,
// then wait(); MPI_Iallreduce, then MPI_Wait), would then find it running
// elsewhere and wait for that thread's result; on a loaded host both cost
// tens of microseconds where the call takes a few. A deferred call runs in
// the first of: its waiter's goroutine (Wait: no hand-off at all); a
// goroutine when the request is tested, when any other collective starts
// on the communicator (so at most one is deferred, the last), when the
// communicator closes, or when deferWindow has passed (c.later, a timer:
// the call progresses with nobody waiting, as MPI requires). executeOnce lets
// exactly one of them run it. A collective of deferMax bytes or more
// starts in a goroutine at once: the hand-off is small beside it, and it
// overlaps the caller's computation from the start.

// deferWindow is how long a started collective may wait for its waiter
// before a goroutine runs it. The timer is armed once per window, not once
// per call (each arming may wake the runtime's poller thread), and an idle
// Go runtime fires timers at its poller's millisecond granularity anyway.
const deferWindow = time.Millisecond

// deferMax is the size (count times element size) from which a started
// collective is not deferred.
const deferMax = 256 << 10

// deferCall defers cc (Request.start): the collective deferred before it
// runs now, in a goroutine, and the timer is armed for cc if it is not
// armed.
func (c *Comm) deferCall(cc *collCall) {
	if prev := c.deferred.Swap(cc); prev != nil {
		go prev.executeOnce()
	}
	if c.laterArmed.CompareAndSwap(false, true) {
		c.armedFor.Store(cc)
		c.later.Reset(c.deferWait)
	}
}

// deferredDue is the timer's goroutine: it runs the collective it was armed
// for if that is still deferred. A call deferred since (the armed one was
// waited on, and another started) gets a window of its own: the timer is
// armed again for it, so that no call is taken from a waiter about to run
// it before deferWindow has passed.
func (c *Comm) deferredDue() {
	cur := c.deferred.Load()
	if cur != nil && cur != c.armedFor.Load() {
		c.armedFor.Store(cur)
		c.later.Reset(c.deferWait)
		return
	}
	c.armedFor.Store(nil)
	c.laterArmed.Store(false)
	mine := cur != nil && c.deferred.CompareAndSwap(cur, nil)
	// One deferred after the Load found the timer armed and left it.
	if next := c.deferred.Load(); next != nil && c.laterArmed.CompareAndSwap(false, true) {
		c.armedFor.Store(next)
		c.later.Reset(c.deferWait)
	}
	if mine {
		cur.executeOnce()
	}
}

// launchDeferred hands the deferred collective, if any, to a goroutine.
func (c *Comm) launchDeferred() {
	if cc := c.deferred.Swap(nil); cc != nil {
		go cc.executeOnce()
	}
}

// runHere runs the started collective cc in the calling goroutine if no
// goroutine has begun it and inline is true; with inline false it hands
// it to a goroutine if it is still deferred. It reports whether cc ran
// here.
func (c *Comm) runHere(cc *collCall, inline bool) bool {
	mine := c.deferred.CompareAndSwap(cc, nil)
	if !inline {
		if mine {
			go cc.executeOnce()
		}
		return false
	}
	return cc.executeOnce()
}

// exchangeSignatures is the body of collectives that move no bytes: an
// allgather of signatures, so every rank sees every call before finishing.
func exchangeSignatures(ctx context.Context, l *link) error {
	c := l.c
	if c.size == 1 {
		return nil
	}
	// From the scratch pool: a barrier before every small call is common,
	// and its garbage would run the collector in the middle of such calls.
	// The allgather writes all of recv, and on return nothing writes it.
	send, recv := c.scratch.Get(sigBytes), c.scratch.Get(sigBytes*c.size)
	defer c.scratch.Put(send)
	defer c.scratch.Put(recv)
	l.sig.put(send)
	if err := collective.Allgather(ctx, l, send, recv); err != nil {
		return err
	}
	for r := 0; r < c.size; r++ {
		if s := getSignature(recv[r*sigBytes:]); !s.matches(l.sig) {
			c.mu.Lock()
			c.mismatchLocked(l.sig, r, s)
			c.mu.Unlock()
			return c.Err()
		}
	}
	return nil
}

// startCollective starts a collective whose count may be zero, in which case only the
// signatures are exchanged.
func (c *Comm) startCollective(ctx context.Context, sig signature, body func(ctx context.Context, l *link) error) *Request {
	if sig.count == 0 {
		return c.startColl(ctx, sig, exchangeSignatures)
	}
	return c.startColl(ctx, sig, body)
}

// startAgreed is startCollective for collectives in which a rank's result need not depend
// on every other rank (rooted ones, scans): their body is followed by
// agreeSignatures. Zero-count calls exchange every signature already.
func (c *Comm) startAgreed(ctx context.Context, sig signature, body func(ctx context.Context, l *link) error) *Request {
	return c.startCollective(ctx, sig, agreed(body))
}

// agreed runs body, then agreeSignatures.
func agreed(body func(ctx context.Context, l *link) error) func(ctx context.Context, l *link) error {
	return func(ctx context.Context, l *link) error {
		if err := body(ctx, l); err != nil {
			return err
		}
		return agreeSignatures(ctx, l)
	}
}

// agreeStepBase numbers agreeSignatures' messages, far above any step a
// schedule takes (their counters start at 0 for every call).
const agreeStepBase = 1 << 31

// agreeSignatures ends a collective whose data flow need not reach every
// rank from every other: a root that only sends, a leaf of a broadcast,
// rank 0 of a scan. Such a rank could return success while ranks whose part
// of the schedule never met it fail as mismatched (different roots or
// counts). This is a dissemination round of empty messages, ceil(log2 n)
// steps; each message carries the sender's signature in its header, which
// the receiver checks on arrival, and a rank sends in step k only after its
// step k-1 message matched. Every rank hears, through such checked hops,
// from every other, so none completes while any made a different call:
// all fail as mismatched, each naming both calls.
func agreeSignatures(ctx context.Context, l *link) error {
	n, r := l.c.size, l.c.rank
	for k, step := 1, uint32(agreeStepBase); k < n; k, step = k<<1, step+1 {
		if err := l.Exchange(ctx, (r+k)%n, step, nil, (r-k+n)%n, step, nil, 1); err != nil {
			return err
		}
	}
	return nil
}
