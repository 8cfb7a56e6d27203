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

// TestRingOrderSeenByRaceDetector: a reply received through a ring into
// the buffer that a request was sent from, as an in-place 2-rank allreduce
// does with half of its buffer. The two goroutines of "this process"
// (sender, receiver) share nothing but the rings and the peer between
// them, whose order the race detector cannot see (atomics outside the Go
// heap); without the endpoint's raceSync on its rings, -race reports the
// receiver's write against the sender's read (a false report that failed
// core's TestStatsRingsAndScratch in CI). Without -race it checks the data.
func TestRingOrderSeenByRaceDetector(t *testing.T) {
	reqCons, reqProd := ringPair(t) // this process -> peer
	repCons, repProd := ringPair(t) // peer -> this process
	var mine, peers raceSync        // one per endpoint, as Endpoint.addRing sets
	reqProd.sync, repCons.sync = &mine, &mine
	reqCons.sync, repProd.sync = &peers, &peers
	// A context each: a shared one's lock would order the goroutines
	// for the race detector by itself.
	deadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 20*time.Second)
	}
	const n = 256 << 10 // several ring-fulls
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = byte(i)
	}
	readFull := func(r *ring, p []byte) error {
		for off := 0; off < len(p); {
			k, err := r.Read(p[off:])
			if err != nil {
				return err
			}
			off += k
		}
		return nil
	}
	errc := make(chan error, 3)
	// The sender stays alive until the end: the race detector may lose
	// the accesses of a goroutine that has ended.
	hold := make(chan struct{})
	defer close(hold)
	go func() { // the sender: reads buf
		ctx, cancel := deadline()
		defer cancel()
		_, err := reqProd.Write(ctx, buf, nil)
		errc <- err
		<-hold
	}()
	go func() { // the peer: answers each byte plus one
		tmp := make([]byte, n)
		err := readFull(reqCons, tmp)
		for i := range tmp {
			tmp[i]++
		}
		if err == nil {
			ctx, cancel := deadline()
			defer cancel()
			_, err = repProd.Write(ctx, tmp, nil)
		}
		errc <- err
	}()
	go func() { // the receiver: writes buf
		errc <- readFull(repCons, buf)
	}()
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range buf {
		if b != byte(i)+1 {
			t.Fatalf("byte %d is %d, want %d", i, b, byte(i)+1)
		}
	}
}
