// Package transporttest is the conformance suite that every
// transport.Endpoint implementation passes, in the manner of net/http/httptest
// and testing/fstest.
package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/internal/race"
	"github.com/nexar-go/nexar/transport"
)

// NewMesh builds a connected mesh of n endpoints; h[i] and down[i] serve rank
// i. The suite closes every endpoint it gets; the factory may also register
// its own cleanup.
type NewMesh func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint

// wait bounds every wait in the suite.
const wait = 20 * time.Second

// Run runs the conformance suite against newMesh. Subtests run one after the
// other so that the goroutine leak check is meaningful.
func Run(t *testing.T, newMesh NewMesh) {
	tests := []struct {
		name string
		fn   func(*testing.T, NewMesh)
	}{
		{"Delivery", testDelivery},
		{"Order", testOrder},
		{"ConcurrentSenders", testConcurrentSenders},
		{"LargePayload", testLargePayload},
		{"ManyMessages", testManyMessages},
		{"LaneIsolation", testLaneIsolation},
		{"SendCancel", testSendCancel},
		{"CloseAndLeaks", testCloseAndLeaks},
		{"PeerDown", testPeerDown},
		{"GracefulClose", testGracefulClose},
		{"CloseBounded", testCloseBounded},
		{"BadArguments", testBadArguments},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newMesh) })
	}
}

type rcvd struct {
	from int
	lane transport.Lane
	h    transport.Header
	p    []byte
}

// collector records deliveries for every rank.
type collector struct {
	mu   sync.Mutex
	got  [][]rcvd // per receiving rank
	cond chan struct{}
}

func newCollector(n int) *collector {
	return &collector{got: make([][]rcvd, n), cond: make(chan struct{}, 1)}
}

func (c *collector) handlers() []transport.Handler {
	hs := make([]transport.Handler, len(c.got))
	for i := range hs {
		hs[i] = func(from int, lane transport.Lane, h *transport.Header, p []byte) {
			c.mu.Lock()
			c.got[i] = append(c.got[i], rcvd{from, lane, *h, p})
			c.mu.Unlock()
			select {
			case c.cond <- struct{}{}:
			default:
			}
		}
	}
	return hs
}

// waitFor waits until every rank r has received want[r] messages.
func (c *collector) waitFor(t *testing.T, want []int) [][]rcvd {
	t.Helper()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok := true
		for r, w := range want {
			if len(c.got[r]) < w {
				ok = false
			}
		}
		if ok {
			out := make([][]rcvd, len(c.got))
			for r := range out {
				out[r] = append([]rcvd(nil), c.got[r]...)
			}
			c.mu.Unlock()
			return out
		}
		counts := make([]int, len(c.got))
		for r := range counts {
			counts[r] = len(c.got[r])
		}
		c.mu.Unlock()
		select {
		case <-c.cond:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("timed out: received %v messages, want %v", counts, want)
		}
	}
}

func closeAll(t *testing.T, eps []transport.Endpoint) {
	t.Helper()
	for _, e := range eps {
		if err := e.Close(); err != nil {
			t.Errorf("Close rank %d: %v", e.Rank(), err)
		}
	}
}

// header builds a recognisable header: from, to, lane, seq, then a pattern.
func header(from, to int, lane transport.Lane, seq int) *transport.Header {
	var h transport.Header
	binary.LittleEndian.PutUint32(h[0:], uint32(from))
	binary.LittleEndian.PutUint32(h[4:], uint32(to))
	h[8] = byte(lane)
	binary.LittleEndian.PutUint64(h[16:], uint64(seq))
	for i := 24; i < len(h); i++ {
		h[i] = byte(i ^ from ^ to<<3)
	}
	return &h
}

func seqOf(h *transport.Header) int { return int(binary.LittleEndian.Uint64(h[16:])) }

