package hier

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
)

// This file is the four collectives. Each is at most three phases on the
// caller's stream: NCCL within the host (first), nexar between hosts on
// staged pinned copies of the device pieces (cross: the host waits for the
// stream to reach it, as hw/cuda/stage does), NCCL within the host again
// (last). Buffers are device memory of Options.Device; the caller checks
// that (capi does), NCCL relies on it.
//
// With blocking, the call returns once its work is complete; otherwise the
// work after the crossing is left on stream (the host part is done when the
// call returns, as for the staged path).

// Call kinds, as the ranks of a host compare them.
const (
	kAllreduce byte = iota + 1
	kBroadcast
	kAllgather
	kReduceScatter
)

var kindNames = [...]string{"", "allreduce", "broadcast", "allgather", "reduce_scatter"}

// callSig is what the ranks of a host compare before NCCL gets a call.
type callSig struct {
	kind  byte
	dt    collective.DType
	op    collective.Op
	root  int32
	count uint64
}

const sigBytes = 16

func (s callSig) put(b []byte) {
	b[0], b[1], b[2] = s.kind, byte(s.dt), byte(s.op)
	binary.LittleEndian.PutUint32(b[4:], uint32(s.root))
	binary.LittleEndian.PutUint64(b[8:], s.count)
}

func getSig(b []byte) callSig {
	return callSig{kind: b[0], dt: collective.DType(b[1]), op: collective.Op(b[2]),
		root: int32(binary.LittleEndian.Uint32(b[4:])), count: binary.LittleEndian.Uint64(b[8:])}
}

func (s callSig) String() string {
	name := "call(?)"
	if int(s.kind) < len(kindNames) {
		name = kindNames[s.kind]
	}
	switch s.kind {
	case kAllreduce, kReduceScatter:
		return fmt.Sprintf("%s(%v, %v, count %d)", name, s.dt, s.op, s.count)
	case kBroadcast:
		return fmt.Sprintf("%s(%v, root %d, count %d)", name, s.dt, s.root, s.count)
	}
	return fmt.Sprintf("%s(%v, count %d)", name, s.dt, s.count)
}

// agree compares the call with those of the host's other ranks: NCCL given
// different calls would wait for ever.
func (h *Comm) agree(ctx context.Context, s callSig) error {
	ranks := h.lay.Hosts[h.host]
	if len(ranks) == 1 {
		return nil
	}
	mine := make([]byte, sigBytes)
	s.put(mine)
	all := make([]byte, sigBytes*len(ranks))
	if err := h.local.Allgather(ctx, mine, all, collective.Uint8); err != nil {
		return err
	}
	for i, r := range ranks {
		if t := getSig(all[i*sigBytes:]); t != s {
			return &core.Error{Code: core.CodeMismatch, Op: kindNames[s.kind], Rank: r,
				Msg:   fmt.Sprintf("rank %d called %v but rank %d, on the same host, called %v (NCCL was not given the call)", h.rank, s, r, t),
				Cause: errDiffer}
		}
	}
	return nil
}

// Supports reports whether NCCL can run a call on dt (with op, when the
// call reduces). NCCL has no bitwise reductions; such calls are for the
// staged path. The answer depends on the arguments alone, so every rank of
// a matched call makes the same choice.
func Supports(dt collective.DType, op collective.Op, reduces bool) bool {
	if _, err := nccl.DType(dt); err != nil {
		return false
	}
	if reduces {
		if _, err := nccl.Op(op); err != nil {
			return false
		}
	}
	return true
}

func invalid(op, format string, v ...any) error {
	return &core.Error{Code: core.CodeInvalidArgument, Op: op, Rank: -1, Msg: fmt.Sprintf(format, v...)}
}

