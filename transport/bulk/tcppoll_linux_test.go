package bulk

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// hdr is a header whose bytes 4-7 hold i (byte 0, the owner, stays 0).
func hdr(i int) *transport.Header {
	var h transport.Header
	binary.LittleEndian.PutUint32(h[4:], uint32(i))
	return &h
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-acc
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// tcpChannels returns the sending and receiving channels of a loopback TCP
// connection, the receiver reading (its socket out of Go's poller) and
// delivering each frame's tag (header bytes 4-7) to got, which holds n.
func tcpChannels(t *testing.T, n int) (snd, rcv *channel, got chan uint32) {
	t.Helper()
	a, b := tcpPair(t)
	snd = newChannel(1, "test", []link{connLink{c: a, raw: a, w: newSockWriter(a)}})
	rcv = newChannel(0, "test", []link{connLink{c: b, raw: b}})
	got = make(chan uint32, n)
	rcv.startReading(func(h *transport.Header, p []byte) { got <- binary.LittleEndian.Uint32(h[4:]) }, nil)
	if rcv.sock == nil {
		t.Fatal("no socket waiter on a TCP channel")
	}
	return snd, rcv, got
}

// runReadLoop starts rcv's read loop and returns the function that closes
// the channel and checks that the loop ends.
func runReadLoop(t *testing.T, rcv *channel) (end func()) {
	loop := make(chan error, 1)
	go func() { loop <- rcv.readLoop() }()
	return func() {
		t.Helper()
		rcv.quiet.Store(true)
		rcv.close()
		select {
		case <-loop:
		case <-time.After(3 * time.Second):
			t.Error("read loop did not end at close")
		}
	}
}

// TestTCPPollLeavesReadAhead: a poller that reads one frame leaves the
// frames behind it that its buffered reader took from the socket; when it
// stops, the read loop, already asleep on the (now empty) socket, must be
// woken to deliver them (stopPollTCP's interrupt). Without that they wait
// for the next byte to arrive, here forever.
func TestTCPPollLeavesReadAhead(t *testing.T) {
	snd, rcv, got := tcpChannels(t, 16)
	const frames = 3
	var once sync.Once
	hookErr := make(chan error, 1)
	rcv.beforeWait = func() {
		once.Do(func() {
			// The read loop found nothing and is about to sleep on the
			// socket: a poller comes, reads one frame, and leaves.
			rcv.startPollTCP()
			for i := range frames {
				if _, err := snd.send(context.Background(), hdr(i), []byte("small"), nil, false); err != nil {
					hookErr <- err
					return
				}
			}
			time.Sleep(50 * time.Millisecond) // all of them in the socket
			if !rcv.pollFn() {
				hookErr <- fmt.Errorf("poll read nothing with %d frames sent", frames)
			}
			rcv.stopPollTCP()
			close(hookErr)
		})
	}
	end := runReadLoop(t, rcv)
	defer end()
	if err := <-hookErr; err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		select {
		case tag := <-got:
			if tag != uint32(i) {
				t.Fatalf("frame %d delivered as tag %d", i, tag)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("frame %d of %d not delivered within 3 s: the read loop slept on an empty socket while the poller's reader held it", i, frames)
		}
	}
}

// TestTCPAside: where this rank shares its cores with more ranks than
// they number, a TCP channel's read loop stays off its socket while the
// process polls another peer (channel.aside), so that arrivals wake no
// thread; it still delivers what arrives (once per parkSlot), and it
// watches the socket again once a goroutine blocks on the channel, once
// the process stops polling, and throughout where cores are not shared.
func TestTCPAside(t *testing.T) {
	snd, rcv, got := tcpChannels(t, 64)
	var proc presence
	proc.crowded.Store(true)
	rcv.proc = &proc
	proc.enter() // a goroutine of this process polls another peer
	defer runReadLoop(t, rcv)()
	tag := 0
	send := func() {
		t.Helper()
		if _, err := snd.send(context.Background(), hdr(tag), []byte("small"), nil, false); err != nil {
			t.Fatal(err)
		}
		tag++
	}
	recv := func(what string) {
		t.Helper()
		select {
		case <-got:
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: a frame was not delivered within 3 s", what)
		}
	}
	// watching polls the loop's state for up to 3 s until it is want.
	watching := func(want bool) bool {
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
			if rcv.watching.Load() == want {
				return true
			}
		}
		return false
	}

	// Aside: the loop never sleeps on the socket, and every frame arrives.
	for range 20 {
		send()
		time.Sleep(5 * time.Millisecond)
		if rcv.watching.Load() {
			t.Fatal("aside: the read loop sleeps on the socket while the process polls another peer")
		}
	}
	for range 20 {
		recv("aside")
	}
	// A goroutine blocks on this channel (Waiting): the loop watches.
	rcv.blocked.Add(1)
	rcv.sock.wake()
	if !watching(true) {
		t.Fatal("a goroutine blocked on the channel, but the read loop does not watch the socket")
	}
	send()
	recv("blocked")
	rcv.blocked.Add(-1)
	// Nobody blocked any more: after the next frame it steps aside again.
	send()
	recv("aside again")
	if !watching(false) {
		t.Fatal("the read loop still watches the socket after the blocked goroutine left")
	}
	// The process stops polling: the loop watches again.
	proc.leave()
	if !watching(true) {
		t.Fatal("the process stopped polling, but the read loop does not watch the socket")
	}
	send()
	recv("not polling")
	// Cores not shared: polling elsewhere keeps the loop on the socket.
	proc.crowded.Store(false)
	proc.enter()
	defer proc.leave()
	for range 5 {
		send()
		recv("not crowded")
		if !watching(true) {
			t.Fatal("cores not shared: the read loop left the socket while the process polls another peer")
		}
	}
}

