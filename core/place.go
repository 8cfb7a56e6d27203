package core

import (
	"context"
	"time"

	"github.com/nexar-go/nexar/core/internal/match"
	"github.com/nexar-go/nexar/internal/sched"
	"github.com/nexar-go/nexar/transport"
)

// This file is the fast receive path: payloads read by the transport
// straight into the buffer of a posted receive (place), and a waiting
// goroutine that progresses a shared-memory channel itself instead of
// sleeping until the transport's read loop hands the message over (spin).

// place is the transport.PlaceFunc of the node: the destination of an
// expected payload, or nil to let the Handler buffer it.
func (n *node) place(from int, th *transport.Header, size int) ([]byte, func(error)) {
	if from < 0 || from >= n.size || n.hold.Load() != nil {
		return nil, nil
	}
	h, err := decodeHeader(th)
	if err != nil || (h.kind != kindColl && h.kind != kindP2P && h.kind != kindRPC) || h.total > 1<<62 || uint64(size) > h.total {
		return nil, nil // the Handler reports what is wrong
	}
	n.lastSeen[from].Store(n.mono())
	if h.kind == kindColl {
		// A communicator once registered: a closed one has failed, and
		// placeColl then leaves the frame to the Handler.
		c := n.placed.Load()
		if c == nil || c.id != h.comm || c.gen != h.gen {
			if c = n.comm(h.comm); c == nil || h.gen != c.gen {
				return nil, nil // the Handler drops another generation's
			}
			n.placed.Store(c)
		}
		src, ok := c.rankOfWorld(from)
		if !ok {
			return nil, nil
		}
		return c.placeColl(src, h, size)
	}
	c := n.comm(h.comm)
	if c == nil || h.gen != c.gen {
		return nil, nil // the Handler drops another generation's
	}
	src, ok := c.rankOfWorld(from)
	if !ok {
		return nil, nil
	}
	switch h.kind {
	case kindRPC:
		return c.placeRPC(src, h, size) // from RPC channels (transport/bulk)
	}
	return c.placeP2P(src, h, size)
}

// comm returns the registered communicator id, or nil.
func (n *node) comm(id uint64) *Comm {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.comms[id]
}

// resolveSpinWait fixes whether waiters yield the core between polls (the
// endpoint says whether this host runs more ranks than it has cores) and
// how long they spin (Config.SpinWait, else by that answer).
func (n *node) resolveSpinWait() {
	// Spin yielding the core (sched_yield), so that the rank being waited
	// for gets it: a sleep and wake-up through the kernel costs more than
	// the yields.
	n.oversubscribed = n.poll != nil && n.poll.Oversubscribed()
	n.spinWait = n.cfg.SpinWait
	if n.spinWait == 0 {
		n.spinWait = spinWaitDedicated
		if n.oversubscribed {
			n.spinWait = spinWaitShared
		}
	}
}

// blocking tells the endpoint that the caller is about to block until data
// from comm rank src (AnySource: any rank) is delivered; call the result
// when the wait ends.
func (c *Comm) blocking(src int) func() {
	if !c.n.caps.Poll {
		return func() {}
	}
	if src != AnySource {
		return c.n.poll.Waiting(c.world[src])
	}
	dones := make([]func(), 0, c.size)
	for r, w := range c.world {
		if r != c.rank {
			dones = append(dones, c.n.poll.Waiting(w))
		}
	}
	return func() {
		for _, d := range dones {
			d()
		}
	}
}

// pollOnce consumes what has arrived from comm rank src, if that channel
// can be polled.
func (c *Comm) pollOnce(src int) {
	if !c.n.caps.Poll {
		return
	}
	if poll, stop := c.n.poll.StartPolling(c.world[src]); poll != nil {
		poll()
		stop()
	}
}

// spin polls the channel from comm rank src until done fires, and
// reports whether it did; false, at once, when that channel cannot be
// polled. Where the path tells whether the peer runs (Caps().Presence), it
// spins for as long as the peer is in a call, polling for data itself
// (PeerPresence), up to spinMax: the peer answers as soon as it runs, and a
// rank that sleeps costs a scheduler round trip to wake, and is often woken
// onto its waker's CPU, where it then competes with the rank it waits for.
// When the peer is in a call but has stopped beating, or went to sleep,
// and last ran on this thread's CPU, it is likely queued behind this
// thread (queuedBehind), and cannot run while it spins: spin then yields
// the core between polls (two ranks that share a CPU then hand it to each
// other at every message, as they must). It gives up (the caller sleeps:
// await) once the peer has not been in a call for the node's spinWait;
// where nothing is known of the peer, spinWait after it began. With more
// ranks than cores it yields the core between polls, and gives up as soon
// as the peer is out of a call or asleep, or has not moved for staleAfter.
// A peer on another host (its TCP channel polled: no presence) is spun on
// for spinWait, yielding between polls.
func (c *Comm) spin(src int, done completion) bool {
	return c.spinPolled(src, done, polling{})
}