func payload(from, to int, lane transport.Lane, seq, n int) []byte {
	p := make([]byte, n)
	x := uint32(from*131 + to*17 + int(lane)*7 + seq)
	for i := range p {
		x = x*1664525 + 1013904223
		p[i] = byte(x >> 24)
	}
	return p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

func checkSize(t *testing.T, eps []transport.Endpoint, n int) {
	t.Helper()
	if len(eps) != n {
		t.Fatalf("newMesh returned %d endpoints, want %d", len(eps), n)
	}
	for i, e := range eps {
		if e.Rank() != i || e.Size() != n {
			t.Fatalf("endpoint %d: Rank()=%d Size()=%d, want %d, %d", i, e.Rank(), e.Size(), i, n)
		}
	}
}

// testDelivery: every rank sends to every rank (itself included) on every
// lane; headers and payloads arrive intact and the sender's buffer can be
// reused right after Send.
func testDelivery(t *testing.T, newMesh NewMesh) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			c := newCollector(n)
			eps := newMesh(t, n, c.handlers(), nil)
			defer closeAll(t, eps)
			checkSize(t, eps, n)
			ctx := ctxT(t)
			sizes := []int{0, 1, 1000, 70000}
			for from, e := range eps {
				for to := range n {
					for lane := range transport.NumLanes {
						for seq, sz := range sizes {
							p := payload(from, to, lane, seq, sz)
							if err := e.Send(ctx, to, lane, header(from, to, lane, seq), p); err != nil {
								t.Fatalf("Send %d->%d lane %v: %v", from, to, lane, err)
							}
							clear(p) // the transport must not retain it
						}
					}
				}
			}
			want := make([]int, n)
			for i := range want {
				want[i] = n * int(transport.NumLanes) * len(sizes)
			}
			got := c.waitFor(t, want)
			for to, msgs := range got {
				for _, m := range msgs {
					seq := seqOf(&m.h)
					if m.h != *header(m.from, to, m.lane, seq) {
						t.Fatalf("rank %d: corrupt header from %d lane %v", to, m.from, m.lane)
					}
					if seq >= len(sizes) || !bytes.Equal(m.p, payload(m.from, to, m.lane, seq, sizes[seq])) {
						t.Fatalf("rank %d: corrupt payload from %d lane %v seq %d", to, m.from, m.lane, seq)
					}
				}
			}
		})
	}
}

// checkOrder verifies that per (from, lane) sequence numbers increase by one
// from zero, and returns the count per (from, lane).
func checkOrder(t *testing.T, to int, msgs []rcvd) map[[2]int]int {
	t.Helper()
	next := map[[2]int]int{}
	for _, m := range msgs {
		k := [2]int{m.from, int(m.lane)}
		if s := seqOf(&m.h); s != next[k] {
			t.Fatalf("rank %d from %d lane %v: got seq %d, want %d", to, m.from, m.lane, s, next[k])
		}
		next[k]++
	}
	return next
}

