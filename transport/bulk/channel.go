package bulk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
	"github.com/nexar-go/nexar/transport/internal/record"
)

const (
	// stripeMin is the smallest stripe worth a connection of its own: below
	// 2*stripeMin a message travels whole on the first link.
	stripeMin = 256 << 10
	// inlineMax is the largest payload copied behind the prefix so that the
	// frame leaves in one write.
	inlineMax = 32 << 10
	readBuf   = 64 << 10
)

// link is one ordered byte stream of a channel: a TCP connection or a ring.
type link interface {
	io.Reader
	// write writes every buffer in order; n counts the bytes written, so
	// the caller knows whether a failed write left a partial frame.
	// progress (may be nil) is work to do while the write waits; links
	// that cannot wait that way ignore it.
	write(ctx context.Context, progress func() bool, bufs ...[]byte) (n int, err error)
	Close() error
}

type ringLink struct{ r *ring }

func (l ringLink) Read(p []byte) (int, error) { return l.r.Read(p) }
func (l ringLink) Close() error               { return l.r.Close() }
func (l ringLink) write(ctx context.Context, progress func() bool, bufs ...[]byte) (int, error) {
	n := 0
	for _, b := range bufs {
		m, err := l.r.Write(ctx, b, progress)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// connLink is a TCP connection, c possibly TLS over raw. Close closes raw
// without a TLS close_notify, which could block for seconds behind a full
// send buffer; the goodbye frame already marks a graceful end. w, where
// set (a data channel's sending side), writes to raw: c's records go
// through it too.
type connLink struct {
	c, raw net.Conn
	w      *sockWriter
}

func (l connLink) Read(p []byte) (int, error) { return l.c.Read(p) }
func (l connLink) Close() error               { return l.raw.Close() }

// write honours ctx by moving the write deadline into the past; with w,
// only for what the socket does not take at once.
func (l connLink) write(ctx context.Context, _ func() bool, bufs ...[]byte) (int, error) {
	if l.w == nil {
		return watched(ctx, l.c, net.Buffers(bufs))
	}
	l.w.ctx = ctx
	defer func() { l.w.ctx = nil }()
	if l.c == l.raw {
		return l.w.writeBuffers(bufs)
	}
	if rc, ok := l.c.(*record.Conn); ok {
		return rc.WriteBuffers(bufs...) // sealed into one write through w
	}
	return watched(ctx, l.c, net.Buffers(bufs))
}

// watched writes bufs to c, honouring ctx by moving the write deadline
// into the past when it ends.
func watched(ctx context.Context, c net.Conn, bufs net.Buffers) (int, error) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	n, err := bufs.WriteTo(c) // writev on a plain TCP connection
	if !stop() {
		<-fired
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return int(n), err
}

// channel carries LaneData frames in one direction between two ranks over
// one or more links. A frame's prefix and first stripe go on link 0; a large
// payload is split into equal stripes, one per link, which the receiver
// reads in parallel and reassembles, so frames stay in order. send is safe
// for concurrent use. On the receiving side one goroutine runs readLoop; when
// the channel is a shared-memory ring, goroutines waiting for data from the
// peer may also poll it, which saves the hand-off from the read loop. Frames
// are read by one of them at a time (rmu).
type channel struct {
	peer  int
	desc  string
	links []link
	sem   *sendLock // serialises frames
	buf   []byte
	bufs  [2][]byte // sendOne's argument list: a variadic slice would escape

	dead   chan struct{} // closed by close
	once   sync.Once
	broken atomic.Bool
	quiet  atomic.Bool // closed on purpose: do not report the peer down
	framed atomic.Bool // receiving side: a frame was read (readLoop, not rings)

	ring *ring // the only link, when the channel is a shared-memory ring

	// Receiving side, set by startReading.
	deliver func(h *transport.Header, p []byte)
	place   func(h *transport.Header, n int) ([]byte, func(error))
	// rmu guards r0, pre, rxh, end and rx: one reader at a time.
	rmu    sync.Mutex
	r0     io.Reader // rmu: link 0, buffered for TCP
	pre    [frame.PrefixSize]byte
	rxh    transport.Header // rmu: a ring frame's header, while rx reads it
	end    error            // rmu: the frame error that ended the channel, once met
	rx     rxFrame          // rmu
	pollFn func() bool      // immutable after startReading: poll, made once
	// unpollFn is StartPolling's stop for a TCP channel with sock, set by
	// the endpoint before the channel can be polled.
	unpollFn func()
	// sleepers (atomic) counts this process's goroutines asleep in await:
	// a goroutine that delivers frames while one is wakes them (nudge).
	sleepers atomic.Int32
	// remotePID (atomic) is the sender's process id once this (receiving)
	// side knows it can copy payloads out of the sender's memory.
	remotePID atomic.Int64
	// remoteMin is the smallest payload sent as a remote frame (sending
	// side); 0: never. Set before the channel is installed, then
	// immutable.
	remoteMin int

	// A TCP channel's receiving side, where its first connection was
	// taken out of Go's poller (sock, set by startReading): goroutines
	// waiting for its data read it themselves (pollTCP) while pollers is
	// not 0, and the read loop keeps off the socket meanwhile.
	sock    *sockWait
	pollers atomic.Int32
	// proc is this process's polling state (the endpoint's presence), for
	// the read loop's stepping aside (aside); nil: it never does.
	proc *presence
	// blocked counts the goroutines blocked until this peer's data is
	// delivered (Waiting): the last poller to stop wakes the read loop
	// for them.
	blocked atomic.Int32
	// loopFrames counts the frames the read loop read (tests).
	loopFrames atomic.Int64
	// watching: the read loop sleeps on the socket (not parked), where
	// bytes a poller read ahead would wait for the next arrival.
	watching atomic.Bool
	// beforeWait, when set (tests only), runs in readLoopTCP just before
	// it sleeps on the socket (watching already set).
	beforeWait func()
}

// rxFrame is the frame a ring channel is in the middle of reading: ring
// readers consume what has arrived and return, so a frame may take several
// calls.
type rxFrame struct {
	npre   int  // prefix bytes read into channel.pre
	remote bool // the prefix said remote: a descriptor, not the payload, follows
	ndesc  int  // descriptor bytes read into desc
	desc   [frame.RemoteSize]byte
	addr   uint64 // where a remote payload lies in the sender
	active bool
	h      *transport.Header
	p      []byte
	off    int
	done   func(error) // set when p was placed
}

func newChannel(peer int, desc string, links []link) *channel {
	c := &channel{peer: peer, desc: desc, links: links, sem: newSendLock(), dead: make(chan struct{})}
	if rl, ok := links[0].(ringLink); ok && len(links) == 1 {
		c.ring = rl.r
	}
	c.pollFn = c.poll
	return c
}

func (c *channel) close() {
	c.once.Do(func() {
		close(c.dead)
		for _, l := range c.links {
			l.Close()
		}
		if c.sock != nil {
			c.sock.shutdown()
		}
	})
}

// stripes splits n bytes over at most k links: stripe i is [off(i), off(i+1)).
func stripes(n, k int) (parts, per int) {
	parts = 1
	if k > 1 && n >= 2*stripeMin {
		parts = min(k, n/stripeMin)
	}
	per = (n + parts - 1) / parts
	per = (per + 4095) &^ 4095
	return parts, per
}

func part(p []byte, i, per int) []byte {
	lo := min(i*per, len(p))
	hi := min(lo+per, len(p))
	return p[lo:hi]
}

var errBroken = errors.New("bulk: channel broken by an earlier failure")

// send writes one frame. An error after some bytes left breaks the channel
// (the stream can no longer be framed); broken reports that. dev: p is
// device memory, which host code must not read: it goes to the link as a
// buffer of its own (a device channel has one link and no remote frames).
func (c *channel) send(ctx context.Context, h *transport.Header, p []byte, progress func() bool, dev bool) (broken bool, err error) {
	if err := c.sem.lockCtx(ctx, c.dead); err != nil {
		return err == errBroken, err
	}
	defer c.sem.unlock()
	if c.broken.Load() {
		return true, errBroken
	}
	if c.ring != nil && c.remoteMin > 0 && len(p) >= c.remoteMin && c.ring.remoteOK() && !dev {
		return c.sendRemote(ctx, h, p, progress)
	}
	parts, per := stripes(len(p), len(c.links))
	c.buf = frame.AppendPrefix(c.buf[:0], transport.LaneData, h, len(p))
	if dev {
		parts, per = 1, len(p)
	}
	first := part(p, 0, per)
	if parts == 1 {
		return c.sendOne(ctx, first, progress, !dev)
	}
	bufs := [][]byte{c.buf, first}
	if len(first) <= inlineMax {
		c.buf = append(c.buf, first...)
		bufs = bufs[:1]
		bufs[0] = c.buf
	}
	var wrote atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, parts)
	for i := 1; i < parts; i++ {
		per := per // captured here, so that the one-part path above does not move per to the heap
		wg.Go(func() {
			n, err := c.links[i].write(ctx, nil, part(p, i, per))
			wrote.Add(int64(n))
			errs[i] = err
		})
	}
	n, err0 := c.links[0].write(ctx, progress, bufs...)
	wrote.Add(int64(n))
	errs[0] = err0
	if err0 != nil && parts > 1 {
		c.close() // unblock the other stripes
	}
	wg.Wait()
	if cap(c.buf) > 4*inlineMax {
		c.buf = nil
	}
	err = errors.Join(errs...)
	if err == nil {
		return false, nil
	}
	if wrote.Load() == 0 && ctx.Err() != nil {
		return false, ctx.Err()
	}
	c.broken.Store(true)
	if ctx.Err() != nil {
		return true, fmt.Errorf("cancelled mid-frame: %w", ctx.Err())
	}
	return true, err
}

// sendOne writes a frame whose prefix is in c.buf and whose payload p goes
// whole on link 0 (no stripes: the common case, kept free of allocations).
// A short p is gathered behind the prefix where gather allows (not for
// device memory). Called with the semaphore held.
func (c *channel) sendOne(ctx context.Context, p []byte, progress func() bool, gather bool) (bool, error) {
	var n int
	var err error
	if len(p) <= inlineMax && gather {
		c.buf = append(c.buf, p...)
		c.bufs[0] = c.buf
		n, err = c.links[0].write(ctx, progress, c.bufs[:1]...)
	} else {
		c.bufs[0], c.bufs[1] = c.buf, p
		n, err = c.links[0].write(ctx, progress, c.bufs[:]...)
	}
	c.bufs = [2][]byte{}
	if cap(c.buf) > 4*inlineMax {
		c.buf = nil
	}
	if err == nil {
		return false, nil
	}
	if n == 0 && ctx.Err() != nil {
		return false, ctx.Err()
	}
	c.broken.Store(true)
	if ctx.Err() != nil {
		return true, fmt.Errorf("cancelled mid-frame: %w", ctx.Err())
	}
	return true, err
}

// sendRemote writes a remote frame for p and waits until the receiver has
// copied p out of this process's memory (p must stay put until then: it is
// at least remoteMin bytes, so on the heap or in C memory, neither of which
// moves). Called with the semaphore held.
func (c *channel) sendRemote(ctx context.Context, h *transport.Header, p []byte, progress func() bool) (bool, error) {
	c.buf = frame.AppendRemote(c.buf[:0], transport.LaneData, h, len(p), uint64(uintptr(unsafe.Pointer(&p[0]))))
	k := c.ring.sentRemote()
	n, err := c.ring.Write(ctx, c.buf, progress)
	if err == nil {
		err = c.ring.waitAck(ctx, k, len(p), progress)
	}
	runtime.KeepAlive(p)
	if err == nil {
		return false, nil
	}
	if n == 0 && ctx.Err() != nil {
		return false, ctx.Err()
	}
	// The receiver may be copying p as we return: close the channel so
	// that what it reads is never delivered as a whole frame.
	c.broken.Store(true)
	c.close()
	return true, err
}

// goodbye ends the channel gracefully: it waits (until deadline) for the
// frame in flight, sends a goodbye frame on link 0 and closes every link,
// so the receiver reads everything sent before it. Past the deadline the
// links are closed at once. It keeps the semaphore: nothing can follow.
func (c *channel) goodbye(deadline time.Time) {
	switch c.sem.lockUntil(deadline, c.dead) {
	case cancelled:
		c.close()
		return
	case ended:
		return
	}
	if !c.broken.Load() {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c.links[0].write(ctx, nil, frame.AppendGoodbye(nil, transport.LaneData))
		cancel()
	}
	c.close()
}

// startReading prepares the receiving side: deliver gets the payloads that
// place (may be nil) does not take.
func (c *channel) startReading(deliver func(h *transport.Header, p []byte), place func(h *transport.Header, n int) ([]byte, func(error))) {
	c.deliver, c.place = deliver, place
	c.r0 = c.links[0]
	if cl, ok := c.links[0].(connLink); ok {
		var src io.Reader = c.links[0]
		if c.sock = newSockWait(cl.raw); c.sock != nil {
			src = c.sock
			if rc, ok := cl.c.(*record.Conn); ok {
				rc.ReadSource(c.sock)
				src = rc
			}
			c.pollFn = c.pollTCP
		}
		c.r0 = bufio.NewReaderSize(src, readBuf)
	}
}

// readLoop delivers frames until a link fails or a goodbye arrives; it
// returns frame.ErrGoodbye for a graceful end, else the failure.
func (c *channel) readLoop() error {
	if c.sock != nil {
		return c.readLoopTCP()
	}
	if c.ring == nil {
		for {
			c.rmu.Lock()
			err := c.readFrame()
			c.rmu.Unlock()
			if err != nil {
				return err
			}
			c.markFramed()
		}
	}
	idle := idleMin
	var beat uint32 // the process's presence beat at the last wake-up
	for {
		// Wait without the lock, so that a poller can read meanwhile.
		ready, waited := c.ring.waitData(idle)
		// With more ranks than cores, timed wake-ups of every ring's
		// reader cost more than they save: rely on the producer's wake
		// (a goroutine waits, or the ring fills) and sleep long.
		lo, hi := idleMin, idleMax
		if c.ring.yield.Load() {
			lo, hi = idleMaxShared, idleMaxShared
		}
		polling := false // this process polls, or did since the last wake-up
		if pres := c.ring.pres; pres != nil {
			b := pres.beat.Load()
			polling = pres.pollers.Load() > 0 || b != beat
			beat = b
		}
		switch {
		case polling:
			// The pollers take what comes, and waiters and a full ring
			// wake this reader themselves (setWaiting, wakeIdle): sleep
			// long, as with more ranks than cores. Each sleep holds a P
			// in a blocking futex, which sysmon retakes; sysmon then
			// wakes every 20 µs for a millisecond and more, and each of
			// its wake-ups preempts a spinning rank for 10-40 µs: with
			// sleeps of 1-20 ms here that was most of the 8 B
			// allreduce's p99 (docs/performance.md, "The tail of a
			// small allreduce").
			idle = idleMaxShared
		case !ready && waited == nil:
			idle = min(2*idle, hi) // nothing came: sleep longer
		default:
			idle = lo
		}
		if !ready && waited == nil {
			continue
		}
		c.rmu.Lock()
		n, err := c.stepRing(0)
		if n > 0 && c.sleepers.Load() > 0 {
			c.ring.nudge()
		}
		if err == nil && waited != nil && c.ring.available() == 0 {
			err = c.ring.closedErr()
			if err == io.EOF && (c.rx.active || c.rx.npre > 0) {
				err = io.ErrUnexpectedEOF
			}
			if err == nil {
				err = waited
			}
			c.fail(err)
		}
		c.rmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// readLoopTCP is readLoop for a TCP channel whose first connection is out
// of Go's poller: it reads what arrives while nobody polls, sleeping on
// the socket in between. While goroutines poll it stays off the socket, so
// that no thread is woken by what they read: it looks again when woken
// (Waiting: a waiter is about to block; a poller left bytes read ahead) or
// after parkSlot, whichever comes first. It also stays off the socket while
// it steps aside (aside), but then reads what is there once per parkSlot.
// On its way out it closes the socket (release), with rmu held, so that no
// reader can use the closed descriptor.
func (c *channel) readLoopTCP() (err error) {
	defer func() {
		c.rmu.Lock()
		if c.end == nil {
			c.end = err
		}
		err = c.end
		c.sock.release()
		c.rmu.Unlock()
	}()
	slept := false // parked aside for a slot: read what is there, once
	for {
		if c.pollers.Load() > 0 || (c.aside() && !slept) {
			if err := c.sock.wait(false, parkSlot); err != nil {
				return err
			}
			if c.isDead() {
				return net.ErrClosed
			}
			slept = c.pollers.Load() == 0
			continue
		}
		slept = false
		c.rmu.Lock()
		for c.end == nil && c.readyLocked() {
			if c.readFrame() != nil {
				break
			}
			c.loopFrames.Add(1)
			c.markFramed()
			if c.pollers.Load() > 0 {
				break // the poller takes the rest
			}
		}
		end := c.end
		c.rmu.Unlock()
		if end != nil {
			return end
		}
		if c.pollers.Load() > 0 || c.aside() {
			continue
		}
		// Watching from here: a poller that stops leaving bytes read
		// ahead wakes the loop (stopPollTCP). One that left them before
		// it could see the flag is seen here instead.
		c.watching.Store(true)
		c.rmu.Lock()
		left := c.end == nil && c.bufferedLocked()
		c.rmu.Unlock()
		if left {
			c.watching.Store(false)
			continue
		}
		if c.beforeWait != nil {
			c.beforeWait()
		}
		err := c.sock.wait(true, -1)
		c.watching.Store(false)
		if err != nil {
			return err
		}
		if c.isDead() {
			return net.ErrClosed
		}
	}
}

// aside reports whether the read loop of a TCP channel stays off its
// socket although nobody polls this channel: this process polls another
// (a goroutine spins inside a call), it shares its cores with more ranks
// than they number, and nobody is blocked on this channel. There every
// thread woken takes a core from a rank that spins, and a read loop woken
// for each message that arrives while its rank still works on another
// peer's step (a leader reducing its host's data before the exchange
// between hosts) cost a third of an 8-byte allreduce, 2 hosts x 2 ranks
// on 2 cores (docs/performance.md). The data waits in the socket for the
// poll that wants it; the loop still reads what is there once per
// parkSlot, so that a sender stopped by a full socket moves on even if
// nobody here asks for its data.
func (c *channel) aside() bool {
	return c.proc != nil && c.proc.crowded.Load() && c.proc.pollers.Load() > 0 && c.blocked.Load() == 0
}

// parkSlot bounds how long a TCP channel's read loop stays off the socket
// while goroutines poll it, unwoken: data that arrives then and that no
// poller takes (nobody waits for it yet, and nobody blocked on it, which
// would wake the loop) waits at most this long to be read.
const parkSlot = 2 * time.Millisecond

// markFramed records that a frame was read, once: a store per frame would
// take the flag's cache line from whoever reads it.
func (c *channel) markFramed() {
	if !c.framed.Load() {
		c.framed.Store(true)
	}
}

func (c *channel) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// readyLocked reports whether a read of link 0 would find data without
// waiting: bytes the readers above the socket hold, or bytes (or the end)
// on the socket. Called with rmu held, on a channel with sock.
func (c *channel) readyLocked() bool {
	return c.bufferedLocked() || c.sock.peek()
}

// bufferedLocked reports whether the readers above link 0's socket hold
// bytes the socket no longer does (rmu held).
func (c *channel) bufferedLocked() bool {
	if br, ok := c.r0.(*bufio.Reader); ok && br.Buffered() > 0 {
		return true
	}
	if cl, ok := c.links[0].(connLink); ok {
		if rc, ok := cl.c.(*record.Conn); ok && rc.Buffered() > 0 {
			return true
		}
	}
	return false
}

// pollTCP is poll for a TCP channel with sock: it reads one frame in the
// calling goroutine if its first bytes have arrived (the rest follows
// them, so the read does not wait long), and reports whether it did. One
// frame, not what the readers above the socket read ahead with it: those
// frames' receives are often not posted yet, and read now they would
// arrive early (a pooled copy). It returns at once when another goroutine
// is reading. A frame error ends the channel: the read loop, woken by the
// close, reports it.
func (c *channel) pollTCP() bool {
	if !c.rmu.TryLock() {
		return false
	}
	if c.end != nil || !c.readyLocked() {
		c.rmu.Unlock()
		return false
	}
	err := c.readFrame()
	if err == nil {
		c.markFramed()
	}
	c.rmu.Unlock()
	if err != nil {
		c.close()
	}
	return true
}

// startPollTCP counts a goroutine that polls the channel (pollTCP).
func (c *channel) startPollTCP() { c.pollers.Add(1) }

// stopPollTCP ends a poller's count. The read loop is not woken for it
// (in a ping-pong that would be a wake-up per message): parked, it looks
// again within parkSlot, or when a waiter blocks (Waiting). But where the
// readers above the socket hold bytes read ahead past the frame the poller
// wanted, a read loop asleep on the socket would not see them until more
// arrives, so the last poller wakes it then.
func (c *channel) stopPollTCP() {
	if c.pollers.Add(-1) != 0 {
		return
	}
	// When the lock is held, its holder is the read loop, which reads
	// until nothing is left (or checks, as it starts watching), or a new
	// poller, which stops the same way.
	if c.blocked.Load() > 0 {
		c.sock.wake() // parked, the loop would leave them up to parkSlot
		return
	}
	if c.rmu.TryLock() {
		left := c.end == nil && c.bufferedLocked()
		c.rmu.Unlock()
		if left && c.watching.Load() {
			c.sock.wake()
		}
	}
}

// Idle reader sleeps: short while the ring is busy and nobody in this
// process polls, so that data no poller took is not held long, growing
// while it stays idle; long (idleMaxShared) while the process polls.
const (
	idleMin = 1 * time.Millisecond
	idleMax = 20 * time.Millisecond
	// idleMaxShared is the sleep on a host with more ranks than cores,
	// and while this process polls.
	idleMaxShared = 200 * time.Millisecond
)

// pollBudget bounds the bytes one poll consumes, so that a goroutine that
// also writes (an exchange) alternates between the two directions.
const pollBudget = 256 << 10

// poll consumes, in the calling goroutine, what has arrived on a ring
// channel (at most pollBudget bytes), delivering the frames it completes,
// and reports whether it consumed anything. It returns at once when another
// goroutine is reading. A frame error ends the channel: the read loop,
// woken by the close, reports it.
func (c *channel) poll() bool {
	if !c.rmu.TryLock() {
		return false
	}
	return c.stepUnlock()
}

// stepUnlock consumes what the ring holds (c.rmu held; released here),
// passes the wake-up on to other sleepers if it consumed anything, and
// ends a channel whose frames ended. It reports whether it consumed.
func (c *channel) stepUnlock() bool {
	n, _ := c.stepRing(pollBudget)
	ended := c.end != nil
	if r := c.ring; r.pres != nil {
		if r.polls++; r.polls%pollsPerBeat == 1 && r.pres.pollers.Load() > 0 {
			r.pres.publish(presPolling)
		}
	}
	c.rmu.Unlock()
	if n > 0 && c.sleepers.Load() > 0 {
		c.ring.nudge()
	}
	if ended {
		c.close()
	}
	return n > 0
}

// await sleeps in the calling thread until data arrives on the ring (the
// producer wakes it directly), d passes, or done reports true, and then
// consumes what arrived, delivering the frames it completes. It reports
// false, at once, when the ring is closed: the caller then waits for the
// read loop's delivery (or the channel's end) instead.
func (c *channel) await(done func() bool, d time.Duration) bool {
	c.sleepers.Add(1)
	pres := c.ring.pres
	if pres != nil {
		pres.publish(presAsleep)
	}
	ok := c.ring.sleepData(done, d)
	if pres != nil {
		state := uint64(0)
		if pres.pollers.Load() > 0 {
			state = presPolling
		}
		pres.publish(state)
	}
	c.sleepers.Add(-1)
	if !ok {
		return false
	}
	// Lock, not TryLock: the read loop may be delivering what woke us,
	// and the caller checks done as soon as this returns.
	c.rmu.Lock()
	c.stepUnlock()
	return true
}

// stepRing consumes what is available on the ring without waiting, at most
// budget bytes (0: no bound), completing and delivering frames as their
// last byte arrives. It returns the bytes consumed. Called with rmu held.
func (c *channel) stepRing(budget int) (int, error) {
	used := 0
	for c.end == nil && (budget <= 0 || used < budget) {
		rx := &c.rx
		if !rx.active {
			k, full := c.readPart(c.pre[:], &rx.npre)
			if used += k; !full {
				if k == 0 {
					return used, nil
				}
				continue
			}
			rx.npre = 0
			h := &c.rxh
			n, remote, err := c.parse(h)
			if err == nil && remote && c.remotePID.Load() == 0 {
				err = fmt.Errorf("%w: remote frame before cross-memory attach was agreed", frame.ErrMalformed)
			}
			if err != nil {
				c.fail(err)
				return used, err
			}
			rx.h, rx.off, rx.remote, rx.active = h, 0, remote, true
			rx.p, rx.done = c.destination(h, n)
		}
		if rx.remote && rx.ndesc < frame.RemoteSize {
			k, full := c.readPart(rx.desc[:], &rx.ndesc)
			if used += k; !full {
				if k == 0 {
					return used, nil
				}
				continue
			}
			addr, err := frame.RemoteAddr(&rx.desc)
			if err != nil {
				c.fail(err)
				return used, err
			}
			rx.addr = addr
		}
		if rx.off < len(rx.p) {
			want := len(rx.p) - rx.off
			var k int
			if rx.remote {
				// All of it, whatever the budget: the ring holds nothing
				// more of this frame to wake a reader for the rest, and
				// the sender waits for it anyway.
				if err := readRemote(int(c.remotePID.Load()), rx.addr, rx.p); err != nil {
					c.fail(err)
					return used, err
				}
				k = want
			} else {
				if budget > 0 {
					want = min(want, max(budget-used, 1))
				}
				k = c.ring.TryRead(rx.p[rx.off : rx.off+want])
			}
			rx.off += k
			used += k
			if rx.off < len(rx.p) {
				if k == 0 {
					return used, nil
				}
				continue
			}
		}
		h, p, done := rx.h, rx.p, rx.done
		if rx.remote {
			c.ring.ack()
		}
		*rx = rxFrame{}
		if done != nil {
			done(nil)
			if budget > 0 {
				// A poller's receive may be complete: it checks before
				// more is consumed, and a frame for a receive not posted
				// yet stays in the ring until it is (placed then, not
				// copied into a buffer of its own).
				return used, c.end
			}
		} else {
			hc := *h // deliver may keep it; c.rxh is the next frame's
			c.deliver(&hc, p)
		}
	}
	return used, c.end
}

// readPart reads what has arrived into buf[*have:], without waiting, and
// reports how much it read and whether buf is now full.
func (c *channel) readPart(buf []byte, have *int) (int, bool) {
	k := c.ring.TryRead(buf[*have:])
	*have += k
	return k, *have == len(buf)
}

// parse checks the prefix in c.pre: a LaneData frame's header and length,
// and whether it is remote (rings only), else the error that ends the
// channel (frame.ErrGoodbye for a goodbye).
// The header goes into h.
func (c *channel) parse(h *transport.Header) (int, bool, error) {
	lane, n, remote, err := frame.ParsePrefixInto(&c.pre, transport.MaxPayload, h)
	if err != nil {
		if errors.Is(err, frame.ErrGoodbye) && lane != transport.LaneData {
			err = fmt.Errorf("%w: goodbye for lane %v on a bulk channel", frame.ErrMalformed, lane)
		}
		return 0, false, err
	}
	if lane != transport.LaneData {
		return 0, false, fmt.Errorf("%w: lane %v on a bulk channel", frame.ErrMalformed, lane)
	}
	if remote && c.ring == nil {
		return 0, false, fmt.Errorf("%w: remote frame on a TCP channel", frame.ErrMalformed)
	}
	return n, remote, nil
}

// destination is where the n payload bytes of a frame go: the placed
// buffer (done set) or a fresh one for deliver.
func (c *channel) destination(h *transport.Header, n int) ([]byte, func(error)) {
	if c.place != nil && n > 0 {
		p, done := c.place(h, n)
		if len(p) == n {
			return p, done
		}
		if done != nil {
			done(errors.New("bulk: placement of the wrong size"))
		}
	}
	return make([]byte, n), nil
}

// readFrame reads one frame, called with rmu held. The payload goes
// straight to its destination when place takes it, else to deliver.
func (c *channel) readFrame() error {
	if c.end != nil {
		return c.end
	}
	err := c.readFrameLocked()
	if err != nil {
		c.fail(err)
	}
	return err
}

// fail ends the receiving side with err, called with rmu held. A frame
// being placed is given up, so that its receiver stops waiting for it.
func (c *channel) fail(err error) {
	if c.end == nil {
		c.end = err
	}
	if done := c.rx.done; done != nil {
		done(err)
	}
	c.rx = rxFrame{}
}

func (c *channel) readFrameLocked() error {
	if _, err := io.ReadFull(c.r0, c.pre[:]); err != nil {
		return err
	}
	// deliver gets a copy of h; placing does not keep it. Remote frames
	// only come on rings.
	h := &c.rxh
	n, _, err := c.parse(h)
	if err != nil {
		return err
	}
	p, done := c.destination(h, n)
	parts, per := stripes(n, len(c.links))
	r0 := c.r0
	if l, ok := c.links[0].(rdmaLink); ok && done == nil {
		// Nobody placed the frame: p is read once, then buffered.
		r0 = onceReader{l.e}
	}
	if parts == 1 {
		// One stripe, read here: no goroutines, nothing to join.
		_, err := io.ReadFull(r0, p)
		return c.landed(h, p, done, err)
	}
	var wg sync.WaitGroup
	errs := make([]error, parts)
	for i := 1; i < parts; i++ {
		per := per // captured here, so that the one-part path above does not move per to the heap
		wg.Go(func() { _, errs[i] = io.ReadFull(c.links[i], part(p, i, per)) })
	}
	if _, errs[0] = io.ReadFull(r0, part(p, 0, per)); errs[0] != nil {
		c.close() // unblock the other stripes
	}
	wg.Wait()
	return c.landed(h, p, done, errors.Join(errs...))
}

// landed ends a frame read into p (readFrameLocked) with the read's
// error: its receiver is told (done), or the payload delivered.
func (c *channel) landed(h *transport.Header, p []byte, done func(error), err error) error {
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if done != nil {
			done(err)
		}
		return err
	}
	if done != nil {
		done(nil)
	} else {
		hc := *h // deliver may keep it; c.rxh is the next frame's
		c.deliver(&hc, p)
	}
	return nil
}