// inbound returns e's channel from peer, waiting up to 10 s for it (nil if
// none comes): the accepting side installs it as its handshake ends, which
// waitPaths, done when the dialing sides have their paths, may precede.
func inbound(e *Endpoint, peer int) *channel {
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		e.mu.Lock()
		ch := e.in[peer]
		e.mu.Unlock()
		if ch != nil || time.Now().After(end) {
			return ch
		}
	}
}

// TestTCPAsideWiring: an endpoint's TCP channels step aside with their
// process (channel.proc set), except on a relaying rank (Options.Forwards),
// whose read loop forwards what arrives and must never wait for a poll.
func TestTCPAsideWiring(t *testing.T) {
	for _, forwards := range []bool{false, true} {
		t.Run(fmt.Sprintf("forwards=%v", forwards), func(t *testing.T) {
			eps := mesh(t, 2, Options{Mode: ModeTCP, Forwards: forwards}, nil, nil)
			defer eps[1].Close()
			defer eps[0].Close()
			waitPaths(t, eps, "tcp x2 tls")
			for i, e := range eps {
				ch := inbound(e, 1-i)
				if ch == nil || ch.sock == nil {
					t.Fatalf("rank %d: no TCP channel from %d taken out of Go's poller", i, 1-i)
				}
				if got := ch.proc != nil; got == forwards {
					t.Errorf("rank %d: channel steps aside %v with Forwards %v", i, got, forwards)
				}
			}
		})
	}
}