// polling is a poll of one peer's ring already begun (StartPolling), which
// a wait takes over and ends (stop): an exchange that polled while it sent
// goes on polling while it waits, rather than leaving and entering the
// poller count between the two, which publishes this rank's presence on a
// line the peer reads, twice per message (docs/performance.md).
type polling struct {
	poll func() bool
	stop func()
}

// spinPolled is spin, which takes over pre (not begun: zero) when it polls
// src's ring; pre is ended when it returns.
func (c *Comm) spinPolled(src int, done completion, pre polling) bool {
	if pre.stop != nil {
		defer pre.stop()
	}
	spinFor := c.n.spinWait
	if spinFor <= 0 || src < 0 || !c.n.caps.Poll {
		return false
	}
	peer := c.world[src]
	// A peer on another host (a TCP channel) publishes no presence, and
	// each poll is a system call: yield the core between polls, so that
	// this host's other threads (the rank's own, other ranks') run.
	remote := !c.n.ep.SharedMemory(peer)
	poll := pre.poll
	if poll == nil {
		var stop func()
		if poll, stop = c.n.poll.StartPolling(peer); poll == nil {
			return false
		}
		defer stop()
	}
	// No runtime.Gosched in the loop: on a thread that called in from C
	// (libnexar) the goroutine is locked to its thread, and every yield
	// is a thread hand-off through the kernel, tens of microseconds.
	presence := c.n.caps.Presence
	oversub := c.n.oversubscribed
	// The clock and the peer's presence are first read after 16 polls:
	// most waits end before. A clock read costs tens of nanoseconds on a
	// VM, and a read of the presence line takes it from the peer, which
	// writes it as it enters its own call (a cache miss there).
	var start, inCall, moved time.Time // began; peer last seen in a call; its beat last moved
	var beat uint32
	known := false
	still := 0 // looks at the peer since its beat last moved
	yield := oversub || remote
	for i := 0; ; i++ {
		if i == 16 {
			start = time.Now()
			inCall, moved = start, start
		}
		if i%16 == 0 && i > 0 && presence {
			now := start
			if i > 16 {
				now = time.Now()
			}
			if p, ok := c.n.poll.PeerPresence(peer); ok {
				if !known || p.Beat != beat {
					moved, still = now, 0
				} else {
					still++
				}
				beat, known = p.Beat, true
				if p.Polling {
					inCall = now
				}
				if oversub && i > 16 && (p.Asleep || (p.Polling && now.Sub(moved) > staleAfter)) {
					return false // give the core to a rank that can use it
				}
				queued := queuedBehind(p, still, sched.CPU())
				yield = oversub || queued || remote
				// With a core per rank, two ranks on one CPU would hand it
				// back and forth at every message while another CPU idles;
				// the higher rank moves (one of the two, or both would
				// land together again).
				if queued && !oversub && c.rank > src {
					c.n.moveOff(p.CPU, now)
				}
			}
			if i >= 16 && (now.Sub(inCall) > spinFor || now.Sub(start) > spinMax(spinFor)) {
				return false
			}
		} else if i%16 == 0 && i > 16 && time.Since(start) > spinFor {
			return false
		}
		if done.fired() {
			return true
		}
		if !poll() && yield {
			osYield() // the peer may be waiting for this core
		}
	}
}

// queuedBehind reports whether peer p, seen at still looks since its
// presence beat last moved, is likely queued behind the calling thread on
// its CPU cpu. A peer in a call beats while it runs: one that has not for
// three looks, and last ran on this CPU, is queued. So may be one that
// went to sleep on this CPU: this rank's message woke it, and the kernel
// often queues a woken thread on its waker's CPU, where it cannot say so
// until it runs (each rank then spun a whole spin window per message while
// the other CPU idled: about 1 ms a call, docs/performance.md). Not a rank
// of this process: it waits for a P, which yielding the thread does not
// give.
func queuedBehind(p transport.Presence, still, cpu int) bool {
	sameCPU := !p.InProcess && p.CPU >= 0 && p.CPU == cpu
	return sameCPU && ((p.Polling && still >= 3) || p.Asleep)
}

