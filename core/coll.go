package core

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport"
)

// link adapts a Comm to collective.Link for one call: steps are scoped by
// (communicator id, sequence number) and every message carries the call's
// signature.
type link struct {
	c   *Comm
	seq uint64
	sig signature
	// checked: the ring successor has (or is being sent) this call's
	// signature, by a data message or a ctlSigCheck.
	checked atomic.Bool
	cc      *collCall // owns the transport send contexts (sendCtx)
}

// ringCheck tells the ring successor what this rank called, unless it
// already knows: every rank checks its predecessor's call, so calls whose
// data paths never meet (different roots) still fail instead of hanging.
// It runs before anything that can block, and at the end of the call.
func (l *link) ringCheck() {
	c := l.c
	if c.size == 1 || l.checked.Swap(true) {
		return
	}
	var th transport.Header
	(&header{kind: kindControl, sub: ctlSigCheck, comm: c.id, seqOrTag: l.seq, sig: l.sig}).encode(&th)
	// On the data lane: on the fast path (shared memory) it costs a few
	// hundred ns, where the control lane is a QUIC stream.
	_ = c.n.ep.Send(l.sendCtx((c.rank+1)%c.size), c.world[(c.rank+1)%c.size], transport.LaneData, &th, nil)
}

func (l *link) successor() int { return (l.c.rank + 1) % l.c.size }

func (l *link) Rank() int { return l.c.rank }
func (l *link) Size() int { return l.c.size }

// Tuning is the communicator's (Config.Tuning, defaults filled in).
func (l *link) Tuning() *collective.Tuning { return &l.c.cfg.Tuning }

func (l *link) Send(ctx context.Context, peer int, step uint32, data []byte) error {
	return l.send(ctx, peer, step, data, nil)
}

// Exchange implements collective.Exchanger: it posts every receive first,
// so that the data lands in buf whoever reads it, then sends in this
// goroutine (while the send waits for room on a shared-memory ring it
// reads from's ring itself, so one goroutine moves both directions), then
// waits for the receives.
func (l *link) Exchange(ctx context.Context, to int, sbase uint32, data []byte, from int, rbase uint32, buf []byte, chunk int) error {
	c := l.c
	if to < 0 || to >= c.size || from < 0 || from >= c.size {
		return fmt.Errorf("collective exchange with ranks %d and %d of %d", to, from, c.size)
	}
	type posted struct {
		key collKey
		m   *inMsg
	}
	var ps []posted
	unpost := func() {
		for _, p := range ps {
			c.unpostColl(p.key, p.m)
		}
	}
	if to != l.successor() {
		l.ringCheck()
	}
	for i, off := uint32(0), 0; ; i++ {
		end := min(off+chunk, len(buf))
		key := collKey{src: from, seq: l.seq, step: rbase + i}
		m, err := c.postColl(key, buf[off:end])
		if err != nil {
			unpost()
			return err
		}
		if m != nil {
			ps = append(ps, posted{key, m})
		}
		if off = end; off >= len(buf) {
			break
		}
	}
	var progress func() bool
	stop := func() {}
	if len(ps) > 0 && l.sharedMemory(to) {
		if poll, end := c.n.ep.StartPolling(c.world[from]); poll != nil {
			progress, stop = poll, end
		}
	}
	for i, off := uint32(0), 0; ; i++ {
		end := min(off+chunk, len(data))
		if err := l.send(ctx, to, sbase+i, data[off:end], progress); err != nil {
			stop()
			unpost()
			return err
		}
		if off = end; off >= len(data) {
			break
		}
	}
	stop() // waitColl polls for a while, then must let the ring's reader work
	for i, p := range ps {
		if err := c.waitColl(ctx, p.key, p.m); err != nil {
			ps = ps[i+1:]
			unpost()
			return err
		}
	}
	return nil
}

// sharedMemory reports whether this rank's data to comm rank peer goes
// over a shared-memory ring (where a send can progress a receive).
func (l *link) sharedMemory(peer int) bool {
	caps := l.c.n.caps
	return caps.Poll && caps.ProgressSend && l.c.n.ep.SharedMemory(l.c.world[peer])
}