func testOrder(t *testing.T, newMesh NewMesh) {
	const n, count = 3, 300
	c := newCollector(n)
	eps := newMesh(t, n, c.handlers(), nil)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, n*n*int(transport.NumLanes))
	for from, e := range eps {
		for to := range n {
			for lane := range transport.NumLanes {
				wg.Go(func() {
					for seq := range count {
						if err := e.Send(ctx, to, lane, header(from, to, lane, seq), payload(from, to, lane, seq, seq%64)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := make([]int, n)
	for i := range want {
		want[i] = n * int(transport.NumLanes) * count
	}
	for to, msgs := range c.waitFor(t, want) {
		checkOrder(t, to, msgs)
	}
}

// testConcurrentSenders: several goroutines share one (peer, lane); each
// goroutine's messages stay in its own order and none is lost or torn.
func testConcurrentSenders(t *testing.T, newMesh NewMesh) {
	const senders, count = 4, 100
	c := newCollector(2)
	eps := newMesh(t, 2, c.handlers(), nil)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Go(func() {
			for seq := range count {
				// The sender goroutine is encoded as "from" in the header.
				h := header(g, 1, transport.LaneData, seq)
				if err := eps[0].Send(ctx, 1, transport.LaneData, h, payload(g, 1, transport.LaneData, seq, 3000)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := c.waitFor(t, []int{0, senders * count})[1]
	next := make([]int, senders)
	for _, m := range got {
		g := int(binary.LittleEndian.Uint32(m.h[0:]))
		seq := seqOf(&m.h)
		if g >= senders || seq != next[g] || m.h != *header(g, 1, transport.LaneData, seq) {
			t.Fatalf("sender %d: got seq %d, want %d (or corrupt header)", g, seq, next[g])
		}
		if !bytes.Equal(m.p, payload(g, 1, transport.LaneData, seq, 3000)) {
			t.Fatalf("sender %d seq %d: corrupt payload", g, seq)
		}
		next[g]++
	}
}

// testLargePayload sends one MaxPayload message (8 MiB under -race or
// -short) to a peer and to itself, and checks that a larger one is refused.
func testLargePayload(t *testing.T, newMesh NewMesh) {
	c := newCollector(2)
	eps := newMesh(t, 2, c.handlers(), nil)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	size := transport.MaxPayload
	if race.Enabled || testing.Short() { // the race detector slows a userspace transport such as QUIC tenfold
		size = 8 << 20
	}
	big := make([]byte, size)
	rand.NewChaCha8([32]byte{1, 2, 3}).Read(big)
	for _, to := range []int{1, 0} {
		if err := eps[0].Send(ctx, to, transport.LaneData, header(0, to, transport.LaneData, 0), big); err != nil {
			t.Fatalf("Send MaxPayload to %d: %v", to, err)
		}
	}
	got := c.waitFor(t, []int{1, 1})
	for to := range 2 {
		if !bytes.Equal(got[to][0].p, big) {
			t.Fatalf("rank %d: MaxPayload message corrupted", to)
		}
	}
	if err := eps[0].Send(ctx, 1, transport.LaneData, nil, make([]byte, transport.MaxPayload+1)); err == nil {
		t.Fatalf("Send of MaxPayload+1 bytes succeeded, want error")
	}
}

func testManyMessages(t *testing.T, newMesh NewMesh) {
	count := 5000
	if testing.Short() {
		count = 1000
	}
	c := newCollector(2)
	eps := newMesh(t, 2, c.handlers(), nil)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	for seq := range count {
		if err := eps[0].Send(ctx, 1, transport.LaneData, header(0, 1, transport.LaneData, seq), payload(0, 1, transport.LaneData, seq, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if k := checkOrder(t, 1, c.waitFor(t, []int{0, count})[1]); k[[2]int{0, int(transport.LaneData)}] != count {
		t.Fatalf("got %v messages, want %d", k, count)
	}
}

// blockedData builds a 2-rank mesh whose rank 1 blocks in its LaneData
// handler until release is closed, and records the other lanes.
func blockedData(t *testing.T, newMesh NewMesh) (eps []transport.Endpoint, c *collector, release chan struct{}) {
	c = newCollector(2)
	hs := c.handlers()
	release = make(chan struct{})
	inner := hs[1]
	hs[1] = func(from int, lane transport.Lane, h *transport.Header, p []byte) {
		if lane == transport.LaneData {
			select {
			case <-release:
			case <-time.After(wait):
			}
		}
		inner(from, lane, h, p)
	}
	eps = newMesh(t, 2, hs, nil)
	return eps, c, release
}

// testLaneIsolation: a LaneData handler that blocks must not delay
// LaneControl and LaneHeartbeat from the same peer.
func testLaneIsolation(t *testing.T, newMesh NewMesh) {
	eps, c, release := blockedData(t, newMesh)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	const dataMsgs, dataSize = 48, 1 << 20 // more than any sane window
	sent := make(chan error, 1)
	go func() {
		for seq := range dataMsgs {
			if err := eps[0].Send(ctx, 1, transport.LaneData, header(0, 1, transport.LaneData, seq), payload(0, 1, transport.LaneData, seq, dataSize)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(200 * time.Millisecond) // let the data lane congest
	for seq := range 10 {
		for _, lane := range []transport.Lane{transport.LaneControl, transport.LaneHeartbeat} {
			if err := eps[0].Send(ctx, 1, lane, header(0, 1, lane, seq), []byte("ping")); err != nil {
				t.Fatalf("Send on %v while data is blocked: %v", lane, err)
			}
		}
	}
	got := c.waitFor(t, []int{0, 20})[1]
	for _, m := range got[:20] {
		if m.lane == transport.LaneData {
			t.Fatalf("data delivered while its handler was blocked")
		}
	}
	close(release)
	if err := <-sent; err != nil {
		t.Fatalf("data Send: %v", err)
	}
	checkOrder(t, 1, c.waitFor(t, []int{0, 20 + dataMsgs})[1])
}

// testSendCancel: a Send blocked by back-pressure returns when its ctx ends.
func testSendCancel(t *testing.T, newMesh NewMesh) {
	eps, _, release := blockedData(t, newMesh)
	defer closeAll(t, eps)
	defer close(release)
	var err error
	for seq := 0; seq < 1000 && err == nil; seq++ {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err = eps[0].Send(ctx, 1, transport.LaneData, header(0, 1, transport.LaneData, seq), make([]byte, 1<<20))
		cancel()
		if err != nil && time.Since(start) > wait/2 {
			t.Fatalf("Send took %v to honour its ctx", time.Since(start))
		}
	}
	if err == nil {
		t.Fatalf("1000 MiB sent to a blocked handler without back-pressure")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked Send: got %v, want context.DeadlineExceeded", err)
	}
	// An already cancelled ctx fails even on an idle lane, or delivers; it
	// must not hang.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() { eps[0].Send(ctx, 1, transport.LaneControl, nil, []byte("x")); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("Send with a cancelled ctx hung")
	}
}

// testCloseAndLeaks: Close is idempotent, Send after Close fails with
// ErrClosed, and every goroutine is gone afterwards.
func testCloseAndLeaks(t *testing.T, newMesh NewMesh) {
	before := runtime.NumGoroutine()
	c := newCollector(3)
	eps := newMesh(t, 3, c.handlers(), nil)
	ctx := ctxT(t)
	for from, e := range eps {
		for to := range 3 {
			if err := e.Send(ctx, to, transport.LaneControl, header(from, to, 0, 0), []byte("hi")); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.waitFor(t, []int{3, 3, 3})
	for range 2 {
		closeAll(t, eps)
	}
	for _, e := range eps {
		if err := e.Send(ctx, (e.Rank()+1)%3, transport.LaneControl, nil, nil); !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("Send after Close: got %v, want ErrClosed", err)
		}
	}
	CheckGoroutines(t, before)
}

// CheckGoroutines waits until no more than before goroutines run, and fails
// the test with a dump of the stacks if that does not happen in time.
func CheckGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutine leak: %d running, %d before\n%s", runtime.NumGoroutine(), before, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testPeerDown: when a rank goes away, every other rank is told once, with a
// *transport.PeerDownError naming it, and sends to it fail.
func testPeerDown(t *testing.T, newMesh NewMesh) {
	const n = 3
	type ev struct {
		at, peer int
		err      error
	}
	evs := make(chan ev, 16)
	downs := make([]transport.DownHandler, n)
	for i := range downs {
		downs[i] = func(peer int, err error) { evs <- ev{i, peer, err} }
	}
	c := newCollector(n)
	eps := newMesh(t, n, c.handlers(), downs)
	defer closeAll(t, eps)
	if err := eps[2].Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for len(seen) < n-1 {
		select {
		case e := <-evs:
			var pd *transport.PeerDownError
			if e.peer != 2 || !errors.As(e.err, &pd) || pd.Peer != 2 || e.at == 2 {
				t.Fatalf("rank %d: unexpected down(%d, %v)", e.at, e.peer, e.err)
			}
			if !errors.Is(e.err, transport.ErrPeerClosed) {
				t.Fatalf("rank %d: Close of rank 2 reported as %v, want a graceful departure (ErrPeerClosed)", e.at, e.err)
			}
			if seen[e.at] {
				t.Fatalf("rank %d told twice that rank 2 is down", e.at)
			}
			seen[e.at] = true
		case <-time.After(wait):
			t.Fatalf("down notifications: got %v, want ranks 0 and 1", seen)
		}
	}
	ctx := ctxT(t)
	for _, e := range eps[:2] {
		err := e.Send(ctx, 2, transport.LaneControl, nil, []byte("x"))
		var pd *transport.PeerDownError
		if !errors.As(err, &pd) || pd.Peer != 2 || !errors.Is(err, transport.ErrPeerClosed) {
			t.Fatalf("rank %d: Send to a closed peer: got %v, want *PeerDownError with ErrPeerClosed", e.Rank(), err)
		}
	}
	// The survivors still talk to each other.
	if err := eps[0].Send(ctx, 1, transport.LaneControl, header(0, 1, 0, 0), nil); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, []int{0, 1, 0})
	// Closing the rest may report more downs, but never one twice.
	closeAll(t, eps)
	told := map[[2]int]bool{{0, 2}: true, {1, 2}: true}
	for {
		select {
		case e := <-evs:
			if k := [2]int{e.at, e.peer}; told[k] || e.at == e.peer {
				t.Fatalf("rank %d told twice (or about itself) that %d is down: %v", e.at, e.peer, e.err)
			} else {
				told[k] = true
			}
		case <-time.After(200 * time.Millisecond):
			return
		}
	}
}

func testBadArguments(t *testing.T, newMesh NewMesh) {
	eps := newMesh(t, 2, make([]transport.Handler, 2), nil)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	tests := []struct {
		name string
		peer int
		lane transport.Lane
	}{
		{"negative peer", -1, transport.LaneControl},
		{"peer out of range", 2, transport.LaneControl},
		{"unknown lane", 1, transport.NumLanes},
	}
	for _, tc := range tests {
		if err := eps[0].Send(ctx, tc.peer, tc.lane, nil, nil); err == nil {
			t.Errorf("%s: Send succeeded, want error", tc.name)
		}
	}
}

// closeBound is how long Close may take: implementations bound their drain
// by a timeout of a few seconds (QUIC: Options.CloseTimeout, default 2s).
const closeBound = 8 * time.Second

// testGracefulClose: a rank that sends K messages on several lanes and
// closes at once loses none of them: each peer receives all K, in order per
// lane, and only then a down notification naming it with ErrPeerClosed.
func testGracefulClose(t *testing.T, newMesh NewMesh) {
	const n, k = 3, 300
	type event struct {
		from int
		lane transport.Lane
		seq  int
		down error
	}
	var mu sync.Mutex
	logs := make([][]event, n)
	downSeen := make(chan int, 2*n)
	hs := make([]transport.Handler, n)
	downs := make([]transport.DownHandler, n)
	for i := range hs {
		hs[i] = func(from int, lane transport.Lane, h *transport.Header, p []byte) {
			ev := event{from: from, lane: lane, seq: seqOf(h)}
			if len(p) != ev.seq%5000 || !bytes.Equal(p, payload(from, i, lane, ev.seq, len(p))) {
				ev.seq = -1 // corrupt
			}
			mu.Lock()
			logs[i] = append(logs[i], ev)
			mu.Unlock()
		}
		downs[i] = func(peer int, err error) {
			mu.Lock()
			logs[i] = append(logs[i], event{from: peer, down: err})
			mu.Unlock()
			downSeen <- i
		}
	}
	eps := newMesh(t, n, hs, downs)
	defer closeAll(t, eps)
	ctx := ctxT(t)
	lanes := []transport.Lane{transport.LaneData, transport.LaneControl, transport.LaneRPC}
	for seq := range k {
		for _, lane := range lanes {
			for to := 1; to < n; to++ {
				if err := eps[0].Send(ctx, to, lane, header(0, to, lane, seq), payload(0, to, lane, seq, seq%5000)); err != nil {
					t.Fatalf("Send seq %d to %d on %v: %v", seq, to, lane, err)
				}
			}
		}
	}
	start := time.Now()
	if err := eps[0].Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > closeBound {
		t.Errorf("Close with running peers took %v, want < %v", d, closeBound)
	}
	for range n - 1 {
		select {
		case <-downSeen:
		case <-time.After(wait):
			t.Fatalf("no down notification for the closed rank 0 within %v", wait)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for to := 1; to < n; to++ {
		next := map[transport.Lane]int{}
		var down error
		for _, ev := range logs[to] {
			if ev.down != nil {
				if down != nil {
					t.Fatalf("rank %d: told twice that rank 0 is down", to)
				}
				down = ev.down
				continue
			}
			if down != nil {
				t.Fatalf("rank %d: message from %d on %v delivered after the down notification", to, ev.from, ev.lane)
			}
			if ev.from != 0 || ev.seq != next[ev.lane] {
				t.Fatalf("rank %d: from %d on %v got seq %d, want %d (-1: corrupt)", to, ev.from, ev.lane, ev.seq, next[ev.lane])
			}
			next[ev.lane]++
		}
		for _, lane := range lanes {
			if next[lane] != k {
				t.Errorf("rank %d: %d of %d messages on %v delivered before the departure", to, next[lane], k, lane)
			}
		}
		var pd *transport.PeerDownError
		if !errors.As(down, &pd) || pd.Peer != 0 || !errors.Is(down, transport.ErrPeerClosed) {
			t.Errorf("rank %d: departure reported as %v, want *PeerDownError for 0 with ErrPeerClosed", to, down)
		}
	}
}

// testCloseBounded: Close returns within a few seconds even when a peer is
// alive but not reading (its handler blocks), so the drain cannot finish.
func testCloseBounded(t *testing.T, newMesh NewMesh) {
	eps, _, release := blockedData(t, newMesh)
	defer closeAll(t, eps)
	defer close(release)
	sent := make(chan error, 1)
	go func() {
		ctx := ctxT(t)
		for seq := 0; ; seq++ {
			if err := eps[0].Send(ctx, 1, transport.LaneData, header(0, 1, transport.LaneData, seq), make([]byte, 1<<20)); err != nil {
				sent <- err
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond) // a Send is now blocked on the stalled lane
	start := time.Now()
	eps[0].Close()
	d := time.Since(start)
	if d > closeBound {
		t.Fatalf("Close with a peer that does not read took %v, want < %v", d, closeBound)
	}
	t.Logf("Close with a stalled peer took %v", d.Round(time.Millisecond))
	select {
	case err := <-sent:
		if !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Send blocked across Close: got %v, want ErrClosed", err)
		}
	case <-time.After(wait):
		t.Fatalf("Send blocked across Close did not return")
	}
}
