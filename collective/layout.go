package collective

import "context"

// Layout fits the schedules to a sparse graph of who talks directly
// (Tuning.Layout; core builds one per communicator from its topology,
// docs/scale.md), so that a collective's messages go between ranks that
// talk directly where the graph allows and are relayed only where it does
// not. With a Layout:
//
//   - the ring schedules (allreduce, reduce-scatter and reduce above their
//     thresholds, the ring allgather and allgatherv) go round Ring() instead
//     of rank order, and the pipelined broadcast down it from the root;
//   - the small allreduce is recursive doubling where Cube() (every partner
//     r XOR 2^i talks directly), else a reduction up Tree(0) and a
//     broadcast down it (AlgoTree); the binomial broadcast and reduce run
//     on Tree(root);
//   - the rest is unchanged: Bruck's allgather and all-to-all (log2 n
//     rounds of small blocks, relayed, where a ring takes n-1 steps), the
//     barrier, gather, scatter, scan and the pairwise all-to-all, which
//     talk to partners the graph does not choose or in an order that
//     defines their result.
//
// A schedule in another order combines values in another order: floats sum
// to other bits than in rank order, equally on every rank. The Layout is
// part of the tuning that ranks compare (Digest), and the same Layout gives
// the same bits over any transport, the full mesh included.
//
// Implementations are immutable after construction and safe for concurrent
// use; rank numbers are the Link's.
type Layout interface {
	// Ring is a cyclic order of every rank (a permutation of 0..n-1) in
	// which consecutive ranks, and the last and the first, talk directly
	// where the graph allows. The caller does not modify it.
	Ring() []int
	// Tree returns rank's parent (-1 for root) and its children in a
	// spanning tree rooted at root whose edges talk directly where the
	// graph allows. The caller does not modify children.
	Tree(root, rank int) (parent int, children []int)
	// Cube reports whether the size is a power of two and every rank r
	// talks directly to r XOR 2^i for every bit i below it.
	Cube() bool
	// Digest identifies the layout (two layouts that order anything
	// differently have different digests, but for collisions).
	Digest() uint64
}

// ringPos is a ring order's view: at(p) is the rank at position p, pos
// this rank's position.
type ringPos struct {
	order []int // nil: rank order
	size  int
	pos   int
}

// ringOf is l's ring: the Layout's, else each host's ranks in a row
// (Tuning.Hosts), else rank order.
func ringOf(l Link) ringPos {
	rank, size := l.Rank(), l.Size()
	rp := ringPos{size: size, pos: rank}
	order := []int(nil)
	if lay := l.Tuning().Layout; lay != nil {
		order = lay.Ring()
	} else if h := l.Tuning().Hosts; h != nil && h.Size() == size {
		order = h.ring // each host's ranks in a row: the ring crosses between hosts H times
	}
	if order != nil {
		rp.order = order
		for p, r := range rp.order {
			if r == rank {
				rp.pos = p
			}
		}
	}
	return rp
}

// at is the rank at ring position p (any integer, taken mod size).
func (rp ringPos) at(p int) int {
	p = mod(p, rp.size)
	if rp.order == nil {
		return p
	}
	return rp.order[p]
}

// treeReduce combines acc (this rank's input, combined in place) with its
// children's partial results up the tree rooted at root (children in
// order: acc op child, so that every rank's tree fixes one expression);
// a rank other than root then sends its partial result to its parent.
func (st *steps) treeReduce(ctx context.Context, l Link, lay Layout, root int, acc []byte, dt DType, op Op) error {
	parent, children := lay.Tree(root, l.Rank())
	return st.treeReduceAt(ctx, l, parent, children, acc, dt, op)
}

// treeReduceAt is treeReduce at this rank's place in the tree: its parent
// (-1 at the root) and children.
func (st *steps) treeReduceAt(ctx context.Context, l Link, parent int, children []int, acc []byte, dt DType, op Op) error {
	if len(children) > 0 {
		tmp := scratchOf(l).Get(len(acc))
		defer scratchOf(l).Put(tmp)
		for _, c := range children {
			if err := st.recv(ctx, l, c, tmp); err != nil {
				return err
			}
			ReduceInto(acc, tmp, dt, op)
		}
	}
	if parent >= 0 {
		return st.send(ctx, l, parent, acc)
	}
	return nil
}

// treeBroadcast copies root's buf down the tree rooted at root.
func (st *steps) treeBroadcast(ctx context.Context, l Link, lay Layout, root int, buf []byte) error {
	parent, children := lay.Tree(root, l.Rank())
	return st.treeBroadcastAt(ctx, l, parent, children, buf)
}

// treeBroadcastAt is treeBroadcast at this rank's place in the tree.
func (st *steps) treeBroadcastAt(ctx context.Context, l Link, parent int, children []int, buf []byte) error {
	if parent >= 0 {
		if err := st.recv(ctx, l, parent, buf); err != nil {
			return err
		}
	}
	for _, c := range children {
		if err := st.send(ctx, l, c, buf); err != nil {
			return err
		}
	}
	return nil
}

// treeLayout is the Link's Layout, or without one a binomial tree in rank
// order (AlgoTree forced on a communicator without a Layout).
func treeLayout(l Link) Layout {
	if lay := l.Tuning().Layout; lay != nil {
		return lay
	}
	return binomialTree(l.Size())
}

// binomialTree is a Layout whose trees are the binomial trees of the
// binomial schedules; only its Tree is used.
type binomialTree int

func (b binomialTree) Ring() []int    { return nil }
func (b binomialTree) Cube() bool     { return false }
func (b binomialTree) Digest() uint64 { return 0 }

func (b binomialTree) Tree(root, rank int) (int, []int) {
	size := int(b)
	vr := mod(rank-root, size)
	abs := func(v int) int { return (v + root) % size }
	parent, mask := -1, topMask(size)
	if vr != 0 {
		parent, mask = abs(vr-lowbit(vr)), lowbit(vr)>>1
	}
	var children []int
	for ; mask > 0; mask >>= 1 {
		if vr+mask < size {
			children = append(children, abs(vr+mask))
		}
	}
	return parent, children
}
