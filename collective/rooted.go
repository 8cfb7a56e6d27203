package collective

import (
	"context"
	"fmt"
)

// Trees over ranks relative to the root: vr = (rank - root) mod size. In the
// binomial tree the parent of vr is vr with its lowest set bit cleared and
// the subtree of vr covers [vr, vr+lowbit(vr)) clipped to size (the whole
// group for the root).

func lowbit(v int) int { return v & -v }

// subtree is the number of ranks in vr's binomial subtree.
func subtree(vr, size int) int {
	if vr == 0 {
		return size
	}
	return min(lowbit(vr), size-vr)
}

// topMask is the largest power of two below size (the root's first child).
func topMask(size int) int {
	m := 1
	for m*2 < size {
		m *= 2
	}
	return m
}

// hostOrder returns the relative rank of rank and its inverse for a
// binomial tree from root: where Tuning.Hosts says where the ranks run,
// over the hosts' chain order (root's host first, then each host's ranks
// in a row), so that a host's ranks fill whole subtrees and, with hosts of
// equal power-of-two rank counts, each other host is crossed to once;
// else vr and abs as given (rank order from root).
func hostOrder(l Link, rank, root, vr int, abs func(int) int) (int, func(int) int) {
	h := l.Tuning().Hosts
	if h == nil || h.Size() != l.Size() || h.Hosts() < 2 || h.Hosts() == l.Size() {
		return vr, abs
	}
	order := h.chain(root)
	for p, r := range order {
		if r == rank {
			vr = p
		}
	}
	return vr, func(v int) int { return order[v] }
}

