package hier

import "github.com/nexar-go/nexar/collective"

// Layout is where the ranks of a communicator live, and how a buffer is cut
// into pieces that cross between hosts. It is pure: no IO, no state.
//
// Hosts are numbered in the order of their lowest rank, and the ranks of a
// host (its local ranks) in ascending order, so ranks need not be placed in
// contiguous blocks and hosts may hold different numbers of ranks. A buffer
// is cut into Pieces pieces (the rank count of the largest host); on host h
// with L ranks, piece p belongs to local rank p mod L. Every local rank owns
// at least one piece, so every one of them carries data between hosts, and
// piece p's owners (one per host) form the piece's cross-host group. On
// hosts of equal size, piece p's group is the ranks of local index p.
type Layout struct {
	Hosts   [][]int // the ranks of each host, ascending
	HostOf  []int   // rank → host
	LocalOf []int   // rank → local index on its host
	Pieces  int     // the rank count of the largest host
}

// NewLayout groups ranks by host: keys[r] is rank r's host identity. The
// grouping is collective.NewHostMap's, so that the device schedules and the
// host ones number hosts alike.
func NewLayout(keys []string) Layout {
	h := collective.NewHostMap(keys)
	l := Layout{Hosts: make([][]int, h.Hosts()), HostOf: make([]int, len(keys)), LocalOf: make([]int, len(keys))}
	for i := range l.Hosts {
		l.Hosts[i] = h.Ranks(i)
		l.Pieces = max(l.Pieces, len(l.Hosts[i]))
		for li, r := range l.Hosts[i] {
			l.HostOf[r], l.LocalOf[r] = i, li
		}
	}
	return l
}

// Owner is the local index that owns piece p on host h.
func (l Layout) Owner(h, p int) int { return p % len(l.Hosts[h]) }

// Owned lists the pieces that local index li of host h owns.
func (l Layout) Owned(h, li int) []int {
	var ps []int
	for p := li; p < l.Pieces; p += len(l.Hosts[h]) {
		ps = append(ps, p)
	}
	return ps
}

// Native reports whether host h may use NCCL's own reduce-scatter and
// allgather for a buffer of n elements: its local rank i owns exactly piece
// i, and the pieces are equal.
func (l Layout) Native(h, n int) bool { return len(l.Hosts[h]) == l.Pieces && n%l.Pieces == 0 }

// Blocks lists the ranks of local index p (one per host that has one), in
// host order: the ranks whose blocks of an allgather or reduce-scatter
// cross between hosts in piece p's group.
func (l Layout) Blocks(p int) []int {
	var rs []int
	for _, ranks := range l.Hosts {
		if p < len(ranks) {
			rs = append(rs, ranks[p])
		}
	}
	return rs
}

// Span is piece p of n elements cut into parts: its offset and length. The
// first n mod parts pieces are one element longer.
func Span(n, parts, p int) (off, length int) {
	q, rem := n/parts, n%parts
	off = p*q + min(p, rem)
	length = q
	if p < rem {
		length++
	}
	return off, length
}