// moveOffEvery bounds how often a process moves a spinning thread off its
// peer's CPU (sched.MoveOff, a few microseconds): where the other CPUs are
// busy too, the move does not help, and it must not become the cost.
const moveOffEvery = time.Millisecond

// moveOff moves the calling thread off cpu, at most once per moveOffEvery
// per process.
func (n *node) moveOff(cpu int, now time.Time) {
	t := now.UnixNano()
	last := n.lastMove.Load()
	if t-last < int64(moveOffEvery) || !n.lastMove.CompareAndSwap(last, t) {
		return
	}
	sched.MoveOff(cpu)
}

// staleAfter is how long a peer that polls goes without a presence beat
// (one every few microseconds while it polls) before spin, with more
// ranks than cores, takes it for off the CPU.
const staleAfter = 50 * time.Microsecond

// spinMax bounds a spin on a peer that stays in a call (preempted, or
// waiting in turn for a rank that computes): ten spin windows, at least
// 5 ms, the scale of a scheduler's time slice on a loaded host.
func spinMax(spinFor time.Duration) time.Duration { return max(10*spinFor, 5*time.Millisecond) }

// awaitSlot bounds each sleep of await, so that a failure of the
// communicator or the end of ctx, which do not wake the sleeper, is seen
// within it.
const awaitSlot = 2 * time.Millisecond

// await waits for done by sleeping on the channel from comm rank src, where
// the sender wakes this thread itself (transport.DataPath.Await): after
// the spin window, a late peer's message then costs a futex wake, not a
// reader goroutine's wake and a pass through the scheduler. It reports
// whether done was closed; false when the communicator failed, ctx ended or
// the channel cannot be slept on, and the caller then blocks as before.
func (c *Comm) await(ctx context.Context, src int, done completion) bool {
	if src < 0 || !c.n.caps.Poll {
		return false
	}
	peer := c.world[src]
	// On a peer of another host the read loop delivers a late peer's
	// data: sleeping on the socket cost large transfers up to 2x in their
	// tail (docs/performance.md).
	if !c.n.ep.SharedMemory(peer) {
		return false
	}
	for {
		if done.fired() {
			return true
		}
		select {
		case <-c.failed:
			return false
		default:
		}
		// Err, not Done: an operation's Done starts timers and watchers.
		if ctx != nil && ctx.Err() != nil {
			return false
		}
		if !c.n.poll.Await(peer, done.firedFunc(), awaitSlot) {
			return false
		}
	}
}

// completion is what a waiter waits for: a posted receive (postedDone) or a
// Request; fired is checked while spinning and, as firedFunc, by a sleeper
// (Await), so that no channel is made unless the waiter blocks on one.
type completion interface {
	fired() bool
	firedFunc() func() bool
}

// postedDone is a posted collective receive's completion (one pointer: no
// allocation as an interface).
type postedDone struct{ m *match.Msg }

func (p postedDone) fired() bool { return p.m.Done.Fired() }

// firedFunc is made once per Msg, which the engine reuses.
func (p postedDone) firedFunc() func() bool {
	if p.m.Fired == nil {
		p.m.Fired = p.m.Done.Fired
	}
	return p.m.Fired
}

// firedFunc makes a Request a completion (an allocation per sleep: only
// point-to-point receives sleep on a Request).
func (r *Request) firedFunc() func() bool { return r.fired }

// spinDone waits for done for at most the node's spinWait without
// blocking, yielding the core between checks where the host is
// oversubscribed (the goroutine that closes done may need it); it reports
// whether done was closed.
func (c *Comm) spinDone(done completion) bool {
	spinFor := c.n.spinWait
	if spinFor <= 0 {
		return false
	}
	start := time.Now()
	for i := 1; ; i++ {
		if done.fired() {
			return true
		}
		// The goroutine that closes done runs on another thread: give
		// it the core (sched_yield; runtime.Gosched would hand this
		// thread off through the kernel, see spin).
		osYield()
		if i%16 == 0 && time.Since(start) > spinFor {
			return false
		}
	}
}