// checkArgs refuses what NCCL cannot take, before anything is sent.
func checkArgs(op string, dt collective.DType, o collective.Op, reduces bool, count int) error {
	if count < 0 {
		return invalid(op, "count %d is negative", count)
	}
	if reduces {
		if err := collective.Check(dt, o); err != nil {
			return invalid(op, "%v", err)
		}
	}
	if !Supports(dt, o, reduces) {
		return invalid(op, "NCCL cannot take %v with %v: use the staged path", dt, o)
	}
	return nil
}

// start begins the call s (reduces: it reduces with s.op) after checking
// its arguments: one call at a time, compared with the host's other ranks.
// It returns the function that ends the call, or nil with the call's
// error, or nil and nil when the call has nothing more to do (count 0).
func (h *Comm) start(ctx context.Context, s callSig, reduces bool) (end func(), err error) {
	name := kindNames[s.kind]
	if err := checkArgs(name, s.dt, s.op, reduces, int(s.count)); err != nil {
		return nil, err
	}
	if err := h.begin(name); err != nil {
		return nil, err
	}
	if err := h.agree(ctx, s); err != nil {
		err = h.failCall(name, err)
		h.end()
		return nil, err
	}
	if s.count == 0 {
		h.end()
		return nil, nil
	}
	return h.end, nil
}

// plan is a call's phases.
type plan struct {
	op       string
	stream   cuda.Stream
	blocking bool
	first    func(c *nccl.Comm) error // NCCL work before the crossing
	direct   func() error             // the pieces that cross by GPUDirect RDMA, after first
	bufs     []stage.Buf              // the device pieces that cross, staged
	cross    func(host [][]byte) error
	last     func(c *nccl.Comm) error // NCCL work after it
}

// run runs p's phases. Any failure fails the Comm (and so every rank's
// call) and is reported as the parent's error.
func (h *Comm) run(p plan) error {
	var call *stage.Call
	var host [][]byte
	if p.cross != nil {
		call = h.st.Begin()
		for _, b := range p.bufs {
			hb, err := call.Add(b, h.dev)
			if err != nil {
				call.Release()
				return h.failCall(p.op, err)
			}
			host = append(host, hb)
		}
	}
	if p.first != nil {
		err := h.enqueue(p.first)
		if err == nil {
			_, err = h.track(p.op, p.stream)
		}
		if err != nil {
			if call != nil {
				call.Release()
			}
			return h.failCall(p.op, err)
		}
	}
	if p.direct != nil {
		// The NIC reads what the first phase wrote: the host waits for the
		// stream to pass it, as staging's copies would.
		err := h.st.WaitStream(p.stream)
		if err == nil {
			err = p.direct()
		}
		if err != nil {
			if call != nil {
				call.Release()
			}
			return h.failCall(p.op, err)
		}
	}
	if call != nil {
		err := call.Run(p.stream, false, func() error {
			if h.dead.Load() {
				return errAborted
			}
			return p.cross(host)
		})
		if err != nil {
			return h.failCall(p.op, err)
		}
	}
	if p.last != nil {
		if err := h.enqueue(p.last); err != nil {
			return h.failCall(p.op, err)
		}
	}
	ev, err := h.track(p.op, p.stream)
	if err != nil {
		return h.failCall(p.op, err)
	}
	if p.blocking {
		if err := h.wait(ev); err != nil {
			return h.failCall(p.op, err)
		}
	}
	if h.dead.Load() {
		return h.failCall(p.op, errAborted)
	}
	return nil
}

// waitAll waits for every request (so that none still writes a staging
// buffer) and returns the first error; the first failure fails the Comm at
// once, which ends the others' waits.
func (h *Comm) waitAll(op string, reqs []*core.Request) error {
	var first error
	for _, r := range reqs {
		if err := r.Wait(context.Background()); err != nil && first == nil {
			first = err
			h.failFor(op, err)
		}
	}
	return first
}

func at(p cuda.DevicePtr, off int) cuda.DevicePtr { return p + cuda.DevicePtr(off) }

