package bulk

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// ringPair makes a 64 KiB ring and maps it as its producer would; both are
// released when t ends. It skips t where there is no shared memory.
func ringPair(t *testing.T) (cons, prod *ring) {
	t.Helper()
	cons, path, cookie, err := createRing(1 << 16)
	if err != nil {
		t.Skipf("no shared-memory ring here: %v", err)
	}
	t.Cleanup(cons.release)
	prod, err = openRing(path, 1<<16, cookie)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.release)
	return cons, prod
}

// TestWakeupsChangeTheWord: every wake-up of a reader on the data word
// changes the word first, so that a reader that counted itself and read
// the word, but has not yet slept, does not sleep through it. The reader
// here is the idle reader (waitData's steps, done by hand so that the
// wake-up falls between its read of the word and its sleep); before
// wakeIdle changed the word, its sleep lasted the whole timeout.
func TestWakeupsChangeTheWord(t *testing.T) {
	cons, prod := ringPair(t)
	for _, tc := range []struct {
		name string
		wake func()
	}{
		{"wakeIdle", cons.wakeIdle},
		{"nudge", cons.nudge},
		{"bumpData with a goroutine waiting", func() {
			cons.setWaiting(1)
			defer cons.setWaiting(-1)
			prod.bumpData()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			atomic.AddUint32(cons.u32(offIdleWait), 1)
			defer atomic.AddUint32(cons.u32(offIdleWait), ^uint32(0))
			s := atomic.LoadUint32(cons.u32(offDataSeq))
			tc.wake() // between the reader's read of the word and its sleep
			start := time.Now()
			futexSleep(cons.u32(offDataSeq), s, 2*time.Second, bitIdle|bitCall)
			if took := time.Since(start); took > time.Second {
				t.Fatalf("the reader slept %v through the wake-up (the word did not change)", took)
			}
		})
	}
}

// TestFillingUp: the producer's "more than half full" follows the ring,
// though it reads the consumer's tail only when its last sight of it says
// the ring may be.
func TestFillingUp(t *testing.T) {
	cons, prod := ringPair(t)
	for _, step := range []struct {
		write, read int // bytes the producer writes, then the consumer reads
		want        bool
		holds       string
	}{
		{20 << 10, 0, false, "20 KiB of 64"},
		{20 << 10, 0, true, "40 KiB of 64"},
		{0, 30 << 10, false, "10 KiB of 64 after a read (the tail must be read again)"},
		{30 << 10, 0, true, "40 KiB of 64 again"},
	} {
		if step.write > 0 {
			if _, err := prod.Write(context.Background(), make([]byte, step.write), nil); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < step.read; {
			got += cons.TryRead(make([]byte, step.read-got))
		}
		if got := prod.fillingUp(); got != step.want {
			t.Fatalf("%s: filling up %v, want %v", step.holds, got, step.want)
		}
	}
}
