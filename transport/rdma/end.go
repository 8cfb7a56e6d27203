//go:build cgo

package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	hw "github.com/nexar-go/nexar/hw/rdma"
)

// ErrClosed is returned by Read and Write once the end is closed.
var ErrClosed = errors.New("transport/rdma: channel closed")

// Messages sent by SEND begin with an 8-byte header: the kind, three zero
// bytes, and the credits the sender of the message grants (u32 LE; only
// the receiving end grants any).
const (
	msgData   = 1 // payload bytes of the stream follow the header
	msgRTS    = 2 // u64 length, u32 token: a buffer of that length follows by WRITE
	msgCTS    = 3 // u64 address, u64 length, u32 rkey, u32 token: write it there
	msgCredit = 4 // credits only

	hdrSize = 8
	ctlSize = 64 // a control message's buffer (credits, RTS, CTS)
	// sendWindow is the number of data buffers a sending end has in flight.
	sendWindow = 8
	// spinPolls is how often the progress loop polls an empty CQ before it
	// arms it and waits for an event.
	spinPolls = 8
)

// wr_id: the kind in the top byte, a buffer index or token below.
const (
	wrRecv  = 1 << 56
	wrSend  = 2 << 56
	wrWrite = 3 << 56
	wrProbe = 4 << 56
)

type itemKind uint8

const (
	itemData  itemKind = iota + 1 // bytes in receive buffer slot, [off, end)
	itemRTS                       // a buffer of n bytes announced, token
	itemWrote                     // the WRITE with immediate token has landed, n bytes
)

type item struct {
	kind     itemKind
	slot     int
	off, end int
	n        int
	token    uint32
}

type cts struct {
	addr  uint64
	n     int
	rkey  uint32
	token uint32
}

// End is one end of a one-direction channel: the receiving end (Listen,
// Accept; Read) or the sending end (Dial; Write). Read is for one
// goroutine at a time and so is Write; Close may be called from any
// goroutine, at any time, more than once.
type End struct {
	d     *Device
	peer  int
	recv  bool // the receiving end
	local params

	cq  *hw.CQ
	ch  *hw.CompChannel
	qp  *hw.QP
	mem []byte // receive buffers, then send buffers: one region outside the Go heap
	mr  *hw.MR

	nRecv, recvSize int
	nSend, sendSize int
	batch           int // credits returned at once (receiving end)

	stopped   chan struct{} // closed when the progress loop returns
	failed    chan struct{} // closed at the first failure (err set)
	quit      atomic.Bool
	closeOnce sync.Once

	mu          sync.Mutex
	cond        sync.Cond
	err         error // the first failure, sticky
	closed      bool
	running     bool // the progress loop was started
	outstanding int  // posted sends not completed yet
	freeSend    []int

	// Sending end.
	credits   int
	slots     int // the receiver's buffers: credits never exceed them
	granted   bool
	grantBy   time.Time
	nextToken uint32
	cts       *cts
	wrote     bool // the WRITE in flight completed (either way)
	probes    int  // probes acknowledged

	// Receiving end.
	inq         []item
	toReturn    int
	readWaiting bool
	stash       []byte // the rest of a buffer written into a temporary one
	written     int    // buffers written by RDMA WRITE: straight into the reader's buffer
	staged      int    // ... or into a temporary one (a short read)
	asked       int    // ... or asked for by SEND (ReadOnce)
}

