package collective

import (
	"context"
	"fmt"
	"sync"
)

// HostMap says which host each rank of a Link runs on (Tuning.Hosts), so
// that a collective can cross the link between hosts the least number of
// times: the two-level allreduce (AlgoHier) reduces inside each host over
// its local paths (shared memory), allreduces between hosts only the
// block each local rank owns, and gathers the blocks inside each host
// again. With H hosts of L ranks each, the bytes that leave a host per
// allreduce of S bytes are 2(H-1)/H·S, the least any schedule sends; the
// flat ring in rank order sends L times that when the hosts' ranks are
// contiguous (each of a host's ring edges carries 2(n-1)/n·S, and a ring
// crosses between hosts at least H times).
//
// A HostMap is immutable after NewHostMap (its pool of per-call sub-links
// aside) and safe for concurrent use; rank numbers are the Link's.
type HostMap struct {
	of     []int   // rank -> host index (0..hosts-1, by first rank)
	groups [][]int // host index -> its ranks, ascending
	ring   []int   // the groups one after the other: the flat ring's order
	digest uint64

	// leaderSets holds *leaderSet for reuse: leaderAllreduce is the small
	// allreduce, often called once per step, and a garbage collection
	// cycle costs ranks that share cores a slow call each.
	leaderSets sync.Pool
}

// NewHostMap builds the map from each rank's host key (any string that is
// equal for ranks on one host and different otherwise). Hosts are numbered
// in the order of their lowest rank, so every rank builds the same map
// from the same keys.
func NewHostMap(keys []string) *HostMap {
	h := &HostMap{of: make([]int, len(keys))}
	idx := make(map[string]int, len(keys))
	d := uint64(14695981039346656037)
	for r, k := range keys {
		i, ok := idx[k]
		if !ok {
			i = len(h.groups)
			idx[k] = i
			h.groups = append(h.groups, nil)
		}
		h.of[r] = i
		h.groups[i] = append(h.groups[i], r)
		d ^= uint64(i) + 1
		d *= 1099511628211
	}
	h.digest = d
	for _, g := range h.groups {
		h.ring = append(h.ring, g...)
	}
	return h
}

// chain is the order of a broadcast chain from root that crosses between
// hosts once per other host: root's host first, from root, then each
// other host's ranks in a row.
func (h *HostMap) chain(root int) []int {
	out := make([]int, 0, len(h.of))
	out = append(out, root)
	for _, r := range h.groups[h.of[root]] {
		if r != root {
			out = append(out, r)
		}
	}
	for i, g := range h.groups {
		if i != h.of[root] {
			out = append(out, g...)
		}
	}
	return out
}

// Ranks returns the ranks of host i, ascending (a copy).
func (h *HostMap) Ranks(i int) []int { return append([]int(nil), h.groups[i]...) }

// Size is the number of ranks the map covers.
func (h *HostMap) Size() int { return len(h.of) }

// Hosts is the number of distinct hosts.
func (h *HostMap) Hosts() int { return len(h.groups) }

// Of returns the host index of rank r.
func (h *HostMap) Of(r int) int { return h.of[r] }

// Digest identifies the grouping (not the keys): two maps that group the
// ranks alike have equal digests.
func (h *HostMap) Digest() uint64 { return h.digest }

// String is the grouping, e.g. "2 hosts x 2 ranks" or "3 hosts (1-4 ranks)".
func (h *HostMap) String() string {
	if l, ok := h.uniform(); ok {
		return fmt.Sprintf("%d hosts x %d ranks", len(h.groups), l)
	}
	lo, hi := len(h.of), 0
	for _, g := range h.groups {
		lo, hi = min(lo, len(g)), max(hi, len(g))
	}
	return fmt.Sprintf("%d hosts (%d-%d ranks)", len(h.groups), lo, hi)
}

// uniform returns the ranks per host when every host has the same number.
func (h *HostMap) uniform() (int, bool) {
	if len(h.groups) == 0 {
		return 0, false
	}
	l := len(h.groups[0])
	for _, g := range h.groups[1:] {
		if len(g) != l {
			return 0, false
		}
	}
	return l, true
}

// twoLevel reports whether the two-level schedules apply to l: a HostMap
// of l's size with at least two hosts, every host running the same number
// (at least two) of l's ranks. Hosts with unequal rank counts keep the
// flat schedules (a block per local rank would not line up across hosts).
func twoLevel(l Link) (*HostMap, bool) {
	h := l.Tuning().Hosts
	if h == nil || h.Size() != l.Size() || h.Hosts() < 2 {
		return nil, false
	}
	if n, ok := h.uniform(); !ok || n < 2 {
		return nil, false
	}
	return h, true
}

