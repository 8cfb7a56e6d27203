package bulk

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestSendLockExcludes: goroutines that take the lock in turn never
// overlap, and every one gets it (no lost wake-up leaves one waiting).
func TestSendLockExcludes(t *testing.T) {
	l := newSendLock()
	var in, max, total int
	var mu sync.Mutex // keeps the counters race-free; only l keeps in at 1
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := l.lockCtx(ctx, nil)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				in++
				if in > max {
					max = in
				}
				total++
				mu.Unlock()
				mu.Lock()
				in--
				mu.Unlock()
				l.unlock()
			}
		}()
	}
	wg.Wait()
	if max != 1 || total != 8*2000 {
		t.Fatalf("at most %d holders at once (want 1), %d acquisitions (want %d)", max, total, 8*2000)
	}
	if !l.held.CompareAndSwap(0, 1) {
		t.Fatal("lock still held after every holder unlocked")
	}
}

// TestSendLockGivesUp: a waiter ends when its context does (ctx's error)
// or the channel ends (errBroken), and neither leaves the lock taken.
func TestSendLockGivesUp(t *testing.T) {
	l := newSendLock()
	if l.lock(nil, nil) != locked {
		t.Fatal("free lock not taken")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.lockCtx(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter with an ended context: %v, want %v", err, context.DeadlineExceeded)
	}
	dead := make(chan struct{})
	go func() { time.Sleep(10 * time.Millisecond); close(dead) }()
	if err := l.lockCtx(context.Background(), dead); err != errBroken {
		t.Fatalf("waiter on an ended channel: %v, want errBroken", err)
	}
	if r := l.lockUntil(time.Now().Add(10*time.Millisecond), nil); r != cancelled {
		t.Fatalf("lockUntil past its deadline: %v, want cancelled", r)
	}
	if n := l.nwait.Load(); n != 0 {
		t.Fatalf("%d waiters counted after all gave up", n)
	}
	l.unlock()
	if l.lock(nil, nil) != locked {
		t.Fatal("lock not taken after unlock")
	}
	// A waiter blocked when the holder unlocks gets it.
	got := make(chan lockResult)
	go func() { got <- l.lock(nil, nil) }()
	time.Sleep(10 * time.Millisecond)
	l.unlock()
	select {
	case r := <-got:
		if r != locked {
			t.Fatalf("waiter: %v, want locked", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken by unlock")
	}
}