func (d *Device) newEnd(peer int, recv bool, slots, slotSize int) (e *End, err error) {
	e = &End{d: d, peer: peer, recv: recv, stopped: make(chan struct{}), failed: make(chan struct{}), slots: slots}
	e.cond.L = &e.mu
	ctl := slots + 4
	if recv {
		e.nRecv, e.recvSize, e.nSend, e.sendSize = slots, slotSize, ctl, ctlSize
		e.batch = max(1, slots/4)
	} else {
		e.nRecv, e.recvSize, e.nSend, e.sendSize = ctl, ctlSize, sendWindow, slotSize
	}
	defer func() {
		if err != nil {
			e.release()
			err = fmt.Errorf("transport/rdma: channel %s rank %d on %s: %w", e.dir(), peer, d.desc, err)
		}
	}()
	size := e.nRecv*e.recvSize + e.nSend*e.sendSize
	if e.mem, err = syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS); err != nil {
		return nil, err
	}
	if e.mr, err = d.pd.Register(uintptr(unsafe.Pointer(&e.mem[0])), uintptr(size), hw.AccessLocalWrite); err != nil {
		return nil, err
	}
	if e.ch, err = d.ctx.NewCompChannel(); err != nil {
		return nil, err
	}
	if e.cq, err = d.ctx.NewCQ(e.nRecv+e.nSend+8, e.ch); err != nil {
		return nil, err
	}
	if e.qp, err = d.pd.NewRCQP(e.cq, e.cq, hw.QPCaps{MaxSend: e.nSend + 2, MaxRecv: e.nRecv, MaxSGE: 1}); err != nil {
		return nil, err
	}
	access := hw.AccessLocalWrite
	if recv {
		access |= hw.AccessRemoteWrite
	}
	if err = e.qp.Init(d.port.Num, access); err != nil {
		return nil, err
	}
	for i := range e.nRecv {
		if err = e.repostLocked(i); err != nil {
			return nil, err
		}
	}
	for i := range e.nSend {
		e.freeSend = append(e.freeSend, i)
	}
	e.local = d.localParams(e.qp.QPN())
	d.ends.Add(1)
	d.mu.Lock()
	d.live[e] = struct{}{}
	d.mu.Unlock()
	return e, nil
}

func (e *End) dir() string {
	if e.recv {
		return "from"
	}
	return "to"
}

// release frees what newEnd made (an end whose construction failed, or
// the last step of teardown).
func (e *End) release() {
	if e.qp != nil {
		e.qp.Close()
	}
	if e.cq != nil {
		e.cq.Close()
	}
	if e.ch != nil {
		e.ch.Close()
	}
	if e.mr != nil {
		e.mr.Deregister()
	}
	if e.mem != nil {
		syscall.Munmap(e.mem)
	}
}

func (e *End) recvBuf(i int) []byte {
	return e.mem[i*e.recvSize : (i+1)*e.recvSize]
}

func (e *End) sendBuf(i int) []byte {
	off := e.nRecv * e.recvSize
	return e.mem[off+i*e.sendSize : off+(i+1)*e.sendSize]
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// connect moves the QP to RTS towards the peer and starts the progress
// loop.
func (e *End) connect(rp params) error {
	o := hw.ConnectOptions{GIDIndex: e.d.gid.Index, Timeout: 14, RetryCnt: 7, RNRRetry: 3, MinRNRTimer: 12}
	if err := e.qp.Connect(e.local.info(), rp.info(), o); err != nil {
		return fmt.Errorf("transport/rdma: connecting %s rank %d: %w", e.dir(), e.peer, err)
	}
	e.mu.Lock()
	e.running = true
	e.grantBy = time.Now().Add(initialCredits)
	e.mu.Unlock()
	go e.run()
	return nil
}

// run is the progress loop: it takes completions off the CQ, polling a
// little while they keep coming and otherwise waiting for the completion
// channel's event in the Go poller.
func (e *End) run() {
	defer close(e.stopped)
	wc := make([]hw.Completion, 32)
	spins := 0
	for !e.quit.Load() {
		n, err := e.cq.Poll(wc)
		if err != nil {
			e.fail(fmt.Errorf("transport/rdma: channel %s rank %d: %w", e.dir(), e.peer, err))
			return
		}
		if n > 0 {
			e.handle(wc[:n])
			spins = 0
			continue
		}
		if spins < spinPolls {
			spins++
			runtime.Gosched()
			continue
		}
		spins = 0
		if err := e.cq.Notify(); err != nil {
			e.fail(err)
			return
		}
		if n, err = e.cq.Poll(wc); n > 0 || err != nil {
			if n > 0 {
				e.handle(wc[:n])
			}
			continue // an error is reported at the top
		}
		ev, err := e.ch.Wait()
		if err != nil {
			if !errors.Is(err, hw.ErrInterrupted) {
				e.fail(err)
			}
			return
		}
		e.cq.Is(ev)
		e.cq.Ack()
	}
}

func (e *End) wake() {
	e.mu.Lock()
	e.cond.Broadcast()
	e.mu.Unlock()
}

func (e *End) fail(err error) {
	e.mu.Lock()
	e.failLocked(err)
	e.mu.Unlock()
}

// failLocked records the end's first failure, puts its QP in error (the
// peer's next operation on it fails too) and wakes every waiter.
func (e *End) failLocked(err error) {
	if e.err == nil {
		e.err = err
		close(e.failed)
		if !e.closed {
			e.qp.ToError()
		}
	}
	e.cond.Broadcast()
}

// Failed is closed when the end fails (Err says why), also where no Read
// or Write is under way to tell: a message the sending end handed to the
// NIC whose delivery failed (the peer's queue pair is gone or cannot be
// reached). Closing the end is not a failure. Safe for concurrent use.
func (e *End) Failed() <-chan struct{} { return e.failed }

// Err is the end's failure, nil while it has none. Safe for concurrent use.
func (e *End) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

func (e *End) protocolError(format string, args ...any) error {
	err := fmt.Errorf("transport/rdma: channel %s rank %d: protocol error: "+format, append([]any{e.dir(), e.peer}, args...)...)
	e.failLocked(err)
	return err
}

// wcError names a failed work completion, its operation and the peer.
func (e *End) wcError(c hw.Completion) error {
	what := "receive"
	switch c.WRID >> 56 {
	case wrSend >> 56:
		what = "SEND"
	case wrWrite >> 56:
		what = "RDMA WRITE"
	case wrProbe >> 56:
		what = "probe (a zero-byte RDMA WRITE)"
	}
	return fmt.Errorf("transport/rdma: %s on the channel %s rank %d (%s) failed: %w", what, e.dir(), e.peer, e.d.desc, c.Err())
}

func (e *End) handle(wcs []hw.Completion) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.cond.Broadcast()
	for _, c := range wcs {
		kind, idx := c.WRID&(0xff<<56), int(c.WRID&0xffffffff)
		switch kind {
		case wrSend:
			e.freeSend = append(e.freeSend, idx)
			e.outstanding--
		case wrWrite:
			e.outstanding--
			e.wrote = true
		case wrProbe:
			e.outstanding--
			if c.Status == hw.StatusSuccess {
				e.probes++
			}
		}
		if c.Status != hw.StatusSuccess {
			if c.Status != hw.StatusFlush || e.err == nil && !e.closed {
				e.failLocked(e.wcError(c))
			}
			continue
		}
		if kind == wrRecv {
			e.receivedLocked(idx, c)
		}
	}
	if e.recv {
		e.returnCreditsLocked(e.readWaiting)
	}
}