func (l *link) send(ctx context.Context, peer int, step uint32, data []byte, progress func() bool) error {
	if peer < 0 || peer >= l.c.size {
		return fmt.Errorf("collective sent to rank %d of %d", peer, l.c.size)
	}
	op := l.sig.kind.String()
	if skip, err := l.c.collSendSkip(peer, l.seq, op); skip || err != nil {
		return err
	}
	if peer != l.successor() || l.checked.Swap(true) {
		l.ringCheck()
	} // else this message, which carries the signature, is the check
	if err := ctx.Err(); err != nil {
		return err // the algorithm gave up: start nothing new
	}
	h := header{kind: kindColl, seqOrTag: l.seq, step: step, sig: l.sig, comm: l.c.id, total: uint64(len(data))}
	var err error
	if progress != nil {
		// One chunk (<= transport.MaxPayload), sent by the caller while
		// it progresses the receive of an exchange.
		var th transport.Header
		h.encode(&th)
		err = l.c.n.ep.SendProgress(l.sendCtx(peer), l.c.world[peer], &th, data, progress)
	} else {
		err = l.c.sendChunked(l.sendCtx(peer), peer, h, data)
	}
	if err != nil && isDeparture(err) {
		if skip, _ := l.c.collSendSkip(peer, l.seq, op); skip {
			return nil
		}
	}
	return err
}

func (l *link) Recv(ctx context.Context, peer int, step uint32, buf []byte) error {
	if peer < 0 || peer >= l.c.size {
		return fmt.Errorf("collective received from rank %d of %d", peer, l.c.size)
	}
	l.ringCheck()
	return l.c.recvColl(ctx, peer, l.seq, step, buf)
}

// startColl assigns the next sequence number now, in the caller's
// goroutine, and returns a request that runs body when started: in the
// caller's goroutine by wait (blocking calls), or in a goroutine of its own
// by start (non-blocking calls).
func (c *Comm) startColl(ctx context.Context, sig signature, body func(ctx context.Context, l *link) error) *Request {
	op := sig.kind.String()
	sig.tuning = c.tuningDigest
	cc := &collCall{body: body, ctx: ctx}
	req := &cc.req
	req.init(c, op, true)
	c.mu.Lock()
	if c.err != nil {
		err := withOp(c.err, op)
		c.mu.Unlock()
		req.finish(Status{}, err)
		return req
	}
	seq := c.nextSeq
	c.nextSeq++
	if err := c.collDepartedLocked(op, seq); err != nil {
		delete(c.remoteSig, seq)
		c.mu.Unlock()
		req.finish(Status{}, err)
		return req
	}
	c.unfinished[seq] = true
	if c.size > 1 {
		rs, seen := c.remoteSig[seq]
		delete(c.remoteSig, seq)
		c.mySig[seq] = sig
		if seen && !rs.sig.matches(sig) {
			c.mismatchLocked(sig, rs.from, rs.sig)
		}
	}
	c.ops.Add(1)
	c.mu.Unlock()
	cc.l = link{c: c, seq: seq, sig: sig, cc: cc}
	req.coll = cc
	return req
}

// collCall is one collective call: its request, link and contexts in one
// allocation (a small collective costs about a microsecond, and each
// allocation a few percent of it).
type collCall struct {
	req  Request
	l    link
	op   opCtx
	ctx  context.Context
	body func(ctx context.Context, l *link) error

	claimed atomic.Bool // run begun, by start's goroutine or by Wait (runOnce)

	smu   sync.Mutex     // guards the send contexts
	sends [2]deadlineCtx // the first destinations' (most calls have one or two)
	nsend int            // sends in use
	more  []*deadlineCtx // further destinations'
}

// sendCtx returns the context that bounds transport sends to comm rank
// peer in this call: the call's deadline, and the detector declaring peer
// down. Not the call's own context: an algorithm cancels its sends when a
// receive fails, and a frame cut short would break the connection to a peer
// that may be healthy (e.g. when another member left); the peer drains what
// it gets. A dead peer drains nothing, so its sends end when it is declared
// down, not at the transport's own timeout. Safe for concurrent use.
func (l *link) sendCtx(peer int) context.Context {
	cc, w := l.cc, l.c.world[peer]
	cc.smu.Lock()
	defer cc.smu.Unlock()
	for i := range cc.nsend {
		if cc.sends[i].peer == w {
			return &cc.sends[i]
		}
	}
	for _, s := range cc.more {
		if s.peer == w {
			return s
		}
	}
	var s *deadlineCtx
	if cc.nsend < len(cc.sends) {
		s = &cc.sends[cc.nsend]
		cc.nsend++
	} else {
		s = new(deadlineCtx)
		cc.more = append(cc.more, s)
	}
	s.d, s.peer, s.down = cc.op.d, w, &l.c.n.downSig[w]
	return s
}