// leaderHosts reports whether the leader schedules apply to l: a HostMap
// of l's size with at least two hosts, one of them running two or more of
// l's ranks (with one rank per host they are the flat schedules).
func leaderHosts(l Link) (*HostMap, bool) {
	h := l.Tuning().Hosts
	if h == nil || h.Size() != l.Size() || h.Hosts() < 2 || h.Hosts() == l.Size() {
		return nil, false
	}
	return h, true
}

// place returns the ranks on rank's host and rank's index among them.
func (h *HostMap) place(rank int) (mine []int, li int) {
	mine = h.groups[h.of[rank]]
	for i, r := range mine {
		if r == rank {
			li = i
		}
	}
	return mine, li
}

// levels returns rank's two sub-links: the ranks on its host, and the
// ranks at its position (local index) on every host, by host index.
func (h *HostMap) levels(l Link) (local, across *subLink) {
	rank := l.Rank()
	mine, li := h.place(rank)
	peers := make([]int, len(h.groups))
	for i, g := range h.groups {
		peers[i] = g[li]
	}
	return newSubLink(l, mine, li), newSubLink(l, peers, h.of[rank])
}

// hierAllreduce is the two-level allreduce: a ring reduce-scatter among
// the L ranks of each host leaves local rank i the host's sum of block i;
// the ranks at position i on every host allreduce that block between
// hosts (Allreduce over them: their own size decides the schedule); a ring
// allgather inside each host completes every rank's result. Every element
// is combined by one expression tree (its host sums in local ring order,
// then the hosts' sums in the between-host schedule's order), so all ranks
// get the same bits. The local and between-host peers are disjoint, so
// their step counters cannot collide.
func hierAllreduce(ctx context.Context, l Link, h *HostMap, in, recv []byte, dt DType, op Op) error {
	local, across := h.levels(l)
	var st steps
	st.init(local)
	es := dt.Size()
	blocks := balanced(recv, local.Size(), es)
	mine := blocks[local.Rank()]
	if err := st.ringReduceScatter(ctx, local, balanced(in, local.Size(), es), mine, dt, redOp(op)); err != nil {
		return err
	}
	if err := Allreduce(ctx, across, nil, mine, dt, redOp(op)); err != nil {
		return err
	}
	if op == Avg {
		FinishAvg(mine, dt, l.Size())
	}
	return st.ringAllgather(ctx, local, blocks)
}

// subLink is a Link over some of another Link's ranks: rank i of the
// subLink is rank members[i] of the parent. It carries the parent's tuning
// without Layout and Hosts (both are about the parent's ranks) and passes
// the parent's extensions through, mapping ranks.
type subLink struct {
	parent  Link
	members []int
	rank    int
	tuning  Tuning
}

func newSubLink(parent Link, members []int, rank int) *subLink {
	s := &subLink{members: members, rank: rank}
	s.over(parent)
	return s
}

// over makes s a sub-link of parent: its tuning parent's without the
// Layout, HostMap and forced algorithms, which name parent's ranks.
func (s *subLink) over(parent Link) {
	s.parent = parent
	s.tuning = *parent.Tuning()
	s.tuning.Layout, s.tuning.Hosts = nil, nil
	s.tuning.Force = Forced{}
}

func (s *subLink) Rank() int             { return s.rank }
func (s *subLink) Size() int             { return len(s.members) }
func (s *subLink) Tuning() *Tuning       { return &s.tuning }
func (s *subLink) Scratch() *ScratchPool { return scratchOf(s.parent) }

func (s *subLink) Send(ctx context.Context, peer int, step uint32, data []byte) error {
	return s.parent.Send(ctx, s.members[peer], step, data)
}

func (s *subLink) Recv(ctx context.Context, peer int, step uint32, buf []byte) error {
	return s.parent.Recv(ctx, s.members[peer], step, buf)
}

func (s *subLink) Stream(peer int) bool { return streams(s.parent, s.members[peer]) }

func (s *subLink) Exchange(ctx context.Context, to int, sbase uint32, data []byte, from int, rbase uint32, buf []byte, chunk int) error {
	to, from = s.members[to], s.members[from]
	if x, ok := s.parent.(Exchanger); ok {
		return x.Exchange(ctx, to, sbase, data, from, rbase, buf, chunk)
	}
	return exchangeChunks(ctx, s.parent, to, sbase, data, from, rbase, buf, chunk)
}