// receivedLocked takes a message (or a WRITE's immediate) that arrived in
// receive buffer i.
func (e *End) receivedLocked(i int, c hw.Completion) {
	if i >= e.nRecv {
		e.protocolError("receive buffer %d of %d", i, e.nRecv)
		return
	}
	if c.Opcode == hw.WCRecvWriteImm {
		if !e.recv {
			e.protocolError("a WRITE arrived at the sending end")
			return
		}
		e.inq = append(e.inq, item{kind: itemWrote, n: int(c.ByteLen), token: c.Imm})
		e.toReturn++
		e.repostLocked(i)
		return
	}
	b := e.recvBuf(i)
	if c.ByteLen < hdrSize || int(c.ByteLen) > len(b) {
		e.protocolError("a message of %d bytes", c.ByteLen)
		return
	}
	kind, credits := b[0], int(binary.LittleEndian.Uint32(b[4:8]))
	switch {
	case kind == msgData && e.recv && credits == 0:
		e.inq = append(e.inq, item{kind: itemData, slot: i, off: hdrSize, end: int(c.ByteLen)})
		return // reposted once read
	case kind == msgRTS && e.recv && credits == 0 && c.ByteLen >= hdrSize+12:
		n := binary.LittleEndian.Uint64(b[8:16])
		if n == 0 || n > 1<<31 {
			e.protocolError("a buffer of %d bytes announced", n)
			return
		}
		e.inq = append(e.inq, item{kind: itemRTS, n: int(n), token: binary.LittleEndian.Uint32(b[16:20])})
		e.toReturn++
	case kind == msgCTS && !e.recv && c.ByteLen >= hdrSize+24:
		e.cts = &cts{addr: binary.LittleEndian.Uint64(b[8:16]), n: int(binary.LittleEndian.Uint64(b[16:24])),
			rkey: binary.LittleEndian.Uint32(b[24:28]), token: binary.LittleEndian.Uint32(b[28:32])}
		e.credits += credits
	case kind == msgCredit && !e.recv:
		e.credits += credits
		e.granted = true
	default:
		e.protocolError("message kind %d with %d credits at the %s end", kind, credits, map[bool]string{true: "receiving", false: "sending"}[e.recv])
		return
	}
	if e.credits > e.slots {
		e.protocolError("%d credits for %d receive buffers", e.credits, e.slots)
		return
	}
	e.repostLocked(i)
}