// releaseSends releases the send contexts once the call's sends are over.
func (cc *collCall) releaseSends() {
	cc.smu.Lock()
	defer cc.smu.Unlock()
	for i := range cc.nsend {
		cc.sends[i].release()
	}
	for _, s := range cc.more {
		s.release()
	}
}

// runOnce runs the call unless another goroutine has begun it; it reports
// whether it ran it.
func (cc *collCall) runOnce() bool {
	if !cc.claimed.CompareAndSwap(false, true) {
		return false
	}
	cc.run()
	return true
}

// run performs the call (once: see Request.run) and finishes its request.
func (cc *collCall) run() {
	req, l := &cc.req, &cc.l
	c, op, seq := l.c, req.op, l.seq
	defer c.ops.Done()
	cc.op.init(c, cc.ctx)
	defer cc.op.release()
	ctx := context.Context(&cc.op)
	defer cc.releaseSends() // transport sends have their own (link.sendCtx)
	err := cc.body(ctx, l)
	if err == nil {
		l.ringCheck() // a call that only sent, never to its successor
	}
	if err != nil {
		err = c.opError(op, ctx, err)
	}
	c.mu.Lock()
	delete(c.mySig, seq)
	if err == nil {
		delete(c.unfinished, seq)
	} else if e, ok := err.(*Error); ok && CodeOf(err) != CodeClosed && !isDeparture(err) {
		// A member's departure fails the collectives it did not
		// complete on every rank alike: not a failure of c.
		c.failAndTellLocked(e)
	}
	c.mu.Unlock()
	req.finish(Status{}, err)
}

// exchangeSignatures is the body of collectives that move no bytes: an
// allgather of signatures, so every rank sees every call before finishing.
func exchangeSignatures(ctx context.Context, l *link) error {
	c := l.c
	if c.size == 1 {
		return nil
	}
	send := make([]byte, sigBytes)
	l.sig.put(send)
	recv := make([]byte, sigBytes*c.size)
	if err := collective.Allgather(ctx, l, send, recv); err != nil {
		return err
	}
	for r := 0; r < c.size; r++ {
		if s := getSignature(recv[r*sigBytes:]); !s.matches(l.sig) {
			c.mu.Lock()
			c.mismatchLocked(l.sig, r, s)
			c.mu.Unlock()
			return c.Err()
		}
	}
	return nil
}

// elems checks that a buffer holds whole elements and returns the count.
func elems(op, name string, b []byte, dt collective.DType) (int, error) {
	if !dt.Valid() {
		return 0, invalidArg(op, "invalid datatype %d", uint8(dt))
	}
	if len(b)%dt.Size() != 0 {
		return 0, invalidArg(op, "%s: length %d bytes is not a multiple of the %s size %d", name, len(b), dt, dt.Size())
	}
	return len(b) / dt.Size(), nil
}

func (c *Comm) checkRoot(op string, root int) error {
	if root < 0 || root >= c.size {
		return invalidArg(op, "root %d is out of range [0, %d)", root, c.size)
	}
	return nil
}

func checkOp(op string, dt collective.DType, o collective.Op) error {
	if err := collective.Check(dt, o); err != nil {
		return &Error{Code: CodeInvalidArgument, Op: op, Rank: -1, Msg: err.Error(), Cause: err}
	}
	return nil
}

