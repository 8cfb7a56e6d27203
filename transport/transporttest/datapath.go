package transporttest

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// NewDataPaths builds a connected mesh of n data paths, as NewMesh does
// endpoints.
type NewDataPaths func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath

// RunDataPath checks that a transport.DataPath does what its Caps
// declares, beyond the Endpoint behaviour that Run checks: core relies on
// these declarations instead of probing the endpoint's type.
func RunDataPath(t *testing.T, newPaths NewDataPaths) {
	tests := []struct {
		name string
		fn   func(*testing.T, NewDataPaths)
	}{
		{"Declarations", testDeclarations},
		{"SendProgress", testSendProgress},
		{"Abandon", testAbandon},
		{"SendDevice", testSendDevice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newPaths) })
	}
}

func closePaths(t *testing.T, eps []transport.DataPath) {
	t.Helper()
	for _, e := range eps {
		if err := e.Close(); err != nil {
			t.Errorf("Close rank %d: %v", e.Rank(), err)
		}
	}
}

// pollerOf is e's scheduling group (transport.Poller), or one that polls
// nothing for a path without it.
func pollerOf(e transport.DataPath) transport.Poller {
	if p, ok := e.(transport.Poller); ok {
		return p
	}
	return transport.NoPoller{}
}

// testDeclarations: Caps and Oversubscribed are constant; Paths names every
// peer; a path that cannot poll returns no poll function; DataUnused is
// never true without LazyData and false once a message went; Waiting's
// done can be called; Await keeps its bound and sleeps only where it can
// poll; PeerPresence tells only what Caps declares.
func testDeclarations(t *testing.T, newPaths NewDataPaths) {
	const n = 3
	c := newCollector(n)
	eps := newPaths(t, n, c.handlers(), nil)
	defer closePaths(t, eps)
	ctx := ctxT(t)
	for i, e := range eps {
		caps := e.Caps()
		if e.Caps() != caps || pollerOf(e).Oversubscribed() != pollerOf(e).Oversubscribed() {
			t.Fatalf("rank %d: Caps or Oversubscribed changed between two calls", i)
		}
		if _, ok := e.(transport.Poller); !ok && (caps.Poll || caps.Presence) {
			t.Errorf("rank %d: Caps() = %+v declares polling or presence, but the path is no transport.Poller", i, caps)
		}
		paths := e.Paths()
		for p := range n {
			if p == i {
				continue
			}
			if strings.TrimSpace(paths[p]) == "" {
				t.Errorf("rank %d: Paths names no path to rank %d: %v", i, p, paths)
			}
			if e.DataUnused(p) && !caps.LazyData {
				t.Errorf("rank %d: DataUnused(%d) without Caps().LazyData", i, p)
			}
			if e.SharedMemory(p) && !caps.Poll {
				t.Errorf("rank %d: SharedMemory(%d) but Caps().Poll is false: core would not poll it", i, p)
			}
			done := pollerOf(e).Waiting(p)
			if done == nil {
				t.Fatalf("rank %d: Waiting(%d) returned nil", i, p)
			}
			done()
		}
	}
	// One LaneData message each way per pair: every path is then made.
	want := make([]int, n)
	for i, e := range eps {
		for p := range n {
			if p == i {
				continue
			}
			if err := e.Send(ctx, p, transport.LaneData, header(i, p, transport.LaneData, 0), payload(i, p, transport.LaneData, 0, 100)); err != nil {
				t.Fatalf("rank %d: send to %d: %v", i, p, err)
			}
			want[p]++
		}
	}
	c.waitFor(t, want)
	for i, e := range eps {
		caps := e.Caps()
		for p := range n {
			if p == i {
				continue
			}
			if e.DataUnused(p) {
				t.Errorf("rank %d: DataUnused(%d) after a LaneData message went to it", i, p)
			}
			poll, stop := pollerOf(e).StartPolling(p)
			if (poll == nil) != (stop == nil) {
				t.Fatalf("rank %d: StartPolling(%d) returned one of poll and stop nil", i, p)
			}
			if poll != nil && !caps.Poll {
				t.Errorf("rank %d: StartPolling(%d) gave a poll function but Caps().Poll is false", i, p)
			}
			if e.SharedMemory(p) && poll == nil {
				t.Errorf("rank %d: SharedMemory(%d) but StartPolling gives nothing to poll", i, p)
			}
			if poll != nil {
				poll() // nothing pending: must not block
				stop()
			}
			// Await sleeps at most d, returns at once for a done
			// already reported, and can sleep only where it can poll.
			for _, done := range []func() bool{func() bool { return false }, func() bool { return true }} {
				t0 := time.Now()
				slept := pollerOf(e).Await(p, done, 20*time.Millisecond)
				if took := time.Since(t0); took > 2*time.Second {
					t.Errorf("rank %d: Await(%d) took %v with a 20ms bound", i, p, took)
				}
				if slept && !caps.Poll {
					t.Errorf("rank %d: Await(%d) slept but Caps().Poll is false", i, p)
				}
				if slept && poll == nil {
					t.Errorf("rank %d: Await(%d) slept but StartPolling gives nothing to poll", i, p)
				}
			}
		}
	}
	// Every rank has polled (and slept on) what it could: a path that
	// declares Presence tells each rank that sends to it over shared
	// memory that it was there, and one that does not tells nothing.
	for i, e := range eps {
		caps := e.Caps()
		for p := range n {
			if p == i {
				continue
			}
			pres, ok := pollerOf(e).PeerPresence(p)
			if ok && !caps.Presence {
				t.Errorf("rank %d: PeerPresence(%d) = %+v without Caps().Presence", i, p, pres)
			}
			if caps.Presence && e.SharedMemory(p) && !ok {
				t.Errorf("rank %d: PeerPresence(%d) tells nothing after rank %d polled and slept", i, p, p)
			}
			if ok && (pres.Polling || pres.Asleep) {
				t.Errorf("rank %d: PeerPresence(%d) = %+v with rank %d neither polling nor asleep", i, p, pres, p)
			}
		}
	}
}

