package bulk

import (
	"context"
	"sync/atomic"
	"time"
)

// sendLock serialises the frames of a channel: a lock whose wait can be
// given up (the caller's context, the channel's end). Uncontended it costs
// two atomics; the buffered channel it replaced took that channel's
// runtime lock twice per frame, 20-30 ns of a small message's microsecond.
// Safe for concurrent use; make it with newSendLock.
//
// A waiter counts itself (nwait) before it tries the lock again, and
// unlock reads the count after it frees the lock, both sequentially
// consistent: either unlock sees the waiter and leaves it a wake-up, or
// the waiter's try sees the lock free. A wake-up nobody takes stays in
// wake and only costs a later waiter one more try.
type sendLock struct {
	held  atomic.Int32
	nwait atomic.Int32
	wake  chan struct{} // capacity 1
}

func newSendLock() *sendLock { return &sendLock{wake: make(chan struct{}, 1)} }

// lockResult says how lock ended.
type lockResult int

const (
	locked    lockResult = iota
	cancelled            // done was closed first
	ended                // dead was closed first
)

// tryLock takes l if it is free.
func (l *sendLock) tryLock() bool { return l.held.CompareAndSwap(0, 1) }

// lock takes l, or gives up once done or dead is closed (either may be
// nil: never).
func (l *sendLock) lock(done, dead <-chan struct{}) lockResult {
	if l.tryLock() {
		return locked
	}
	return l.wait(done, dead)
}

// wait is lock's contended path.
func (l *sendLock) wait(done, dead <-chan struct{}) lockResult {
	l.nwait.Add(1)
	defer l.nwait.Add(-1)
	for {
		if l.tryLock() {
			return locked
		}
		select {
		case <-l.wake:
		case <-done:
			return cancelled
		case <-dead:
			return ended
		}
	}
}

// lockCtx is lock bounded by ctx; it returns ctx's error when ctx ends
// first, errBroken when dead is closed first.
func (l *sendLock) lockCtx(ctx context.Context, dead <-chan struct{}) error {
	if l.tryLock() {
		return nil // before ctx.Done, which may arm a timer (core's contexts)
	}
	switch l.wait(ctx.Done(), dead) {
	case cancelled:
		return ctx.Err()
	case ended:
		return errBroken
	}
	return nil
}

// lockUntil is lock bounded by deadline (cancelled once it passes).
func (l *sendLock) lockUntil(deadline time.Time, dead <-chan struct{}) lockResult {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return l.lock(ctx.Done(), dead)
}

func (l *sendLock) unlock() {
	l.held.Store(0)
	if l.nwait.Load() > 0 {
		select {
		case l.wake <- struct{}{}:
		default: // one is pending already
		}
	}
}