// bytesV converts element counts and displacements to bytes, checking that
// every block lies within a buffer of n elements.
func (c *Comm) bytesV(op, what string, counts, displs []int, n int, dt collective.DType) ([]int, []int, int, error) {
	if len(counts) != c.size || len(displs) != c.size {
		return nil, nil, 0, invalidArg(op, "%scounts and %sdispls need %d entries, got %d and %d", what, what, c.size, len(counts), len(displs))
	}
	es := dt.Size()
	bc, bd := make([]int, c.size), make([]int, c.size)
	total := 0
	for i := range counts {
		if counts[i] < 0 || displs[i] < 0 || counts[i] > n || displs[i] > n-counts[i] {
			return nil, nil, 0, invalidArg(op, "%scounts[%d]=%d, %sdispls[%d]=%d do not fit the %d-element buffer", what, i, counts[i], what, i, displs[i], n)
		}
		bc[i], bd[i] = counts[i]*es, displs[i]*es
		total += counts[i]
	}
	return bc, bd, total, nil
}

func (c *Comm) invalid(op string, err error) *Request { return doneRequest(c, op, err) }

// run starts a collective whose count may be zero, in which case only the
// signatures are exchanged.
func (c *Comm) run(ctx context.Context, sig signature, body func(ctx context.Context, l *link) error) *Request {
	if sig.count == 0 {
		return c.startColl(ctx, sig, exchangeSignatures)
	}
	return c.startColl(ctx, sig, body)
}

// runAgreed is run for collectives in which a rank's result need not depend
// on every other rank (rooted ones, scans): their body is followed by
// agreeSignatures. Zero-count calls exchange every signature already.
func (c *Comm) runAgreed(ctx context.Context, sig signature, body func(ctx context.Context, l *link) error) *Request {
	return c.run(ctx, sig, agreed(body))
}

// agreed runs body, then agreeSignatures.
func agreed(body func(ctx context.Context, l *link) error) func(ctx context.Context, l *link) error {
	return func(ctx context.Context, l *link) error {
		if err := body(ctx, l); err != nil {
			return err
		}
		return agreeSignatures(ctx, l)
	}
}

// agreeStepBase numbers agreeSignatures' messages, far above any step a
// schedule takes (their counters start at 0 for every call).
const agreeStepBase = 1 << 31

// agreeSignatures ends a collective whose data flow need not reach every
// rank from every other: a root that only sends, a leaf of a broadcast,
// rank 0 of a scan. Such a rank could return success while ranks whose part
// of the schedule never met it fail as mismatched (different roots or
// counts). This is a dissemination round of empty messages, ceil(log2 n)
// steps; each message carries the sender's signature in its header, which
// the receiver checks on arrival, and a rank sends in step k only after its
// step k-1 message matched. Every rank hears, through such checked hops,
// from every other, so none completes while any made a different call:
// all fail as mismatched (DESIGN §2.2), each naming both calls.
func agreeSignatures(ctx context.Context, l *link) error {
	n, r := l.c.size, l.c.rank
	for k, step := 1, uint32(agreeStepBase); k < n; k, step = k<<1, step+1 {
		if err := l.Exchange(ctx, (r+k)%n, step, nil, (r-k+n)%n, step, nil, 1); err != nil {
			return err
		}
	}
	return nil
}

// Allreduce combines send from every rank with op into recv on every rank.
// send == nil: in place (the input is in recv).
func (c *Comm) Allreduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.iallreduce(ctx, send, recv, dt, op).wait()
}

// IAllreduce is the non-blocking Allreduce.
func (c *Comm) IAllreduce(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.iallreduce(context.Background(), send, recv, dt, op).start()
}

func (c *Comm) iallreduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) *Request {
	const name = "allreduce"
	n, err := c.sameShape(name, send, recv, dt, op)
	if err != nil {
		return c.invalid(name, err)
	}
	return c.run(ctx, signature{collAllreduce, dt, op, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Allreduce(ctx, l, send, recv, dt, op)
	})
}

func (c *Comm) sameShape(name string, send, recv []byte, dt collective.DType, op collective.Op) (int, error) {
	if err := checkOp(name, dt, op); err != nil {
		return 0, err
	}
	n, err := elems(name, "recv", recv, dt)
	if err != nil {
		return 0, err
	}
	if send != nil && len(send) != len(recv) {
		return 0, invalidArg(name, "send has %d bytes but recv has %d", len(send), len(recv))
	}
	return n, nil
}

// Broadcast copies buf from root to every rank.
func (c *Comm) Broadcast(ctx context.Context, buf []byte, dt collective.DType, root int) error {
	return c.ibroadcast(ctx, buf, dt, root).wait()
}