func (e *End) repostLocked(i int) error {
	b := e.recvBuf(i)
	err := e.qp.PostRecv(wrRecv|uint64(i), hw.SGE{Addr: uint64(addrOf(b)), Len: uint32(len(b)), LKey: e.mr.LKey})
	if err != nil {
		err = fmt.Errorf("transport/rdma: channel %s rank %d: %w", e.dir(), e.peer, err)
		if e.running {
			e.failLocked(err)
		}
	}
	return err
}

// postLocked posts a send of b (inside e.mem, or a registered region at
// lkey) as op.
func (e *End) postLocked(wrID uint64, op int, addr uint64, n int, lkey uint32, raddr uint64, rkey, imm uint32) error {
	if e.err != nil {
		return e.err
	}
	if e.closed {
		return ErrClosed
	}
	err := e.qp.PostSend(hw.SendWR{WRID: wrID, Op: op, Signaled: true, SGE: []hw.SGE{{Addr: addr, Len: uint32(n), LKey: lkey}},
		RemoteAddr: raddr, RKey: rkey, Imm: imm})
	if err != nil {
		err = fmt.Errorf("transport/rdma: channel %s rank %d: %w", e.dir(), e.peer, err)
		e.failLocked(err)
		return err
	}
	e.outstanding++
	return nil
}

// postMsgLocked sends a control or data message from a free send buffer.
func (e *End) postMsgLocked(kind byte, credits int, body func(b []byte) int) error {
	i := e.freeSend[len(e.freeSend)-1]
	e.freeSend = e.freeSend[:len(e.freeSend)-1]
	b := e.sendBuf(i)
	b[0], b[1], b[2], b[3] = kind, 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:8], uint32(credits))
	n := hdrSize + body(b[hdrSize:])
	if err := e.postLocked(wrSend|uint64(i), hw.OpSend, uint64(addrOf(b)), n, e.mr.LKey, 0, 0, 0); err != nil {
		e.freeSend = append(e.freeSend, i)
		return err
	}
	return nil
}

// returnCreditsLocked gives the sender the credits of reposted buffers:
// a batch at a time, or all there are when force (the reader is about to
// wait: the sender may be waiting for exactly these).
func (e *End) returnCreditsLocked(force bool) error {
	if e.toReturn == 0 || e.err != nil || e.closed || (!force && e.toReturn < e.batch) || len(e.freeSend) == 0 {
		return nil
	}
	n := e.toReturn
	if err := e.postMsgLocked(msgCredit, n, func([]byte) int { return 0 }); err != nil {
		return err
	}
	e.toReturn = 0
	return nil
}

