package collective

import (
	"context"
	"fmt"
	"unsafe"
)

// Allreduce combines send of every rank element-wise with op and leaves the
// result in recv on every rank. send == nil means in place (input in recv).
// Results are bit-identical on all ranks: every element is combined by one
// fixed expression tree.
func Allreduce(ctx context.Context, l Link, send, recv []byte, dt DType, op Op) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := Check(dt, op); err != nil {
		return err
	}
	if send != nil && len(send) != len(recv) {
		return fmt.Errorf("collective: allreduce send has %d bytes, recv %d", len(send), len(recv))
	}
	if err := checkElems("allreduce", len(recv), dt); err != nil {
		return err
	}
	count := len(recv) / dt.Size()
	auto := AlgoRecursiveDoubling
	threshold := l.Tuning().AllreduceRingThreshold
	if size > 2 {
		threshold = l.Tuning().AllreduceRingThresholdMany
	}
	lay := l.Tuning().Layout
	hosts, hier := twoLevel(l)
	big := len(recv) >= threshold && count >= size
	leaders, led := leaderHosts(l)
	switch {
	case big && hier && lay == nil:
		auto = AlgoHier
	case big:
		auto = AlgoRing
	case lay != nil && !lay.Cube():
		auto = AlgoTree // recursive doubling's partners would be relayed
	case led && lay == nil:
		// One rank per host crosses the link (leaderAllreduce); not over a
		// sparse Layout, where the leaders need not be neighbours.
		auto = AlgoHier
	}
	algo, err := choose("allreduce", l.Tuning().Force.Allreduce, auto, AlgoRecursiveDoubling, AlgoRing, AlgoTree, AlgoHier)
	if err != nil {
		return err
	}
	prepare(l, send, recv)
	if algo == AlgoHier && big && !hier {
		return fmt.Errorf("collective: allreduce's hier algorithm needs, from %d bytes, Tuning.Hosts with at least two hosts of equal rank counts (two or more each); have %v", threshold, hostsDesc(l))
	}
	if algo == AlgoHier && !big && !led {
		return fmt.Errorf("collective: allreduce's hier algorithm needs Tuning.Hosts with at least two hosts, one of them with two or more ranks; have %v", hostsDesc(l))
	}
	if size == 1 || count == 0 {
		if send != nil {
			copy(recv, send)
		}
		return nil
	}
	if algo == AlgoHier && !big {
		if send != nil {
			copy(recv, send)
		}
		return leaderAllreduce(ctx, l, leaders, recv, dt, op)
	}
	if algo == AlgoHier {
		in := send
		if in == nil {
			in = recv
		}
		return hierAllreduce(ctx, l, hosts, in, recv, dt, op)
	}
	var st steps
	st.init(l)
	if algo == AlgoRing {
		in := send
		if in == nil {
			in = recv
		}
		if size == 2 && streams(l, 1-rank) {
			return st.pairStream(ctx, l, in, recv, dt, op)
		}
		blocks := balanced(recv, size, dt.Size())
		if err := st.ringReduceScatter(ctx, l, balanced(in, size, dt.Size()), blocks[rank], dt, op); err != nil {
			return err
		}
		return st.ringAllgather(ctx, l, blocks)
	}
	if send != nil {
		copy(recv, send)
	}
	if algo == AlgoTree {
		t := treeLayout(l)
		if err := st.treeReduce(ctx, l, t, 0, recv, dt, redOp(op)); err != nil {
			return err
		}
		if op == Avg && rank == 0 {
			FinishAvg(recv, dt, size)
		}
		return st.treeBroadcast(ctx, l, t, 0, recv)
	}
	if err := st.recursiveDoubling(ctx, l, rank, size, recv, dt, redOp(op)); err != nil {
		return err
	}
	if op == Avg {
		FinishAvg(recv, dt, size)
	}
	return nil
}

// recursiveDoubling allreduces buf in place (MPICH's algorithm). With
// pof2 the largest power of two <= size and rem = size-pof2, the first
// 2*rem ranks pair up so that the odd one holds the pair's sum; the pof2
// survivors exchange and combine at distances 1, 2, 4, ...; the odd ranks
// finally hand the result back to their even partner. Each pair combines
// lower-rank data op higher-rank data, so both compute the same bits.
func (st *steps) recursiveDoubling(ctx context.Context, l Link, rank, size int, buf []byte, dt DType, op Op) error {
	pof2 := 1
	for pof2*2 <= size {
		pof2 *= 2
	}
	rem := size - pof2
	tmp := scratchOf(l).Get(len(buf))
	defer scratchOf(l).Put(tmp)
	newrank := rank - rem
	if rank < 2*rem {
		if rank%2 == 0 {
			if err := st.send(ctx, l, rank+1, buf); err != nil {
				return err
			}
			newrank = -1
		} else {
			if err := st.recv(ctx, l, rank-1, tmp); err != nil {
				return err
			}
			ReduceInto(tmp, buf, dt, op) // (rank-1) op rank
			copy(buf, tmp)
			newrank = rank / 2
		}
	}
	if newrank >= 0 {
		for mask := 1; mask < pof2; mask <<= 1 {
			nd := newrank ^ mask
			peer := nd + rem
			if nd < rem {
				peer = nd*2 + 1
			}
			if err := st.exchange(ctx, l, peer, buf, peer, tmp); err != nil {
				return err
			}
			if peer < rank {
				ReduceInto(tmp, buf, dt, op)
				copy(buf, tmp)
			} else {
				ReduceInto(buf, tmp, dt, op)
			}
		}
	}
	if rank < 2*rem {
		if rank%2 == 1 {
			return st.send(ctx, l, rank-1, buf)
		}
		return st.recv(ctx, l, rank+1, buf)
	}
	return nil
}