func (s *subLink) Post(ctx context.Context, peer int, step uint32, buf []byte) (func() error, error) {
	w, err := post(ctx, s.parent, s.members[peer], step, [][]byte{buf})
	if err != nil {
		return nil, err
	}
	return w[0], nil
}

// hostsDesc describes l's HostMap for an error.
func hostsDesc(l Link) string {
	h := l.Tuning().Hosts
	if h == nil {
		return "none"
	}
	if h.Size() != l.Size() {
		return fmt.Sprintf("a map of %d ranks for %d", h.Size(), l.Size())
	}
	return h.String()
}

// byPosition copies the rank-ordered blocks of src (blk bytes each) to dst
// ordered by local position, then host: dst's super-block j holds the
// blocks of the ranks at position j on hosts 0, 1, ... With toRanks, the
// other way round.
func (h *HostMap) byPosition(dst, src []byte, blk int, toRanks bool) {
	nh := len(h.groups)
	for hi, g := range h.groups {
		for j, r := range g {
			p := (j*nh + hi) * blk
			if toRanks {
				copy(dst[r*blk:(r+1)*blk], src[p:p+blk])
			} else {
				copy(dst[p:p+blk], src[r*blk:(r+1)*blk])
			}
		}
	}
}

// hierReduceScatter is the two-level reduce-scatter of send (a block of
// len(recv) bytes per rank): with the blocks regrouped by the local
// position of the rank they are for, a ring reduce-scatter inside each
// host leaves local rank j its host's sums of the blocks of every host's
// position-j rank; a reduce-scatter between the ranks at position j then
// leaves each its own block. Each host sends the others (H-1)/H of the
// data once, the least.
func hierReduceScatter(ctx context.Context, l Link, h *HostMap, send, recv []byte, dt DType, op Op) error {
	local, across := h.levels(l)
	blk := len(recv)
	tmp := scratchOf(l).Get(len(send))
	defer scratchOf(l).Put(tmp)
	h.byPosition(tmp, send, blk, false)
	supers := eqblocks(tmp, local.Size(), across.Size()*blk)
	mine := supers[local.Rank()]
	var st steps
	st.init(local)
	if err := st.ringReduceScatter(ctx, local, supers, mine, dt, redOp(op)); err != nil {
		return err
	}
	if err := ReduceScatter(ctx, across, mine, recv, dt, redOp(op)); err != nil {
		return err
	}
	if op == Avg {
		FinishAvg(recv, dt, l.Size())
	}
	return nil
}

// hierAllgather is the two-level allgather of recv's rank-ordered blocks
// (this rank's filled): the ranks at each local position allgather theirs
// between hosts, then each host's ranks allgather what their positions
// gathered, and the blocks go back to rank order.
func hierAllgather(ctx context.Context, l Link, h *HostMap, recv []byte, blk int) error {
	local, across := h.levels(l)
	rank := l.Rank()
	tmp := scratchOf(l).Get(len(recv))
	defer scratchOf(l).Put(tmp)
	supers := eqblocks(tmp, local.Size(), across.Size()*blk)
	if err := Allgather(ctx, across, recv[rank*blk:(rank+1)*blk], supers[local.Rank()]); err != nil {
		return err
	}
	var st steps
	st.init(local)
	if err := st.ringAllgather(ctx, local, supers); err != nil {
		return err
	}
	h.byPosition(recv, tmp, blk, true)
	return nil
}

// leaderSet is one rank's sub-links for the leader schedules: the ranks
// on its host (the first, its leader, at 0), and, on a leader, the leaders
// of every host by host index; and its place in the binomial tree of its
// host, rooted at the leader.
type leaderSet struct {
	rank           int // of the parent Link
	local, leaders subLink
	leader         bool
	parent         int // in local, -1 at the leader
	children       []int
}

// leaderLinks returns rank l.Rank()'s leaderSet over l, from h's pool
// where one was made for that rank before (give it back with
// putLeaderLinks once nothing refers to it).
func (h *HostMap) leaderLinks(l Link) *leaderSet {
	rank := l.Rank()
	s, _ := h.leaderSets.Get().(*leaderSet)
	if s == nil || s.rank != rank {
		mine, li := h.place(rank)
		s = &leaderSet{rank: rank, leader: li == 0}
		s.local.members, s.local.rank = mine, li
		s.parent, s.children = binomialTree(len(mine)).Tree(0, li)
		if s.leader {
			heads := make([]int, len(h.groups))
			for i, g := range h.groups {
				heads[i] = g[0]
			}
			s.leaders.members, s.leaders.rank = heads, h.of[rank]
		}
	}
	s.local.over(l)
	if s.leader {
		s.leaders.over(l)
	}
	return s
}