// TestTCPPolled: goroutines waiting for a peer's data over TCP (TLS and
// plaintext) poll the channel themselves, several at once and coming and
// going while the read loop also reads, and every message arrives once,
// in order and intact, small ones and striped large ones alike.
func TestTCPPolled(t *testing.T) {
	for _, m := range modes {
		if m.opt.Mode != ModeTCP {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			var mu sync.Mutex
			var seen []uint32
			var sums []uint64
			h := []transport.Handler{nil, func(_ int, lane transport.Lane, hd *transport.Header, p []byte) {
				if lane != transport.LaneData {
					return
				}
				var s uint64
				for _, c := range p {
					s = s*31 + uint64(c)
				}
				mu.Lock()
				seen = append(seen, binary.LittleEndian.Uint32(hd[4:]))
				sums = append(sums, s)
				mu.Unlock()
			}}
			eps := mesh(t, 2, m.opt, h, nil)
			defer eps[1].Close()
			defer eps[0].Close()
			waitPaths(t, eps, m.path)
			if !eps[1].Caps().Poll {
				t.Fatal("Caps().Poll is false in TCP mode")
			}
			// The inbound channel comes with the accepting side's
			// handshake, which waitPaths may precede (see inbound).
			poll, stop := eps[1].StartPolling(0)
			for end := time.Now().Add(10 * time.Second); poll == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
				poll, stop = eps[1].StartPolling(0)
			}
			if poll == nil {
				t.Fatal("no poll function for a TCP peer")
			}
			stop()
			n := 300
			if testing.Short() {
				n = 120
			}
			sizes := []int{8, 100, 64 << 10, 1 << 20}
			msgs := make([][]byte, n)
			want := make([]uint64, n)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range msgs {
				msgs[i] = make([]byte, sizes[rng.IntN(len(sizes))])
				for k := range msgs[i] {
					msgs[i][k] = byte(rng.Uint32())
				}
				for _, c := range msgs[i] {
					want[i] = want[i]*31 + uint64(c)
				}
			}
			// Goroutine 0 polls throughout, goroutine 1 comes and goes: with
			// a poller always there, the read loop must read nothing.
			var polls atomic.Int64
			quit := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 2 {
				started := make(chan struct{})
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 9))
					for first := true; ; first = false {
						poll, stop := eps[1].StartPolling(0)
						if first {
							close(started)
						}
						for k := 0; g == 0 || k < r.IntN(200); k++ {
							if poll() {
								polls.Add(1)
							}
							if g == 0 && k%64 == 0 {
								select {
								case <-quit:
									stop()
									return
								default:
								}
							}
						}
						stop()
						select {
						case <-quit:
							return
						case <-time.After(time.Duration(r.IntN(100)) * time.Microsecond):
						}
					}
				})
				<-started
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for i, p := range msgs {
				if err := eps[0].Send(ctx, 1, transport.LaneData, hdr(i), p); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				mu.Lock()
				k := len(seen)
				mu.Unlock()
				if k >= n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d messages delivered in 30 s", k, n)
				}
				time.Sleep(5 * time.Millisecond)
			}
			close(quit)
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != n {
				t.Fatalf("%d messages delivered, want %d", len(seen), n)
			}
			for i := range seen {
				if seen[i] != uint32(i) || sums[i] != want[i] {
					t.Fatalf("message %d: tag %d, checksum ok %v", i, seen[i], sums[i] == want[i])
				}
			}
			if polls.Load() == 0 {
				t.Fatal("the pollers read nothing")
			}
			eps[1].mu.Lock()
			in := eps[1].in[0]
			eps[1].mu.Unlock()
			if in == nil {
				t.Fatal("rank 1 has no channel from rank 0")
			}
			if k := in.loopFrames.Load(); k != 0 {
				t.Fatalf("the read loop read %d of %d frames while goroutines polled", k, n)
			}
		})
	}
}

// TestTCPAwaitRefused: Await does not sleep on a TCP channel (core blocks
// as on any path there, and the read loop delivers): it reports false at
// once, and the messages still arrive.
func TestTCPAwaitRefused(t *testing.T) {
	var got atomic.Int32
	h := []transport.Handler{nil, func(_ int, lane transport.Lane, _ *transport.Header, _ []byte) {
		if lane == transport.LaneData {
			got.Add(1)
		}
	}}
	eps := mesh(t, 2, Options{Mode: ModeTCP}, h, nil)
	defer eps[0].Close()
	defer eps[1].Close()
	waitPaths(t, eps, "tcp x2 tls")
	start := time.Now()
	if eps[1].Await(0, func() bool { return false }, 10*time.Second) {
		t.Fatal("Await slept on a TCP channel")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Await took %v to refuse a TCP channel", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eps[0].Send(ctx, 1, transport.LaneData, hdr(0), []byte("x")); err != nil {
		t.Fatal(err)
	}
	for got.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the message was not delivered in 30 s")
		}
		time.Sleep(time.Millisecond)
	}
}