// IBroadcast is the non-blocking Broadcast.
func (c *Comm) IBroadcast(buf []byte, dt collective.DType, root int) *Request {
	return c.ibroadcast(context.Background(), buf, dt, root).start()
}

func (c *Comm) ibroadcast(ctx context.Context, buf []byte, dt collective.DType, root int) *Request {
	const name = "broadcast"
	n, err := elems(name, "buf", buf, dt)
	if err == nil {
		err = c.checkRoot(name, root)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.runAgreed(ctx, signature{collBroadcast, dt, 0, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Broadcast(ctx, l, buf, root)
	})
}

// Reduce combines send from every rank into recv on root. On root, send ==
// nil means in place; elsewhere recv is not used and may be nil.
func (c *Comm) Reduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op, root int) error {
	return c.ireduce(ctx, send, recv, dt, op, root).wait()
}

// IReduce is the non-blocking Reduce.
func (c *Comm) IReduce(send, recv []byte, dt collective.DType, op collective.Op, root int) *Request {
	return c.ireduce(context.Background(), send, recv, dt, op, root).start()
}

func (c *Comm) ireduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op, root int) *Request {
	const name = "reduce"
	err := checkOp(name, dt, op)
	if err == nil {
		err = c.checkRoot(name, root)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	var n int
	if c.rank == root {
		n, err = c.sameShape(name, send, recv, dt, op)
	} else {
		if send == nil {
			err = invalidArg(name, "send is nil on non-root rank %d (in place is for the root only)", c.rank)
		} else {
			n, err = elems(name, "send", send, dt)
		}
		recv = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.runAgreed(ctx, signature{collReduce, dt, op, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Reduce(ctx, l, send, recv, dt, op, root)
	})
}

// Allgather concatenates every rank's send into recv (rank order);
// len(recv) == Size()*len(send). send == nil: this rank's block is already
// in place in recv.
func (c *Comm) Allgather(ctx context.Context, send, recv []byte, dt collective.DType) error {
	return c.iallgather(ctx, send, recv, dt).wait()
}

// IAllgather is the non-blocking Allgather.
func (c *Comm) IAllgather(send, recv []byte, dt collective.DType) *Request {
	return c.iallgather(context.Background(), send, recv, dt).start()
}

func (c *Comm) iallgather(ctx context.Context, send, recv []byte, dt collective.DType) *Request {
	const name = "allgather"
	n, err := c.blocks(name, send, recv, dt)
	if err != nil {
		return c.invalid(name, err)
	}
	return c.run(ctx, signature{collAllgather, dt, 0, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Allgather(ctx, l, send, recv)
	})
}

// blocks checks small == nil or len(big) == Size()*len(small) and returns
// the elements per block.
func (c *Comm) blocks(name string, small, big []byte, dt collective.DType) (int, error) {
	n, err := elems(name, "recv", big, dt)
	if err != nil {
		return 0, err
	}
	if n%c.size != 0 {
		return 0, invalidArg(name, "%d elements do not split into %d equal blocks", n, c.size)
	}
	if small != nil && len(small)*c.size != len(big) {
		return 0, invalidArg(name, "block of %d bytes times %d ranks != %d bytes", len(small), c.size, len(big))
	}
	return n / c.size, nil
}

// Allgatherv gathers counts[r] elements from rank r into recv at displs[r]
// (elements) on every rank. send == nil: this rank's block is in place.
func (c *Comm) Allgatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType) error {
	return c.iallgatherv(ctx, send, recv, counts, displs, dt).wait()
}

// IAllgatherv is the non-blocking Allgatherv.
func (c *Comm) IAllgatherv(send, recv []byte, counts, displs []int, dt collective.DType) *Request {
	return c.iallgatherv(context.Background(), send, recv, counts, displs, dt).start()
}

// iallgatherv is IAllgatherv bounded by ctx.
func (c *Comm) iallgatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType) *Request {
	const name = "allgatherv"
	n, err := elems(name, "recv", recv, dt)
	var bc, bd []int
	var total int
	if err == nil {
		bc, bd, total, err = c.bytesV(name, "", counts, displs, n, dt)
	}
	if err == nil && send != nil && len(send) != bc[c.rank] {
		err = invalidArg(name, "send has %d bytes but counts[%d] is %d elements", len(send), c.rank, counts[c.rank])
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collAllgatherv, dt, 0, -1, uint64(total), 0}, func(ctx context.Context, l *link) error {
		if total == 0 {
			return exchangeSignatures(ctx, l)
		}
		return collective.Allgatherv(ctx, l, send, recv, bc, bd)
	})
}