// testSendProgress: SendProgress delivers like Send on LaneData, in order
// with Send, and runs progress only while the call is under way.
func testSendProgress(t *testing.T, newPaths NewDataPaths) {
	const n, msgs = 2, 40
	c := newCollector(n)
	eps := newPaths(t, n, c.handlers(), nil)
	defer closePaths(t, eps)
	ctx := ctxT(t)
	var inCall, outside atomic.Int32
	progress := func() bool {
		if inCall.Load() == 0 {
			outside.Add(1)
		}
		return false
	}
	for k := range msgs {
		h, p := header(0, 1, transport.LaneData, k), payload(0, 1, transport.LaneData, k, 1+k*4093)
		var err error
		if k%2 == 0 {
			inCall.Store(1)
			err = eps[0].SendProgress(ctx, 1, h, p, progress)
			inCall.Store(0)
		} else {
			err = eps[0].Send(ctx, 1, transport.LaneData, h, p)
		}
		if err != nil {
			t.Fatalf("message %d: %v", k, err)
		}
	}
	got := c.waitFor(t, []int{0, msgs})[1]
	for k, m := range got {
		if m.lane != transport.LaneData || seqOf(&m.h) != k || !bytes.Equal(m.p, payload(0, 1, transport.LaneData, k, 1+k*4093)) {
			t.Fatalf("message %d: lane %v seq %d, %d bytes: not what was sent, or out of order", k, m.lane, seqOf(&m.h), len(m.p))
		}
	}
	if outside.Load() != 0 {
		t.Errorf("progress ran %d times after SendProgress returned", outside.Load())
	}
}

// testAbandon: Abandon tells the DownHandler once, with a
// *transport.PeerDownError for that peer; a second Abandon tells nothing.
func testAbandon(t *testing.T, newPaths NewDataPaths) {
	const n = 3
	type ev struct {
		peer int
		err  error
	}
	evs := make(chan ev, 8)
	downs := make([]transport.DownHandler, n)
	downs[0] = func(peer int, err error) { evs <- ev{peer, err} }
	eps := newPaths(t, n, newCollector(n).handlers(), downs)
	defer closePaths(t, eps)
	why := errors.New("transporttest: declared down")
	eps[0].Abandon(2, why)
	eps[0].Abandon(2, why)
	eps[0].Abandon(0, why)  // itself: ignored
	eps[0].Abandon(-1, why) // out of range: ignored
	select {
	case e := <-evs:
		var pd *transport.PeerDownError
		if e.peer != 2 || !errors.As(e.err, &pd) || pd.Peer != 2 {
			t.Fatalf("down(%d, %v), want rank 2 as a *PeerDownError", e.peer, e.err)
		}
	case <-time.After(wait):
		t.Fatal("Abandon(2) did not tell the DownHandler")
	}
	select {
	case e := <-evs:
		t.Fatalf("told again after one Abandon: down(%d, %v)", e.peer, e.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// testSendDevice: without Caps().Device, DeviceData reports nothing and
// SendDevice refuses with ErrNoDevicePath, delivering nothing; where
// DeviceData says a peer's channel moves device memory, SendDevice
// delivers (here host bytes, which such a channel moves too) in order
// with Send.
func testSendDevice(t *testing.T, newPaths NewDataPaths) {
	const n = 2
	c := newCollector(n)
	eps := newPaths(t, n, c.handlers(), nil)
	defer closePaths(t, eps)
	ctx := ctxT(t)
	// A LaneData message first: every path is then made.
	if err := eps[0].Send(ctx, 1, transport.LaneData, header(0, 1, transport.LaneData, 0), payload(0, 1, transport.LaneData, 0, 10)); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, []int{0, 1})
	want := 1
	for k := 1; k <= 3; k++ {
		send, recv := eps[0].DeviceData(1)
		if !eps[0].Caps().Device && (send || recv) {
			t.Fatalf("DeviceData(1) = %v, %v without Caps().Device", send, recv)
		}
		h, p := header(0, 1, transport.LaneData, want), payload(0, 1, transport.LaneData, want, k*70000)
		err := eps[0].SendDevice(ctx, 1, h, p)
		switch {
		case !eps[0].Caps().Device:
			if !errors.Is(err, transport.ErrNoDevicePath) {
				t.Fatalf("SendDevice without Caps().Device: %v, want ErrNoDevicePath", err)
			}
		case send && err != nil:
			t.Fatalf("SendDevice where DeviceData says the channel moves device memory: %v", err)
		case err == nil:
			want++
		case !errors.Is(err, transport.ErrNoDevicePath):
			t.Fatalf("SendDevice: %v", err)
		}
		if err := eps[0].Send(ctx, 1, transport.LaneData, header(0, 1, transport.LaneData, want), payload(0, 1, transport.LaneData, want, 5)); err != nil {
			t.Fatal(err)
		}
		want++
	}
	got := c.waitFor(t, []int{0, want})[1]
	for k, m := range got {
		if seqOf(&m.h) != k || !bytes.Equal(m.p, payload(0, 1, transport.LaneData, k, len(m.p))) {
			t.Fatalf("message %d has sequence %d: out of order, or a refused SendDevice delivered something", k, seqOf(&m.h))
		}
	}
}