// Broadcast copies root's buf into buf on every rank.
func Broadcast(ctx context.Context, l Link, buf []byte, root int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkRoot(root, size); err != nil {
		return err
	}
	auto := AlgoBinomial
	if len(buf) >= l.Tuning().BroadcastPipelineThreshold && size > 2 {
		auto = AlgoPipeline
	}
	algo, err := choose("broadcast", l.Tuning().Force.Broadcast, auto, AlgoBinomial, AlgoPipeline)
	if err != nil {
		return err
	}
	prepare(l, buf)
	if size == 1 {
		return nil
	}
	var st steps
	st.init(l)
	vr := mod(rank-root, size)
	abs := func(v int) int { return (v + root) % size }
	lay := l.Tuning().Layout
	if algo == AlgoPipeline {
		if lay != nil {
			// The chain goes down the Layout's ring from the root.
			rp := ringOf(l)
			var rootPos int
			for p := range size {
				if rp.at(p) == root {
					rootPos = p
				}
			}
			vr = mod(rp.pos-rootPos, size)
			abs = func(v int) int { return rp.at(rootPos + v) }
		} else if h := l.Tuning().Hosts; h != nil && h.Size() == size {
			order := h.chain(root)
			for p, r := range order {
				if r == rank {
					vr = p
				}
			}
			abs = func(v int) int { return order[v] }
		}
		prev, next := -1, -1
		if vr > 0 {
			prev = abs(vr - 1)
		}
		if vr < size-1 {
			next = abs(vr + 1)
		}
		return st.pipeline(ctx, l, prev, buf, next, buf, nil)
	}
	if lay != nil {
		return st.treeBroadcast(ctx, l, lay, root, buf)
	}
	vr, abs = hostOrder(l, rank, root, vr, abs)
	mask := topMask(size)
	if vr != 0 {
		if err := st.recv(ctx, l, abs(vr-lowbit(vr)), buf); err != nil {
			return err
		}
		mask = lowbit(vr) >> 1
	}
	for ; mask > 0; mask >>= 1 {
		if vr+mask < size {
			if err := st.send(ctx, l, abs(vr+mask), buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// Reduce combines send of every rank with op into recv on root. recv is only
// used on root; send == nil means the input is in recv.
func Reduce(ctx context.Context, l Link, send, recv []byte, dt DType, op Op, root int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := Check(dt, op); err != nil {
		return err
	}
	if err := checkRoot(root, size); err != nil {
		return err
	}
	in := send
	if in == nil {
		in = recv
	}
	if rank == root && len(in) != len(recv) {
		return fmt.Errorf("collective: reduce send has %d bytes, recv %d", len(in), len(recv))
	}
	if err := checkElems("reduce", len(in), dt); err != nil {
		return err
	}
	count := len(in) / dt.Size()
	auto := AlgoBinomial
	if len(in) >= l.Tuning().ReduceRingThreshold && count >= size {
		auto = AlgoRing
	}
	algo, err := choose("reduce", l.Tuning().Force.Reduce, auto, AlgoBinomial, AlgoRing)
	if err != nil {
		return err
	}
	prepare(l, send, recv)
	if size == 1 || count == 0 {
		if rank == root && send != nil {
			copy(recv, send)
		}
		return nil
	}
	var st steps
	st.init(l)
	if algo == AlgoRing {
		// Rabenseifner-style: reduce-scatter, then gather the blocks to root.
		var out []byte
		if rank == root {
			out = balanced(recv, size, dt.Size())[rank]
		} else {
			out = scratchOf(l).Get(len(balanced(in, size, dt.Size())[rank]))
			defer scratchOf(l).Put(out)
		}
		if err := st.ringReduceScatter(ctx, l, balanced(in, size, dt.Size()), out, dt, op); err != nil {
			return err
		}
		if rank != root {
			return st.send(ctx, l, root, out)
		}
		blocks := balanced(recv, size, dt.Size())
		g, gctx := newGroup(ctx)
		for p := 0; p < size; p++ {
			if p == root {
				continue
			}
			p, b := p, st.recvFrom(p, len(blocks[p]))
			g.Go(func() error { return st.recvMsg(gctx, l, p, b, blocks[p]) })
		}
		return g.Wait()
	}
	// Binomial: children cover higher relative ranks, so acc op child keeps
	// the combination in relative rank order.
	vr := mod(rank-root, size)
	acc := recv
	if rank != root {
		acc = scratchOf(l).Get(len(in))
		defer scratchOf(l).Put(acc)
	}
	if send != nil || rank != root {
		copy(acc, in)
	}
	if lay := l.Tuning().Layout; lay != nil {
		if err := st.treeReduce(ctx, l, lay, root, acc, dt, redOp(op)); err != nil {
			return err
		}
		if op == Avg && rank == root {
			FinishAvg(acc, dt, size)
		}
		return nil
	}
	tmp := scratchOf(l).Get(len(in))
	defer scratchOf(l).Put(tmp)
	o := redOp(op)
	vr, abs := hostOrder(l, rank, root, vr, func(v int) int { return (v + root) % size })
	for mask := 1; mask < size; mask <<= 1 {
		if vr&mask != 0 {
			return st.send(ctx, l, abs(vr-mask), acc)
		}
		if child := vr | mask; child < size {
			if err := st.recv(ctx, l, abs(child), tmp); err != nil {
				return err
			}
			ReduceInto(acc, tmp, dt, o)
		}
	}
	if op == Avg {
		FinishAvg(acc, dt, size)
	}
	return nil
}

// Gather collects every rank's send into recv on root, in rank order. recv
// (size*len(send) bytes) is only used on root; send == nil on root means its
// block is already in place.
func Gather(ctx context.Context, l Link, send, recv []byte, root int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkRoot(root, size); err != nil {
		return err
	}
	blk := len(send)
	if rank == root {
		if len(recv)%size != 0 || (send != nil && len(recv) != size*len(send)) {
			return fmt.Errorf("collective: gather recv has %d bytes, want %d blocks of %d", len(recv), size, len(send))
		}
		blk = len(recv) / size
	}
	auto := AlgoLinear
	if blk*size < l.Tuning().GatherBinomialThreshold {
		auto = AlgoBinomial
	}
	algo, err := choose("gather", l.Tuning().Force.Gather, auto, AlgoBinomial, AlgoLinear)
	if err != nil {
		return err
	}
	prepare(l, send, recv)
	if algo == AlgoLinear {
		counts, displs := make([]int, size), make([]int, size)
		for i := range counts {
			counts[i], displs[i] = blk, i*blk
		}
		var st steps
		st.init(l)
		return gatherv(ctx, l, &st, send, recv, counts, displs, root)
	}
	if size == 1 {
		if send != nil {
			copy(recv, send)
		}
		return nil
	}
	// Binomial: tmp holds the blocks of relative ranks [vr, vr+subtree).
	var st steps
	st.init(l)
	vr := mod(rank-root, size)
	n := subtree(vr, size)
	var tmp []byte
	if rank == root && root == 0 {
		tmp = recv
	} else {
		tmp = make([]byte, n*blk)
	}
	if send != nil {
		copy(tmp, send)
	} else {
		copy(tmp, recv[rank*blk:(rank+1)*blk])
	}
	for mask := 1; mask < size; mask <<= 1 {
		if vr&mask != 0 {
			return st.send(ctx, l, (vr-mask+root)%size, tmp)
		}
		if child := vr | mask; child < size {
			c := min(mask, size-child)
			if err := st.recv(ctx, l, (child+root)%size, tmp[mask*blk:(mask+c)*blk]); err != nil {
				return err
			}
		}
	}
	if root != 0 { // un-rotate relative order into rank order
		for v := 0; v < size; v++ {
			r := (v + root) % size
			copy(recv[r*blk:(r+1)*blk], tmp[v*blk:(v+1)*blk])
		}
	}
	return nil
}

// Gatherv collects send of rank i into recv[displs[i]:displs[i]+counts[i]]
// on root (counts and displacements in bytes, used on root only). send == nil
// on root means its block is already in place.
func Gatherv(ctx context.Context, l Link, send, recv []byte, counts, displs []int, root int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkRoot(root, size); err != nil {
		return err
	}
	if rank == root {
		if err := checkV("gatherv", counts, displs, size, len(recv)); err != nil {
			return err
		}
		if send != nil && len(send) != counts[rank] {
			return fmt.Errorf("collective: gatherv root sends %d bytes, counts say %d", len(send), counts[rank])
		}
	}
	prepare(l, send, recv)
	var st steps
	st.init(l)
	return gatherv(ctx, l, &st, send, recv, counts, displs, root)
}

// gatherv is the linear gather: the root receives from all ranks at once.
func gatherv(ctx context.Context, l Link, st *steps, send, recv []byte, counts, displs []int, root int) error {
	rank, size := l.Rank(), l.Size()
	if rank != root {
		return st.send(ctx, l, root, send)
	}
	blocks := vblocks(recv, counts, displs)
	if send != nil {
		copy(blocks[rank], send)
	}
	g, gctx := newGroup(ctx)
	for p := 0; p < size; p++ {
		if p == root {
			continue
		}
		p, b := p, st.recvFrom(p, len(blocks[p]))
		g.Go(func() error { return st.recvMsg(gctx, l, p, b, blocks[p]) })
	}
	return g.Wait()
}

// Scatter sends block i of root's send (size*len(recv) bytes) to rank i's
// recv. recv == nil on root means root's block stays in send.
func Scatter(ctx context.Context, l Link, send, recv []byte, root int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkRoot(root, size); err != nil {
		return err
	}
	blk := len(recv)
	if rank == root {
		if len(send)%size != 0 || (recv != nil && len(send) != size*len(recv)) {
			return fmt.Errorf("collective: scatter send has %d bytes, want %d blocks of %d", len(send), size, len(recv))
		}
		blk = len(send) / size
	}
	auto := AlgoLinear
	if blk*size < l.Tuning().GatherBinomialThreshold {
		auto = AlgoBinomial
	}
	algo, err := choose("scatter", l.Tuning().Force.Scatter, auto, AlgoBinomial, AlgoLinear)
	if err != nil {
		return err
	}
	prepare(l, send, recv)
	if algo == AlgoLinear {
		counts, displs := make([]int, size), make([]int, size)
		for i := range counts {
			counts[i], displs[i] = blk, i*blk
		}
		var st steps
		st.init(l)
		return scatterv(ctx, l, &st, send, counts, displs, recv, root)
	}
	if size == 1 {
		if recv != nil {
			copy(recv, send)
		}
		return nil
	}
	// Binomial: tmp holds the blocks of relative ranks [vr, vr+subtree).
	var st steps
	st.init(l)
	vr := mod(rank-root, size)
	n := subtree(vr, size)
	var tmp []byte
	mask := topMask(size)
	switch {
	case rank == root && root == 0:
		tmp = send
	case rank == root:
		tmp = make([]byte, n*blk)
		for v := 0; v < size; v++ {
			r := (v + root) % size
			copy(tmp[v*blk:(v+1)*blk], send[r*blk:(r+1)*blk])
		}
	default:
		if n == 1 {
			tmp = recv
		} else {
			tmp = make([]byte, n*blk)
		}
		if err := st.recv(ctx, l, (vr-lowbit(vr)+root)%size, tmp); err != nil {
			return err
		}
		mask = lowbit(vr) >> 1
	}
	for ; mask > 0; mask >>= 1 {
		if child := vr + mask; child < size {
			c := min(mask, size-child)
			if err := st.send(ctx, l, (child+root)%size, tmp[mask*blk:(mask+c)*blk]); err != nil {
				return err
			}
		}
	}
	if recv != nil && (rank == root || n > 1) {
		copy(recv, tmp[:blk])
	}
	return nil
}

// Scatterv sends send[displs[i]:displs[i]+counts[i]] of root to rank i's recv
// (counts and displacements in bytes, used on root only). recv == nil on root
// means root's block stays in send.
func Scatterv(ctx context.Context, l Link, send []byte, counts, displs []int, recv []byte, root int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkRoot(root, size); err != nil {
		return err
	}
	if rank == root {
		if err := checkV("scatterv", counts, displs, size, len(send)); err != nil {
			return err
		}
		if recv != nil && len(recv) != counts[rank] {
			return fmt.Errorf("collective: scatterv root receives %d bytes, counts say %d", len(recv), counts[rank])
		}
	}
	prepare(l, send, recv)
	var st steps
	st.init(l)
	return scatterv(ctx, l, &st, send, counts, displs, recv, root)
}

// scatterv is the linear scatter: the root sends to all ranks at once.
func scatterv(ctx context.Context, l Link, st *steps, send []byte, counts, displs []int, recv []byte, root int) error {
	rank, size := l.Rank(), l.Size()
	if rank != root {
		return st.recv(ctx, l, root, recv)
	}
	blocks := vblocks(send, counts, displs)
	if recv != nil {
		copy(recv, blocks[rank])
	}
	g, gctx := newGroup(ctx)
	for p := 0; p < size; p++ {
		if p == root {
			continue
		}
		p, b := p, st.sendTo(p, len(blocks[p]))
		g.Go(func() error { return st.sendMsg(gctx, l, p, b, blocks[p]) })
	}
	return g.Wait()
}