// ReduceScatter combines send (Size() blocks) from every rank with op and
// leaves block r in rank r's recv. send == nil: recv holds the Size()
// blocks of input and the result is left in block Rank() of recv.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.ireduceScatter(ctx, send, recv, dt, op).wait()
}

// IReduceScatter is the non-blocking ReduceScatter.
func (c *Comm) IReduceScatter(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.ireduceScatter(context.Background(), send, recv, dt, op).start()
}

func (c *Comm) ireduceScatter(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) *Request {
	const name = "reduce_scatter"
	if err := checkOp(name, dt, op); err != nil {
		return c.invalid(name, err)
	}
	var n int
	var err error
	if send == nil {
		n, err = c.blocks(name, nil, recv, dt)
	} else {
		n, err = c.blocks(name, recv, send, dt)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.run(ctx, signature{collReduceScatter, dt, op, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		if send == nil {
			return collective.ReduceScatterInPlace(ctx, l, recv, dt, op)
		}
		return collective.ReduceScatter(ctx, l, send, recv, dt, op)
	})
}

// Alltoall sends block j of send to rank j, which stores it as block
// Rank() of recv. send == nil: in place in recv.
func (c *Comm) Alltoall(ctx context.Context, send, recv []byte, dt collective.DType) error {
	return c.ialltoall(ctx, send, recv, dt).wait()
}

// IAlltoall is the non-blocking Alltoall.
func (c *Comm) IAlltoall(send, recv []byte, dt collective.DType) *Request {
	return c.ialltoall(context.Background(), send, recv, dt).start()
}

func (c *Comm) ialltoall(ctx context.Context, send, recv []byte, dt collective.DType) *Request {
	const name = "alltoall"
	n, err := c.blocks(name, nil, recv, dt)
	if err == nil && send != nil && len(send) != len(recv) {
		err = invalidArg(name, "send has %d bytes but recv has %d", len(send), len(recv))
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.run(ctx, signature{collAlltoall, dt, 0, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Alltoall(ctx, l, send, recv)
	})
}

// Alltoallv sends scounts[j] elements at sdispls[j] to rank j, which
// receives them at rdispls[Rank()] (elements). In place is not supported.
func (c *Comm) Alltoallv(ctx context.Context, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, dt collective.DType) error {
	return c.ialltoallv(ctx, send, scounts, sdispls, recv, rcounts, rdispls, dt).wait()
}

// IAlltoallv is the non-blocking Alltoallv.
func (c *Comm) IAlltoallv(send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, dt collective.DType) *Request {
	return c.ialltoallv(context.Background(), send, scounts, sdispls, recv, rcounts, rdispls, dt).start()
}

// ialltoallv is IAlltoallv bounded by ctx.
func (c *Comm) ialltoallv(ctx context.Context, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, dt collective.DType) *Request {
	const name = "alltoallv"
	if send == nil {
		return c.invalid(name, invalidArg(name, "send is nil: in place is not supported for alltoallv"))
	}
	sn, err := elems(name, "send", send, dt)
	var rn int
	if err == nil {
		rn, err = elems(name, "recv", recv, dt)
	}
	var sc, sd, rc, rd []int
	if err == nil {
		sc, sd, _, err = c.bytesV(name, "s", scounts, sdispls, sn, dt)
	}
	if err == nil {
		rc, rd, _, err = c.bytesV(name, "r", rcounts, rdispls, rn, dt)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collAlltoallv, dt, 0, -1, noCount, 0}, func(ctx context.Context, l *link) error {
		return collective.Alltoallv(ctx, l, send, sc, sd, recv, rc, rd)
	})
}

// Gather collects every rank's send into recv on root (rank order). On
// root send == nil means its block is in place; elsewhere recv may be nil.
func (c *Comm) Gather(ctx context.Context, send, recv []byte, dt collective.DType, root int) error {
	return c.igather(ctx, send, recv, dt, root).wait()
}

// IGather is the non-blocking Gather.
func (c *Comm) IGather(send, recv []byte, dt collective.DType, root int) *Request {
	return c.igather(context.Background(), send, recv, dt, root).start()
}

func (c *Comm) igather(ctx context.Context, send, recv []byte, dt collective.DType, root int) *Request {
	const name = "gather"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var n int
	var err error
	if c.rank == root {
		n, err = c.blocks(name, send, recv, dt)
	} else if send == nil {
		err = invalidArg(name, "send is nil on non-root rank %d", c.rank)
	} else {
		n, err = elems(name, "send", send, dt)
		recv = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.runAgreed(ctx, signature{collGather, dt, 0, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Gather(ctx, l, send, recv, root)
	})
}

// Gatherv collects counts[r] elements from rank r into recv at displs[r]
// on root; counts and displs are used on root only.
func (c *Comm) Gatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType, root int) error {
	return c.igatherv(ctx, send, recv, counts, displs, dt, root).wait()
}

// IGatherv is the non-blocking Gatherv.
func (c *Comm) IGatherv(send, recv []byte, counts, displs []int, dt collective.DType, root int) *Request {
	return c.igatherv(context.Background(), send, recv, counts, displs, dt, root).start()
}

// igatherv is IGatherv bounded by ctx.
func (c *Comm) igatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType, root int) *Request {
	const name = "gatherv"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var bc, bd []int
	var err error
	if c.rank == root {
		var n int
		n, err = elems(name, "recv", recv, dt)
		if err == nil {
			bc, bd, _, err = c.bytesV(name, "", counts, displs, n, dt)
		}
		if err == nil && send != nil && len(send) != bc[c.rank] {
			err = invalidArg(name, "send has %d bytes but counts[%d] is %d elements", len(send), c.rank, counts[c.rank])
		}
	} else if send == nil {
		err = invalidArg(name, "send is nil on non-root rank %d", c.rank)
	} else {
		_, err = elems(name, "send", send, dt)
		recv = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collGatherv, dt, 0, root, noCount, 0}, agreed(func(ctx context.Context, l *link) error {
		return collective.Gatherv(ctx, l, send, recv, bc, bd, root)
	}))
}