// ringReduceScatter reduces the blocks in[0..size) of every rank so that out
// (len(in[rank]) bytes) ends up holding block rank of the reduction, divided
// by size for Avg. At step s rank r sends its running block (r-s-1) mod size
// to r+1 and folds block (r-s-2) mod size received from r-1 into its own
// input; after size-1 steps the block that arrives is block r, complete.
// out may alias in[rank]: that block is read only at the last step.
func (st *steps) ringReduceScatter(ctx context.Context, l Link, in [][]byte, out []byte, dt DType, op Op) error {
	rank, size := l.Rank(), l.Size()
	if size == 1 {
		copy(out, in[0])
		return nil
	}
	// Positions on the ring (Layout.Ring, else rank order) play the part
	// of ranks: block at(q) is reduced along the ring to position q.
	rp := ringOf(l)
	pos, at := rp.pos, rp.at
	maxb := 0
	for _, b := range in {
		maxb = max(maxb, len(b))
	}
	// One scratch buffer in two halves: a transport that registers memory
	// registers it once (prepare).
	both := scratchOf(l).Get(2 * maxb)
	defer scratchOf(l).Put(both)
	prepare(l, both)
	bufs := [2][]byte{both[:maxb:maxb], both[maxb:]}
	next, prev := at(pos+1), at(pos-1)
	cur := in[at(pos-1)] // what we send at step 0: our own block
	for s := 0; s < size-2; s++ {
		rb := at(pos - s - 2)
		tmp := bufs[s%2][:len(in[rb])]
		if err := st.exchange(ctx, l, next, cur, prev, tmp); err != nil {
			return err
		}
		ReduceInto(tmp, in[rb], dt, redOp(op))
		cur = tmp
	}
	// Last step: the block that arrives is ours; combine it with our input
	// straight into out, which saves a pass over the block.
	if !overlaps(out, in[rank]) && !overlaps(out, cur) {
		if err := st.exchange(ctx, l, next, cur, prev, out); err != nil {
			return err
		}
		ReduceInto(out, in[rank], dt, redOp(op))
	} else {
		tmp := bufs[size%2][:len(in[rank])]
		if err := st.exchange(ctx, l, next, cur, prev, tmp); err != nil {
			return err
		}
		if len(out) > 0 && &out[0] == &in[rank][0] {
			ReduceInto(out, tmp, dt, redOp(op)) // in place: out is in[rank]
		} else {
			ReduceInto(tmp, in[rank], dt, redOp(op))
			copy(out, tmp)
		}
	}
	if op == Avg {
		FinishAvg(out, dt, size)
	}
	return nil
}

// ringAllgather completes blocks on every rank, given that blocks[rank] is
// filled: at step s the rank at ring position p (Layout.Ring, else rank
// order) forwards the block of position p-s to position p+1 and receives
// that of position p-s-1 from position p-1.
func (st *steps) ringAllgather(ctx context.Context, l Link, blocks [][]byte) error {
	size := l.Size()
	rp := ringOf(l)
	pos, at := rp.pos, rp.at
	next, prev := at(pos+1), at(pos-1)
	for s := 0; s < size-1; s++ {
		if err := st.exchange(ctx, l, next, blocks[at(pos-s)], prev, blocks[at(pos-s-1)]); err != nil {
			return err
		}
	}
	return nil
}

// ReduceScatter reduces send (size equal blocks of len(recv) bytes) across
// ranks and leaves block Rank() of the result in recv.
func ReduceScatter(ctx context.Context, l Link, send, recv []byte, dt DType, op Op) error {
	_, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := Check(dt, op); err != nil {
		return err
	}
	if send == nil && len(recv) > 0 {
		return fmt.Errorf("collective: reduce-scatter needs a send buffer (use ReduceScatterInPlace)")
	}
	if len(send) != size*len(recv) {
		return fmt.Errorf("collective: reduce-scatter send has %d bytes, want %d blocks of %d", len(send), size, len(recv))
	}
	if err := checkElems("reduce-scatter", len(recv), dt); err != nil {
		return err
	}
	if len(recv) == 0 {
		return nil
	}
	prepare(l, send, recv)
	if h, ok := twoLevel(l); ok && l.Tuning().Layout == nil {
		return hierReduceScatter(ctx, l, h, send, recv, dt, op)
	}
	var st steps
	st.init(l)
	return st.ringReduceScatter(ctx, l, eqblocks(send, size, len(recv)), recv, dt, op)
}

// ReduceScatterInPlace reduces buf (size equal blocks) across ranks and
// leaves the result's block Rank() in block Rank() of buf; the other blocks
// are left unspecified.
func ReduceScatterInPlace(ctx context.Context, l Link, buf []byte, dt DType, op Op) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := Check(dt, op); err != nil {
		return err
	}
	if len(buf)%size != 0 {
		return fmt.Errorf("collective: reduce-scatter buffer of %d bytes is not %d equal blocks", len(buf), size)
	}
	blk := len(buf) / size
	if err := checkElems("reduce-scatter", blk, dt); err != nil {
		return err
	}
	if blk == 0 {
		return nil
	}
	blocks := eqblocks(buf, size, blk)
	prepare(l, buf)
	if h, ok := twoLevel(l); ok && l.Tuning().Layout == nil {
		return hierReduceScatter(ctx, l, h, buf, blocks[rank], dt, op)
	}
	var st steps
	st.init(l)
	return st.ringReduceScatter(ctx, l, blocks, blocks[rank], dt, op)
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}