// Allreduce reduces count elements of dt from every rank's send into every
// rank's recv (send == recv: in place), on stream. See the package doc.
func (h *Comm) Allreduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op, stream cuda.Stream, blocking bool) error {
	const name = "allreduce"
	end, err := h.start(ctx, callSig{kAllreduce, dt, op, -1, uint64(count)}, true)
	if end == nil {
		return err
	}
	defer end()
	p := plan{op: name, stream: stream, blocking: blocking}
	if len(h.lay.Hosts) == 1 {
		p.first = func(c *nccl.Comm) error { return c.AllReduce(send, recv, count, dt, op, stream) }
		return h.run(p)
	}
	// Avg: sums throughout, then a division by the world size on the host.
	sum := op
	if op == collective.Avg {
		sum = collective.Sum
	}
	es, P := dt.Size(), h.lay.Pieces
	native, q := h.lay.Native(h.host, count), count/P
	eachPiece := func(c *nccl.Comm, do func(off, n, owner int) error) error {
		return h.lib.Group(func() error {
			for pc := 0; pc < P; pc++ {
				if off, n := Span(count, P, pc); n > 0 {
					if err := do(off, n, h.lay.Owner(h.host, pc)); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	p.first = func(c *nccl.Comm) error {
		if native {
			return c.ReduceScatter(send, at(recv, h.li*q*es), q, dt, sum, stream)
		}
		return eachPiece(c, func(off, n, owner int) error {
			return c.Reduce(at(send, off*es), at(recv, off*es), n, dt, sum, owner, stream)
		})
	}
	// Each piece this rank carries crosses by GPUDirect RDMA where its
	// group's paths all move device memory (agreed within the group, per
	// call: Directs.Choose, a 4-byte allreduce), else staged. Avg divides
	// by the world size on the host: staged. Without a GPU runtime in the
	// communicator's configuration (core.Config.GPU: capi sets it on every
	// rank that has one, and the hierarchy runs only where every rank has
	// one) no path moves device memory, and nothing is agreed.
	mine, directs, err := h.choosePieces(ctx, op != collective.Avg)
	if err != nil {
		return h.failCall(name, err)
	}
	p.direct = h.eachDirect(directs, count, func(d *Direct, pc, off, n int) error {
		ptr := at(recv, off*es)
		return d.Allreduce(ctx, ptr, ptr, n, dt, sum)
	})
	for _, pc := range mine {
		if off, n := Span(count, P, pc); n > 0 {
			p.bufs = append(p.bufs, stage.Buf{Name: fmt.Sprintf("recvbuf piece %d", pc), Ptr: uintptr(at(recv, off*es)), Len: n * es, In: true, Out: true})
		}
	}
	p.cross = func(host [][]byte) error {
		var reqs []*core.Request
		k := 0
		for _, pc := range mine {
			buf := []byte{} // an empty piece still compares the call
			if _, n := Span(count, P, pc); n > 0 {
				buf, k = host[k], k+1
			}
			reqs = append(reqs, h.cross[pc].IAllreduce(nil, buf, dt, sum))
		}
		if err := h.waitAll(name, reqs); err != nil {
			return err
		}
		if op == collective.Avg {
			for _, b := range host {
				collective.FinishAvg(b, dt, h.parent.Size())
			}
		}
		return nil
	}
	if len(mine) == 0 {
		p.cross = nil // every piece went by GPUDirect RDMA
	}
	p.last = func(c *nccl.Comm) error {
		if native {
			return c.AllGather(at(recv, h.li*q*es), recv, q, dt, stream)
		}
		return eachPiece(c, func(off, n, owner int) error {
			return c.Broadcast(at(recv, off*es), at(recv, off*es), n, dt, owner, stream)
		})
	}
	return h.run(p)
}

// choosePieces splits the pieces this rank carries between hosts into those
// that cross staged and those that cross by GPUDirect RDMA (with their
// Direct), agreed per piece within its group (Directs.Choose, a 4-byte
// allreduce). allowed false stages them all; so does a communicator made
// without a GPU runtime in its configuration (core.Config.GPU: capi sets
// it on every rank that has one, and the hierarchy runs only where every
// rank has one), where no path moves device memory and nothing is agreed.
func (h *Comm) choosePieces(ctx context.Context, allowed bool) (staged []int, direct map[int]*Direct, err error) {
	allowed = allowed && h.gpu != nil && h.parent.Config().GPU != nil
	for _, pc := range h.lay.Owned(h.host, h.li) {
		if allowed {
			d, err := h.gd.Choose(ctx, pc, h.cross[pc], h.gpu)
			if err != nil {
				return nil, nil, err
			}
			if d != nil {
				if direct == nil {
					direct = map[int]*Direct{}
				}
				direct[pc] = d
				h.crossDirect.Add(1)
				continue
			}
		}
		h.crossStaged.Add(1)
		staged = append(staged, pc)
	}
	return staged, direct, nil
}

// eachDirect is the plan's direct phase: do for each piece in direct that
// is not empty (its offset and length in elements), in piece order; nil
// when there is none.
func (h *Comm) eachDirect(direct map[int]*Direct, count int, do func(d *Direct, pc, off, n int) error) func() error {
	if len(direct) == 0 {
		return nil
	}
	return func() error {
		for pc := range h.lay.Pieces {
			if d := direct[pc]; d != nil {
				if off, n := Span(count, h.lay.Pieces, pc); n > 0 {
					if err := do(d, pc, off, n); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
}

// Broadcast copies root's count elements at buf into every rank's buf, on
// stream: NCCL on root's host, each piece from there to the other hosts in
// its group, NCCL on each of those.
func (h *Comm) Broadcast(ctx context.Context, buf cuda.DevicePtr, count int, dt collective.DType, root int, stream cuda.Stream, blocking bool) error {
	const name = "broadcast"
	if root < 0 || root >= h.parent.Size() {
		return invalid(name, "root %d is out of range [0, %d)", root, h.parent.Size())
	}
	end, err := h.start(ctx, callSig{kBroadcast, dt, 0, int32(root), uint64(count)}, false)
	if end == nil {
		return err
	}
	defer end()
	p := plan{op: name, stream: stream, blocking: blocking}
	rh, rl := h.lay.HostOf[root], h.lay.LocalOf[root]
	if len(h.lay.Hosts) == 1 {
		p.first = func(c *nccl.Comm) error { return c.Broadcast(buf, buf, count, dt, rl, stream) }
		return h.run(p)
	}
	es, P, onRoot := dt.Size(), h.lay.Pieces, h.host == rh
	if onRoot && len(h.lay.Hosts[h.host]) > 1 {
		p.first = func(c *nccl.Comm) error { return c.Broadcast(buf, buf, count, dt, rl, stream) }
	}
	mine, directs, err := h.choosePieces(ctx, true)
	if err != nil {
		return h.failCall(name, err)
	}
	p.direct = h.eachDirect(directs, count, func(d *Direct, pc, off, n int) error {
		return d.Broadcast(ctx, at(buf, off*es), n*es, rh) // members in host order
	})
	for _, pc := range mine {
		if off, n := Span(count, P, pc); n > 0 {
			p.bufs = append(p.bufs, stage.Buf{Name: fmt.Sprintf("buf piece %d", pc), Ptr: uintptr(at(buf, off*es)), Len: n * es, In: onRoot, Out: !onRoot})
		}
	}
	p.cross = func(host [][]byte) error {
		var reqs []*core.Request
		k := 0
		for _, pc := range mine {
			b := []byte{}
			if _, n := Span(count, P, pc); n > 0 {
				b, k = host[k], k+1
			}
			reqs = append(reqs, h.cross[pc].IBroadcast(b, dt, rh)) // members in host order
		}
		return h.waitAll(name, reqs)
	}
	if len(mine) == 0 {
		p.cross = nil // every piece went by GPUDirect RDMA
	}
	if !onRoot {
		p.last = func(c *nccl.Comm) error {
			return h.lib.Group(func() error {
				for pc := 0; pc < P; pc++ {
					if off, n := Span(count, P, pc); n > 0 {
						if err := c.Broadcast(at(buf, off*es), at(buf, off*es), n, dt, h.lay.Owner(h.host, pc), stream); err != nil {
							return err
						}
					}
				}
				return nil
			})
		}
	}
	return h.run(p)
}

// Allgather gathers count elements from every rank's send into recv, rank
// order (send == recv: in place, this rank's block already at its place).
// Rank b's block crosses in the group of piece LocalOf[b]: from b to that
// piece's owner on every other host, which spreads it over its host.
func (h *Comm) Allgather(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, stream cuda.Stream, blocking bool) error {
	const name = "allgather"
	end, err := h.start(ctx, callSig{kAllgather, dt, 0, -1, uint64(count)}, false)
	if end == nil {
		return err
	}
	defer end()
	es := dt.Size()
	bs := count * es
	if send == recv {
		send = at(recv, h.rank*bs)
	}
	p := plan{op: name, stream: stream, blocking: blocking}
	if len(h.lay.Hosts) == 1 { // local order is rank order
		p.first = func(c *nccl.Comm) error { return c.AllGather(send, recv, count, dt, stream) }
		return h.run(p)
	}
	mine := h.lay.Owned(h.host, h.li)
	// Staged: this rank's block (it owns piece li: its own local index),
	// then the blocks it receives from other hosts.
	p.bufs = append(p.bufs, stage.Buf{Name: "sendbuf", Ptr: uintptr(send), Len: bs, In: true})
	type slot struct{ pc, b int }
	var slots []slot
	for _, pc := range mine {
		for _, b := range h.lay.Blocks(pc) {
			if h.lay.HostOf[b] != h.host {
				slots = append(slots, slot{pc, b})
				p.bufs = append(p.bufs, stage.Buf{Name: fmt.Sprintf("recvbuf block %d", b), Ptr: uintptr(at(recv, b*bs)), Len: bs, Out: true})
			}
		}
	}
	p.cross = func(host [][]byte) error {
		var reqs []*core.Request
		temps := make([][]byte, len(mine))
		for i, pc := range mine {
			counts := make([]int, len(h.lay.Hosts))
			displs := make([]int, len(h.lay.Hosts))
			total := 0
			for m, ranks := range h.lay.Hosts {
				if pc < len(ranks) {
					counts[m], displs[m] = count, total
					total += count
				}
			}
			contrib := []byte{}
			if pc == h.li {
				contrib = host[0]
			}
			temps[i] = make([]byte, total*es)
			reqs = append(reqs, h.cross[pc].IAllgatherv(contrib, temps[i], counts, displs, dt))
		}
		if err := h.waitAll(name, reqs); err != nil {
			return err
		}
		for k, s := range slots {
			i := indexOf(mine, s.pc)
			d := 0 // the block's place in the piece's gather: blocks before it, in host order
			for m := 0; m < h.lay.HostOf[s.b]; m++ {
				if s.pc < len(h.lay.Hosts[m]) {
					d++
				}
			}
			copy(host[1+k], temps[i][d*bs:(d+1)*bs])
		}
		return nil
	}
	p.last = func(c *nccl.Comm) error {
		return h.lib.Group(func() error {
			for b := 0; b < h.parent.Size(); b++ {
				holder := h.lay.Owner(h.host, h.lay.LocalOf[b]) // received it
				src := at(recv, b*bs)
				if h.lay.HostOf[b] == h.host {
					holder = h.lay.LocalOf[b] // b itself, from its send
					if b == h.rank {
						src = send
					}
				}
				if err := c.Broadcast(src, at(recv, b*bs), count, dt, holder, stream); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return h.run(p)
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// ReduceScatter reduces every rank's send (Size() blocks of count elements)
// and leaves block r in rank r's recv (send == recv: in place, the input at
// recv and the result at its start, as nexar_reduce_scatter). Each block is
// reduced by NCCL onto the owner of its rank's piece on every host, then
// between hosts onto its rank.
func (h *Comm) ReduceScatter(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op, stream cuda.Stream, blocking bool) error {
	const name = "reduce_scatter"
	end, err := h.start(ctx, callSig{kReduceScatter, dt, op, -1, uint64(count)}, true)
	if end == nil {
		return err
	}
	defer end()
	es, size := dt.Size(), h.parent.Size()
	bs := count * es
	p := plan{op: name, stream: stream, blocking: blocking}
	if len(h.lay.Hosts) == 1 {
		if send != recv {
			p.first = func(c *nccl.Comm) error { return c.ReduceScatter(send, recv, count, dt, op, stream) }
			return h.run(p)
		}
		// In place: NCCL's own in-place form leaves the result in block
		// rank; a copy on the stream moves it to the start.
		mid := at(send, h.rank*bs)
		p.first = func(c *nccl.Comm) error {
			if err := c.ReduceScatter(send, mid, count, dt, op, stream); err != nil || h.rank == 0 {
				return err
			}
			return h.rt.MemcpyAsync(uintptr(recv), uintptr(mid), bs, cuda.MemcpyDeviceToDevice, stream)
		}
		return h.run(p)
	}
	sum := op
	if op == collective.Avg {
		sum = collective.Sum
	}
	// Scratch: a slot per block this rank reduces onto, by piece, and
	// within a piece in host order (so a piece's slots are its
	// reduce-scatter's input as they lie).
	mine := h.lay.Owned(h.host, h.li)
	slotOf := map[int]int{}
	for _, pc := range mine {
		for _, b := range h.lay.Blocks(pc) {
			slotOf[b] = len(slotOf)
		}
	}
	scratch, err := h.scratchOf(len(slotOf) * bs)
	if err != nil {
		return h.failCall(name, err)
	}
	p.first = func(c *nccl.Comm) error {
		return h.lib.Group(func() error {
			for b := 0; b < size; b++ {
				owner := h.lay.Owner(h.host, h.lay.LocalOf[b])
				dst := recv // not used off the root
				if owner == h.li {
					dst = at(scratch, slotOf[b]*bs)
				}
				if err := c.Reduce(at(send, b*bs), dst, count, dt, sum, owner, stream); err != nil {
					return err
				}
			}
			return nil
		})
	}
	p.bufs = []stage.Buf{
		{Name: "scratch", Ptr: uintptr(scratch), Len: len(slotOf) * bs, In: true},
		{Name: "recvbuf", Ptr: uintptr(recv), Len: bs, Out: true},
	}
	p.cross = func(host [][]byte) error {
		parts, out := host[0], host[1]
		var reqs []*core.Request
		for _, pc := range mine {
			blocks := h.lay.Blocks(pc)
			first := slotOf[blocks[0]] * bs
			if len(blocks) == len(h.lay.Hosts) { // every host has one: this rank's is block pc == li
				reqs = append(reqs, h.cross[pc].IReduceScatter(parts[first:first+len(blocks)*bs], out, dt, sum))
				continue
			}
			for _, b := range blocks {
				var into []byte
				if b == h.rank {
					into = out
				}
				s := slotOf[b] * bs
				reqs = append(reqs, h.cross[pc].IReduce(parts[s:s+bs], into, dt, sum, h.lay.HostOf[b]))
			}
		}
		if err := h.waitAll(name, reqs); err != nil {
			return err
		}
		if op == collective.Avg {
			collective.FinishAvg(out, dt, size)
		}
		return nil
	}
	return h.run(p)
}