// Scatter sends block r of send on root to rank r's recv. On root recv ==
// nil means in place (root's block stays in send); elsewhere send may be nil.
func (c *Comm) Scatter(ctx context.Context, send, recv []byte, dt collective.DType, root int) error {
	return c.iscatter(ctx, send, recv, dt, root).wait()
}

// IScatter is the non-blocking Scatter.
func (c *Comm) IScatter(send, recv []byte, dt collective.DType, root int) *Request {
	return c.iscatter(context.Background(), send, recv, dt, root).start()
}

func (c *Comm) iscatter(ctx context.Context, send, recv []byte, dt collective.DType, root int) *Request {
	const name = "scatter"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var n int
	var err error
	if c.rank == root {
		n, err = c.blocks(name, recv, send, dt)
	} else if recv == nil {
		err = invalidArg(name, "recv is nil on non-root rank %d", c.rank)
	} else {
		n, err = elems(name, "recv", recv, dt)
		send = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.runAgreed(ctx, signature{collScatter, dt, 0, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Scatter(ctx, l, send, recv, root)
	})
}

// Scatterv sends counts[r] elements at displs[r] of send on root to rank r;
// counts and displs are used on root only.
func (c *Comm) Scatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, dt collective.DType, root int) error {
	return c.iscatterv(ctx, send, counts, displs, recv, dt, root).wait()
}

// IScatterv is the non-blocking Scatterv.
func (c *Comm) IScatterv(send []byte, counts, displs []int, recv []byte, dt collective.DType, root int) *Request {
	return c.iscatterv(context.Background(), send, counts, displs, recv, dt, root).start()
}

// iscatterv is IScatterv bounded by ctx.
func (c *Comm) iscatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, dt collective.DType, root int) *Request {
	const name = "scatterv"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var bc, bd []int
	var err error
	if c.rank == root {
		var n int
		n, err = elems(name, "send", send, dt)
		if err == nil {
			bc, bd, _, err = c.bytesV(name, "", counts, displs, n, dt)
		}
		if err == nil && recv != nil && len(recv) != bc[c.rank] {
			err = invalidArg(name, "recv has %d bytes but counts[%d] is %d elements", len(recv), c.rank, counts[c.rank])
		}
	} else if recv == nil {
		err = invalidArg(name, "recv is nil on non-root rank %d", c.rank)
	} else {
		_, err = elems(name, "recv", recv, dt)
		send = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collScatterv, dt, 0, root, noCount, 0}, agreed(func(ctx context.Context, l *link) error {
		return collective.Scatterv(ctx, l, send, bc, bd, recv, root)
	}))
}