// waitLocked waits until ready, the end fails or closes, or ctx ends. A
// sending end that has not had its first credits gives up after
// initialCredits. A sending end that waits on the receiver (credits, a
// CTS) with nothing of its own in flight probes it every probeEvery: a
// receiver whose process died sends nothing more, and without a work
// request outstanding the NIC has nothing to retry that would tell.
func (e *End) waitLocked(ctx context.Context, ready func() bool) error {
	var stop func() bool
	var timer *time.Timer
	defer func() {
		if stop != nil {
			stop()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	var probeAt time.Time
	for {
		switch {
		case e.err != nil:
			return e.err
		case e.closed:
			return ErrClosed
		case ready():
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !e.recv && !e.granted && time.Now().After(e.grantBy):
			return e.protocolError("no credits within %v: the receiving end never connected", initialCredits)
		}
		if stop == nil {
			stop = context.AfterFunc(ctx, e.wake)
			if !e.recv {
				probeAt = time.Now().Add(probeEvery)
				timer = time.AfterFunc(e.nextCheckLocked(probeAt), e.wake)
			}
		} else if !e.recv {
			if !time.Now().Before(probeAt) {
				// Work in flight (an earlier probe too: outstanding counts
				// it) is retried by the NIC already; before the first
				// credits the receiver may not be connected yet.
				if e.granted && e.outstanding == 0 {
					if err := e.probeLocked(); err != nil {
						return err
					}
				}
				probeAt = time.Now().Add(probeEvery)
			}
			timer.Reset(e.nextCheckLocked(probeAt))
		}
		e.cond.Wait()
	}
}

// nextCheckLocked is how long a waiting sending end sleeps before it looks
// again: until its next probe, or until it gives up on the first credits.
func (e *End) nextCheckLocked(probeAt time.Time) time.Duration {
	at := probeAt
	if !e.granted && e.grantBy.Before(at) {
		at = e.grantBy
	}
	return time.Until(at) + time.Millisecond
}

// probeLocked posts a zero-byte RDMA WRITE to the receiving end's queue
// pair. The receiving NIC acknowledges it without touching memory or
// consuming a receive (no rkey is checked for zero bytes) and completes
// nothing there; when the receiver's queue pair is gone the NIC's
// transport retries run out and the completion fails the end, naming the
// peer. No SGE at all rather than a zero-length one, which providers
// handle differently (some drop it from the work request).
func (e *End) probeLocked() error {
	if err := e.qp.PostSend(hw.SendWR{WRID: wrProbe, Op: hw.OpWrite, Signaled: true}); err != nil {
		err = fmt.Errorf("transport/rdma: probing the channel %s rank %d: %w", e.dir(), e.peer, err)
		e.failLocked(err)
		return err
	}
	e.outstanding++
	return nil
}

// Write sends bufs in order as one stream: short ones by SEND, each one
// of WriteMin bytes or more (and every buffer in device memory) by RDMA
// WRITE into the buffer the receiving end's Read names. It returns when
// the channel holds every byte and no longer reads bufs; n > 0 with an
// error means the stream was cut inside bufs. For one goroutine at a time.
func (e *End) Write(ctx context.Context, bufs ...[]byte) (int, error) {
	if e.recv {
		return 0, errors.New("transport/rdma: Write on a receiving end")
	}
	n := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		var k int
		var err error
		if len(b) >= e.d.opt.WriteMin || e.d.gpu.isDevice(b) {
			var bySend bool
			if k, bySend, err = e.writeLarge(ctx, b); bySend {
				k, err = e.writeAsked(ctx, b)
			}
		} else {
			k, err = e.writeSmall(ctx, b)
		}
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (e *End) writeSmall(ctx context.Context, b []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	room := e.sendSize - hdrSize
	off := 0
	for off < len(b) {
		if err := e.waitLocked(ctx, func() bool { return e.credits > 0 && len(e.freeSend) > 0 }); err != nil {
			return off, err
		}
		k := min(len(b)-off, room)
		if err := e.postMsgLocked(msgData, 0, func(p []byte) int { return copy(p, b[off:off+k]) }); err != nil {
			return off, err
		}
		e.credits--
		off += k
	}
	return off, nil
}

// writeAsked sends b, announced, by SEND: the receiver asked for it so
// (a CTS without an address). Device memory is staged through the host.
// Its count is at least 1: the receiver is inside the buffer already.
func (e *End) writeAsked(ctx context.Context, b []byte) (int, error) {
	if e.d.gpu.isDevice(b) {
		host := make([]byte, len(b))
		if err := e.d.gpu.m.CopyToHost(host, uintptr(unsafe.Pointer(&b[0]))); err != nil {
			err = fmt.Errorf("transport/rdma: send to rank %d: staging %d bytes of device memory: %w", e.peer, len(b), err)
			e.mu.Lock()
			e.failLocked(err)
			e.mu.Unlock()
			return 1, err
		}
		b = host
	}
	k, err := e.writeSmall(ctx, b)
	return max(k, 1), err
}

// writeLarge announces b, waits for the receiver's destination and writes
// b there; bySend: the receiver asked for b by SEND instead (a buffer it
// reads once: writeAsked).
func (e *End) writeLarge(ctx context.Context, b []byte) (_ int, bySend bool, _ error) {
	src, err := e.d.register(b, false, true)
	if err != nil {
		return 0, false, fmt.Errorf("transport/rdma: send to rank %d: %w", e.peer, err)
	}
	defer src.release()
	e.mu.Lock()
	defer e.mu.Unlock()
	token := e.nextToken
	e.nextToken++
	if err := e.waitLocked(ctx, func() bool { return e.credits > 0 && len(e.freeSend) > 0 }); err != nil {
		return 0, false, err
	}
	e.cts = nil
	if err := e.postMsgLocked(msgRTS, 0, func(p []byte) int {
		binary.LittleEndian.PutUint64(p[0:8], uint64(len(b)))
		binary.LittleEndian.PutUint32(p[8:12], token)
		return 12
	}); err != nil {
		return 0, false, err
	}
	e.credits--
	// From here a failure leaves the receiver inside the buffer: n > 0.
	if err := e.waitLocked(ctx, func() bool { return e.cts != nil && e.credits > 0 }); err != nil {
		return 1, false, err
	}
	c := *e.cts
	e.cts = nil
	if c.token != token || c.n != len(b) {
		return 1, false, e.protocolError("CTS for token %d of %d bytes, want token %d of %d", c.token, c.n, token, len(b))
	}
	if c.addr == 0 && c.rkey == 0 {
		return 0, true, nil
	}
	e.wrote = false
	if err := e.postLocked(wrWrite|uint64(token), hw.OpWriteImm, src.addr, len(b), src.lkey, c.addr, c.rkey, token); err != nil {
		return 1, false, err
	}
	e.credits--
	if err := e.waitLocked(ctx, func() bool { return e.wrote }); err != nil {
		if !e.wrote && e.err == nil {
			// Cancelled: stop the NIC reading b before the caller may reuse
			// it, and break the channel.
			e.failLocked(fmt.Errorf("transport/rdma: send to rank %d cancelled mid-buffer: %w", e.peer, err))
			for !e.wrote && !e.closed {
				e.cond.Wait()
			}
		}
		return 1, false, err
	}
	return len(b), false, nil
}

// Read fills p from the stream. Bytes that came by SEND are copied out of
// the receive buffers; a buffer announced for RDMA WRITE is written by the
// NIC straight into p when p holds all of it (the usual case: the caller
// reads a frame's payload into its destination), else into a temporary
// buffer that later Reads drain. For one goroutine at a time.
func (e *End) Read(p []byte) (int, error) { return e.read(p, false) }

// ReadOnce is Read into a buffer that is used once (a frame nobody placed,
// which the layer above then buffers), whose registration would not be
// reused: an announced payload p holds whole and that fits in the receive
// buffers (Slots x SlotSize) is asked for by SEND (a CTS without an
// address), a longer one registered for this read only. For one goroutine
// at a time, as Read.
func (e *End) ReadOnce(p []byte) (int, error) { return e.read(p, true) }

func (e *End) read(p []byte, once bool) (int, error) {
	if !e.recv {
		return 0, errors.New("transport/rdma: Read on a sending end")
	}
	if len(p) == 0 {
		return 0, nil
	}
	e.mu.Lock()
	for {
		if e.closed {
			// Before anything queued: teardown unmaps the receive
			// buffers (release) once Close has set closed, and a Read
			// that copied out of them then would fault.
			e.mu.Unlock()
			return 0, ErrClosed
		}
		if len(e.stash) > 0 {
			k, err := e.d.gpu.copyOut(p, e.stash)
			e.stash = e.stash[k:]
			e.mu.Unlock()
			return k, err
		}
		if len(e.inq) > 0 {
			it := &e.inq[0]
			switch it.kind {
			case itemData:
				k, err := e.d.gpu.copyOut(p, e.recvBuf(it.slot)[it.off:it.end])
				if it.off += k; it.off == it.end {
					slot := it.slot
					e.inq = e.inq[1:]
					e.toReturn++
					e.repostLocked(slot)
					e.returnCreditsLocked(false)
				}
				e.mu.Unlock()
				return k, err
			case itemRTS:
				if once && it.n <= len(p) && it.n <= e.nRecv*(e.recvSize-hdrSize) && !e.d.gpu.isDevice(p) {
					rts := *it
					e.inq = e.inq[1:]
					if err := e.askSendLocked(rts); err != nil {
						e.mu.Unlock()
						return 0, err
					}
					continue // the payload comes as data
				}
				return e.readLarge(p, once) // unlocks
			default:
				e.protocolError("a WRITE landed that was not announced")
			}
		}
		if e.err != nil {
			err := e.err
			e.mu.Unlock()
			return 0, err
		}
		e.returnCreditsLocked(true)
		e.readWaiting = true
		e.cond.Wait()
		e.readWaiting = false
	}
}

// readLarge answers the RTS at the head of the queue with the destination
// of its buffer and waits for the WRITE. Called with e.mu held; returns
// with it released.
func (e *End) readLarge(p []byte, once bool) (int, error) {
	rts := e.inq[0]
	e.inq = e.inq[1:]
	dst := p
	var tmp []byte
	if len(p) < rts.n {
		tmp = make([]byte, rts.n)
		dst = tmp
		e.staged++
	} else {
		dst = p[:rts.n]
		e.written++
	}
	e.mu.Unlock()
	if e.d.stage != nil {
		e.d.stage("rts")
	}
	r, err := e.d.register(dst, true, tmp == nil && !once)
	e.mu.Lock()
	if err != nil {
		err = fmt.Errorf("transport/rdma: receive from rank %d: %w", e.peer, err)
		e.failLocked(err)
		e.mu.Unlock()
		return 0, err
	}
	n, err := e.awaitWriteLocked(rts, r)
	e.mu.Unlock()
	if err == nil {
		err = r.finish()
	}
	r.release()
	if err != nil {
		return 0, err
	}
	if tmp == nil {
		return n, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	k, err := e.d.gpu.copyOut(p, tmp)
	e.stash = tmp[k:]
	return k, err
}

// postCTSLocked answers the RTS at rts with the destination addr and
// rkey, or with neither: send the bytes by SEND.
func (e *End) postCTSLocked(rts item, addr uint64, rkey uint32) error {
	if err := e.waitLocked(context.Background(), func() bool { return len(e.freeSend) > 0 }); err != nil {
		return err
	}
	credits := e.toReturn
	if err := e.postMsgLocked(msgCTS, credits, func(b []byte) int {
		binary.LittleEndian.PutUint64(b[0:8], addr)
		binary.LittleEndian.PutUint64(b[8:16], uint64(rts.n))
		binary.LittleEndian.PutUint32(b[16:20], rkey)
		binary.LittleEndian.PutUint32(b[20:24], rts.token)
		return 24
	}); err != nil {
		return err
	}
	e.toReturn -= credits
	return nil
}

// askSendLocked answers the RTS at rts with a CTS without an address: the
// sender sends the announced bytes by SEND, and they are read as data.
func (e *End) askSendLocked(rts item) error {
	if err := e.postCTSLocked(rts, 0, 0); err != nil {
		return err
	}
	e.asked++
	return nil
}

func (e *End) awaitWriteLocked(rts item, r *region) (int, error) {
	bg := context.Background()
	if err := e.postCTSLocked(rts, r.addr, r.rkey); err != nil {
		return 0, err
	}
	if e.d.stage != nil {
		e.mu.Unlock()
		e.d.stage("cts")
		e.mu.Lock()
	}
	e.readWaiting = true
	err := e.waitLocked(bg, func() bool { return len(e.inq) > 0 })
	e.readWaiting = false
	if err != nil {
		return 0, err
	}
	w := e.inq[0]
	if w.kind != itemWrote || w.token != rts.token || w.n != rts.n {
		return 0, e.protocolError("after the CTS for token %d (%d bytes) came item %d, token %d, %d bytes", rts.token, rts.n, w.kind, w.token, w.n)
	}
	e.inq = e.inq[1:]
	e.returnCreditsLocked(false)
	return rts.n, nil
}

// Close ends the channel: Read and Write return ErrClosed, and the end is
// torn down in the background once its sends in flight (a goodbye frame)
// were acknowledged or closeDrain passed; Device.Close waits for that.
// Idempotent.
func (e *End) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		e.cond.Broadcast()
		e.mu.Unlock()
		e.d.mu.Lock()
		delete(e.d.live, e)
		e.d.mu.Unlock()
		go e.teardown()
	})
	return nil
}

// Break moves the end's queue pair to the error state, as a NIC does on a
// fatal error: the peer's next message to it is dropped and fails there
// once its retries run out. For fault tests.
func (e *End) Break() error { return e.qp.ToError() }

func (e *End) teardown() {
	defer e.d.ends.Done()
	e.mu.Lock()
	// A sending end lets its last messages (a goodbye frame) be
	// acknowledged; a receiving end's own messages (credits) matter no
	// more, and its queue pair in error drops whatever still comes.
	if e.running && !e.recv {
		t := time.AfterFunc(closeDrain, e.wake)
		deadline := time.Now().Add(closeDrain)
		for e.outstanding > 0 && e.err == nil && time.Now().Before(deadline) {
			e.cond.Wait()
		}
		t.Stop()
	}
	running := e.running
	e.mu.Unlock()
	e.qp.ToError()
	if running {
		e.quit.Store(true)
		e.ch.Interrupt()
		<-e.stopped
	}
	e.release()
}