// putLeaderLinks gives s back for reuse; it drops the parent Link.
func (h *HostMap) putLeaderLinks(s *leaderSet) {
	s.local.parent, s.leaders.parent = nil, nil
	h.leaderSets.Put(s)
}

// leaderAllreduce is the small-message two-level allreduce (Open MPI
// HAN's): each host reduces to its leader over a binomial tree, the
// leaders allreduce by recursive doubling, and each leader broadcasts the
// result back over the tree. Only one rank per host crosses the link, once
// each way per between-host step, and the others wait off the CPU; every
// rank gets its leader's bits, which every leader computed alike. It
// allocates nothing once its sub-links are in h's pool.
func leaderAllreduce(ctx context.Context, l Link, h *HostMap, recv []byte, dt DType, op Op) error {
	s := h.leaderLinks(l)
	var st steps
	st.init(&s.local)
	if err := st.treeReduceAt(ctx, &s.local, s.parent, s.children, recv, dt, redOp(op)); err != nil {
		return err
	}
	if s.leader {
		var sl steps
		sl.init(&s.leaders)
		if err := sl.recursiveDoubling(ctx, &s.leaders, s.leaders.rank, s.leaders.Size(), recv, dt, redOp(op)); err != nil {
			return err
		}
		if op == Avg {
			FinishAvg(recv, dt, l.Size())
		}
	}
	if err := st.treeBroadcastAt(ctx, &s.local, s.parent, s.children, recv); err != nil {
		return err
	}
	// Only after success: a failed step may leave a send or receive of
	// the sub-links' still running.
	h.putLeaderLinks(s)
	return nil
}

// hierAlltoall is the two-level all-to-all on hosts of L ranks each: an
// all-to-all inside each host regroups every rank's blocks by the local
// position of their destination (local rank j gets its host's blocks for
// the position-j rank of every host), then the ranks at each position
// exchange between hosts, one message per other host carrying its host's
// L blocks for that host's rank at the position. Each block crosses
// between hosts once, as in the flat schedules, but in (H-1) messages per
// rank instead of (H-1)·L. send == nil: in place (the blocks are in recv).
//
// Taken only when forced (Tuning.Force.Alltoall): between two network
// namespaces of 2 ranks each (nexar bench, 2026-12-05) it took 83, 191 and
// 2327 µs at 4 KiB, 64 KiB and 1 MiB per rank where the pairwise exchange
// took 70, 124 and 1095; fewer, larger messages pay where hosts run many
// ranks each, which was not measured here.
func hierAlltoall(ctx context.Context, l Link, h *HostMap, send, recv []byte, blk int) error {
	local, across := h.levels(l)
	nl, nh := local.Size(), across.Size()
	in := send
	if in == nil {
		in = recv
	}
	sp := scratchOf(l)
	a, b := sp.Get(nl*nh*blk), sp.Get(nl*nh*blk)
	defer sp.Put(a)
	defer sp.Put(b)
	// a, super-block j: the blocks for the position-j rank of hosts 0..H-1.
	for j := range nl {
		for hi, g := range h.groups {
			d := g[j]
			copy(a[(j*nh+hi)*blk:(j*nh+hi+1)*blk], in[d*blk:(d+1)*blk])
		}
	}
	if err := Alltoall(ctx, local, a, b); err != nil {
		return err
	}
	// b, super-block i: local rank i's blocks for the rank at this rank's
	// position on hosts 0..H-1. a, super-block hi: those for host hi, by
	// local rank.
	for hi := range nh {
		for i := range nl {
			copy(a[(hi*nl+i)*blk:(hi*nl+i+1)*blk], b[(i*nh+hi)*blk:(i*nh+hi+1)*blk])
		}
	}
	if err := Alltoall(ctx, across, a, b); err != nil {
		return err
	}
	// b, super-block hi: host hi's blocks for this rank, by local rank.
	for hi, g := range h.groups {
		for i, src := range g {
			copy(recv[src*blk:(src+1)*blk], b[(hi*nl+i)*blk:(hi*nl+i+1)*blk])
		}
	}
	return nil
}