// Scan leaves in rank r's recv the combination of send over ranks 0..r.
// send == nil: in place.
func (c *Comm) Scan(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.iscan(ctx, collScan, send, recv, dt, op).wait()
}

// IScan is the non-blocking Scan.
func (c *Comm) IScan(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.iscan(context.Background(), collScan, send, recv, dt, op).start()
}

// Exscan leaves in rank r's recv the combination over ranks 0..r-1; rank
// 0's recv is left unchanged. send == nil: in place.
func (c *Comm) Exscan(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.iscan(ctx, collExscan, send, recv, dt, op).wait()
}

// IExscan is the non-blocking Exscan.
func (c *Comm) IExscan(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.iscan(context.Background(), collExscan, send, recv, dt, op).start()
}

func (c *Comm) iscan(ctx context.Context, kind collKind, send, recv []byte, dt collective.DType, op collective.Op) *Request {
	name := kind.String()
	n, err := c.sameShape(name, send, recv, dt, op)
	if err != nil {
		return c.invalid(name, err)
	}
	return c.runAgreed(ctx, signature{kind, dt, op, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		if kind == collExscan {
			return collective.Exscan(ctx, l, send, recv, dt, op)
		}
		return collective.Scan(ctx, l, send, recv, dt, op)
	})
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error { return c.ibarrier(ctx).wait() }

// IBarrier is the non-blocking Barrier.
func (c *Comm) IBarrier() *Request { return c.ibarrier(context.Background()).start() }

func (c *Comm) ibarrier(ctx context.Context) *Request {
	return c.startColl(ctx, signature{kind: collBarrier, root: -1, count: 0}, exchangeSignatures)
}

// Split partitions c: ranks that pass the same color form a new
// communicator, ordered by (key, rank in c). It is collective over c. A
// negative color means "not a member": Split returns (nil, nil). The child
// shares c's transport; close it separately.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	var child *Comm
	req := c.startColl(ctx, signature{kind: collSplit, root: -1, count: noCount}, func(ctx context.Context, l *link) error {
		const rec = 24
		send := make([]byte, rec)
		binary.LittleEndian.PutUint64(send[0:], uint64(int64(color)))
		binary.LittleEndian.PutUint64(send[8:], uint64(int64(key)))
		binary.LittleEndian.PutUint64(send[16:], uint64(c.rank))
		all := make([]byte, rec*c.size)
		if err := collective.Allgather(ctx, l, send, all); err != nil {
			return err
		}
		if color < 0 {
			return nil
		}
		type member struct{ key, rank int }
		var ms []member
		for r := 0; r < c.size; r++ {
			b := all[r*rec:]
			if int(int64(binary.LittleEndian.Uint64(b))) == color {
				ms = append(ms, member{int(int64(binary.LittleEndian.Uint64(b[8:]))), r})
			}
		}
		sort.SliceStable(ms, func(i, j int) bool {
			if ms[i].key != ms[j].key {
				return ms[i].key < ms[j].key
			}
			return ms[i].rank < ms[j].rank
		})
		world := make([]int, len(ms))
		me := -1
		for i, m := range ms {
			world[i] = c.world[m.rank]
			if m.rank == c.rank {
				me = i
			}
		}
		ch := newComm(c.n, childID(c.id, l.seq, color), me, world)
		if err := c.n.register(ch); err != nil {
			return err
		}
		child = ch
		return nil
	})
	if err := req.wait(); err != nil {
		return nil, err
	}
	return child, nil
}

// childID derives a split child's id from its parent's id, the split's
// sequence number on the parent and the color; never worldID.
func childID(parent, seq uint64, color int) uint64 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], parent)
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(int64(color)))
	sum := sha256.Sum256(b[:])
	id := binary.LittleEndian.Uint64(sum[:8])
	if id == worldID {
		id = 1
	}
	return id
}
