// Package topology describes which ranks of a world talk to each other
// directly, and how a message reaches a rank that is not a neighbour. It is
// pure: no IO, no goroutines, no package-level state; a Graph is immutable
// after New and safe for concurrent use.
//
// Kinds:
//
//   - full mesh ("full"): every rank is every other rank's neighbour (the
//     default, N-1 connections per rank);
//   - k-regular ("kregular:K", K even, >= 2): a ring lattice, rank r is
//     joined to r±1 … r±K/2 (mod N), so K connections per rank; a message
//     travels at most ceil((N/2)/(K/2)) hops;
//   - hypercube ("hypercube"): rank r is joined to r XOR 2^i for every bit i
//     of ceil(log2 N) where that rank exists. A world that is not a power
//     of two is the hypercube's first N corners: some ranks lack their high
//     neighbours, yet every pair stays routable in popcount(src XOR dst)
//     hops by clearing the bits src has and dst lacks (every intermediate is
//     below src) before setting the bits dst has (every intermediate is a
//     subset of dst's bits, so at most dst): no hop leaves [0, N);
//   - on demand ("ondemand:M"): every rank may talk to every other (routing
//     is the full mesh's) and a transport keeps at most M connections open.
//
// Routing is deterministic shortest-path next hop: the same (src, dst,
// failed set) gives the same hop on every rank. Without failures it is
// closed-form per kind (never a table); with failed ranks it is a
// breadth-first search from the destination over the live ranks, so a
// route avoids every failed rank whenever the live graph still connects
// the pair.
package topology

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Kind is the shape of the neighbour graph.
type Kind uint8

// The kinds; the numbers are on the wire (membership's join message).
const (
	FullMesh  Kind = iota // every pair connected
	KRegular              // ring lattice of even degree K
	Hypercube             // XOR-neighbours, first N corners
	OnDemand              // anyone, at most M connections open
)

func (k Kind) String() string {
	switch k {
	case FullMesh:
		return "full"
	case KRegular:
		return "kregular"
	case Hypercube:
		return "hypercube"
	case OnDemand:
		return "ondemand"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Spec is a topology choice, independent of the world size. The zero value
// is the full mesh.
type Spec struct {
	Kind Kind
	// N is the degree of KRegular and the connection capacity M of
	// OnDemand; zero for the others.
	N int
}

// String is the form Parse reads ("full", "kregular:8", "hypercube",
// "ondemand:16").
func (s Spec) String() string {
	switch s.Kind {
	case KRegular, OnDemand:
		return s.Kind.String() + ":" + strconv.Itoa(s.N)
	}
	return s.Kind.String()
}

// Sparse reports whether some pairs of a world of n ranks are not
// neighbours (and messages between them are relayed).
func (s Spec) Sparse(n int) bool {
	switch s.Kind {
	case KRegular:
		return s.N < n-1
	case Hypercube:
		return n > 2
	}
	return false
}

// ErrSpec prefixes every error about a topology's text or parameters.
var ErrSpec = errors.New("topology: bad topology")

// Parse reads a topology: "full" (or ""), "kregular:K", "hypercube",
// "ondemand:M". The error names the bad value.
func Parse(text string) (Spec, error) {
	t := strings.ToLower(strings.TrimSpace(text))
	name, arg, hasArg := strings.Cut(t, ":")
	bad := func(why string) (Spec, error) {
		return Spec{}, fmt.Errorf("%w %q: %s (want full, kregular:K, hypercube or ondemand:M)", ErrSpec, text, why)
	}
	num := func() (int, error) {
		if !hasArg {
			return 0, fmt.Errorf("%s needs a number after ':'", name)
		}
		v, err := strconv.Atoi(arg)
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", arg)
		}
		return v, nil
	}
	var s Spec
	switch name {
	case "", "full", "fullmesh", "full_mesh":
		if hasArg {
			return bad("full takes no argument")
		}
		s = Spec{Kind: FullMesh}
	case "hypercube":
		if hasArg {
			return bad("hypercube takes no argument")
		}
		s = Spec{Kind: Hypercube}
	case "kregular", "k-regular", "k_regular": // k_regular: nexar-rs's spelling
		k, err := num()
		if err != nil {
			return bad(err.Error())
		}
		s = Spec{Kind: KRegular, N: k}
	case "ondemand", "on-demand", "on_demand":
		m, err := num()
		if err != nil {
			return bad(err.Error())
		}
		s = Spec{Kind: OnDemand, N: m}
	default:
		return bad("unknown kind " + strconv.Quote(name))
	}
	if err := s.check(); err != nil {
		return bad(err.Error())
	}
	return s, nil
}

// check validates the parameters that do not depend on the world size.
func (s Spec) check() error {
	switch s.Kind {
	case FullMesh, Hypercube:
		if s.N != 0 {
			return fmt.Errorf("%s takes no parameter (got %d)", s.Kind, s.N)
		}
	case KRegular:
		if s.N < 2 || s.N%2 != 0 || s.N > 1<<16 {
			return fmt.Errorf("degree %d must be even, in [2, 65536] (a ring lattice joins K/2 ranks on each side)", s.N)
		}
	case OnDemand:
		if s.N < 1 || s.N > 1<<20 {
			return fmt.Errorf("connection capacity %d must be in [1, 1048576]", s.N)
		}
	default:
		return fmt.Errorf("unknown kind %d", s.Kind)
	}
	return nil
}

// Validate reports whether s is well formed; the world size never makes a
// valid Spec invalid (a degree at or above N-1 is the full mesh).
func (s Spec) Validate() error {
	if err := s.check(); err != nil {
		return fmt.Errorf("%w %s: %v", ErrSpec, s, err)
	}
	return nil
}

// Graph is a topology laid over a world of N ranks. Immutable; safe for
// concurrent use.
type Graph struct {
	spec Spec
	n    int
	half int // KRegular: K/2 clamped so that the lattice never wraps onto itself
	dim  int // Hypercube: ceil(log2 n)
}

// New lays s over a world of n ranks (n >= 1).
func New(s Spec, n int) (*Graph, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("%w %s: world size %d must be >= 1", ErrSpec, s, n)
	}
	g := &Graph{spec: s, n: n}
	switch s.Kind {
	case KRegular:
		// A lattice whose K/2 reaches half the ring is the full mesh;
		// clamp so that r±i never names the same rank twice.
		g.half = min(s.N/2, (n-1)/2)
		if s.N >= n-1 {
			g.half = n // every rank: see IsNeighbor
		}
	case Hypercube:
		if n > 1 {
			g.dim = bits.Len(uint(n - 1))
		}
	}
	return g, nil
}

// Spec returns the topology the graph was made from.
func (g *Graph) Spec() Spec { return g.spec }

// Size returns the number of ranks N.
func (g *Graph) Size() int { return g.n }

// full reports whether every pair is a neighbour pair.
func (g *Graph) full() bool {
	switch g.spec.Kind {
	case FullMesh, OnDemand:
		return true
	case KRegular:
		return g.half >= g.n
	}
	return g.n <= 2
}

// IsNeighbor reports whether a and b talk directly (a != b, both in range).
func (g *Graph) IsNeighbor(a, b int) bool {
	if a == b || a < 0 || b < 0 || a >= g.n || b >= g.n {
		return false
	}
	if g.full() {
		return true
	}
	switch g.spec.Kind {
	case KRegular:
		d := (b - a + g.n) % g.n
		return d <= g.half || g.n-d <= g.half
	case Hypercube:
		return bits.OnesCount(uint(a^b)) == 1
	}
	return false
}

// Neighbors returns r's neighbours in ascending order (a fresh slice).
func (g *Graph) Neighbors(r int) []int {
	if r < 0 || r >= g.n {
		return nil
	}
	var out []int
	if g.full() {
		out = make([]int, 0, g.n-1)
		for p := 0; p < g.n; p++ {
			if p != r {
				out = append(out, p)
			}
		}
		return out
	}
	switch g.spec.Kind {
	case KRegular:
		for p := 0; p < g.n; p++ {
			if g.IsNeighbor(r, p) {
				out = append(out, p)
			}
		}
	case Hypercube:
		for i := 0; i < g.dim; i++ {
			if p := r ^ (1 << i); p < g.n {
				out = append(out, p)
			}
		}
		sortInts(out)
	}
	return out
}

// MaxDegree returns the largest neighbour count of any rank.
func (g *Graph) MaxDegree() int {
	if g.full() {
		return g.n - 1
	}
	if g.spec.Kind == KRegular {
		return 2 * g.half
	}
	return g.dim
}

// Diameter returns the most hops between two ranks without failures.
func (g *Graph) Diameter() int {
	if g.n <= 1 {
		return 0
	}
	if g.full() {
		return 1
	}
	if g.spec.Kind == KRegular {
		return ceilDiv(g.n/2, g.half)
	}
	// Hypercube: the most bits two ranks below n differ in.
	d := 0
	for a := 0; a < g.n; a++ {
		// a's farthest is the complement of a within dim bits when it
		// exists; otherwise a rank with as many differing bits below n.
		for _, b := range [2]int{(^a) & (1<<g.dim - 1), g.n - 1} {
			if b < g.n {
				d = max(d, bits.OnesCount(uint(a^b)))
			}
		}
	}
	return d
}

// HopLimit is the hop limit a relayed frame starts with: enough for any
// simple path, so that a route around failures is never cut short, while a
// routing loop (ranks disagreeing about failures) still ends.
func (g *Graph) HopLimit() int { return max(g.n-1, 1) }

// NextHop returns the neighbour of src that a message for dst goes to
// next, avoiding the ranks for which failed reports true (nil: none
// failed). It reports false when dst is src, out of range, failed, or
// unreachable over live ranks. A neighbour dst is its own next hop.
func (g *Graph) NextHop(src, dst int, failed func(int) bool) (int, bool) {
	if src == dst || src < 0 || dst < 0 || src >= g.n || dst >= g.n {
		return -1, false
	}
	if failed != nil && failed(dst) {
		return -1, false
	}
	if g.IsNeighbor(src, dst) {
		return dst, true
	}
	cf := g.closedForm(src, dst)
	if failed == nil {
		return cf, true
	}
	// With failures every hop follows exact live distances (a strictly
	// decreasing walk cannot loop); among equally short hops the
	// closed-form one wins, so routes change only where they must.
	dist := g.distances(dst, failed)
	if dist[src] < 0 {
		return -1, false
	}
	if !failed(cf) && dist[cf] == dist[src]-1 {
		return cf, true
	}
	for _, p := range g.Neighbors(src) {
		if !failed(p) && dist[p] == dist[src]-1 {
			return p, true
		}
	}
	return -1, false
}

// Route returns the ranks a message from src to dst visits after src,
// ending with dst, following NextHop; false when NextHop finds none.
func (g *Graph) Route(src, dst int, failed func(int) bool) ([]int, bool) {
	var path []int
	for at := src; at != dst; {
		h, ok := g.NextHop(at, dst, failed)
		if !ok || len(path) >= g.HopLimit() {
			return nil, false
		}
		path = append(path, h)
		at = h
	}
	return path, src != dst
}

// closedForm is the shortest-path next hop for a non-neighbour pair
// without failures.
func (g *Graph) closedForm(src, dst int) int {
	switch g.spec.Kind {
	case KRegular:
		fwd := (dst - src + g.n) % g.n // steps going up
		if fwd <= g.n-fwd {
			return (src + g.half) % g.n
		}
		return (src - g.half + g.n) % g.n
	case Hypercube:
		// Clear src's extra bits first (highest first, so the hop is
		// the smallest rank), then set dst's: never leaves [0, n).
		if extra := src &^ dst; extra != 0 {
			return src &^ (1 << (bits.Len(uint(extra)) - 1))
		}
		missing := dst &^ src
		return src | (1 << bits.TrailingZeros(uint(missing)))
	}
	return dst
}

// distances is the hop count from every live rank to dst over live ranks
// (-1: unreachable, or failed).
func (g *Graph) distances(dst int, failed func(int) bool) []int {
	dist := make([]int, g.n)
	for i := range dist {
		dist[i] = -1
	}
	dist[dst] = 0
	queue := make([]int, 1, g.n)
	queue[0] = dst
	for i := 0; i < len(queue); i++ {
		at := queue[i]
		g.eachNeighbor(at, func(p int) {
			if dist[p] >= 0 || (failed != nil && failed(p)) {
				return
			}
			dist[p] = dist[at] + 1
			queue = append(queue, p)
		})
	}
	return dist
}

// NextHops returns src's next hop towards every rank over the live ranks
// (failed may be nil) in one breadth-first search from src: entry dst is a
// neighbour of src on a shortest live path to dst, -1 for src itself and
// for failed or unreachable ranks. It is what NextHop gives for each dst
// without failures; with failures the hop may differ among equally short
// ones, never in length. O(N x degree), for a relay that routes to many
// destinations after a failure.
func (g *Graph) NextHops(src int, failed func(int) bool) []int {
	first := make([]int, g.n)
	for i := range first {
		first[i] = -1
	}
	if src < 0 || src >= g.n {
		return first
	}
	if failed == nil {
		for dst := range first {
			if h, ok := g.NextHop(src, dst, nil); ok {
				first[dst] = h
			}
		}
		return first
	}
	seen := make([]bool, g.n)
	seen[src] = true
	queue := make([]int, 0, g.n)
	g.eachNeighbor(src, func(p int) {
		if !failed(p) {
			seen[p], first[p] = true, p
			queue = append(queue, p)
		}
	})
	for i := 0; i < len(queue); i++ {
		at := queue[i]
		g.eachNeighbor(at, func(p int) {
			if seen[p] || failed(p) {
				return
			}
			seen[p], first[p] = true, first[at]
			queue = append(queue, p)
		})
	}
	return first
}

// eachNeighbor calls f for every neighbour of r, in ascending order for the
// full mesh and the hypercube, by ring distance for the lattice; no
// allocation.
func (g *Graph) eachNeighbor(r int, f func(int)) {
	switch {
	case g.full():
		for p := 0; p < g.n; p++ {
			if p != r {
				f(p)
			}
		}
	case g.spec.Kind == KRegular:
		for i := 1; i <= g.half; i++ {
			f((r + i) % g.n)
			if b := (r - i + g.n) % g.n; b != (r+i)%g.n {
				f(b)
			}
		}
	case g.spec.Kind == Hypercube:
		for i := 0; i < g.dim; i++ {
			if p := r ^ (1 << i); p < g.n {
				f(p)
			}
		}
	}
}

// Ring returns an order of all ranks for ring schedules: consecutive
// ranks (and the last and first) are neighbours where the graph allows.
// For the ring lattice and the full mesh it is 0..N-1; for the hypercube
// it is the reflected Gray code, whose consecutive codes differ in one bit
// (every step one hop) when N is a power of two; for other N the codes at
// or above N are skipped and the steps across a gap are relayed.
func (g *Graph) Ring() []int {
	out := make([]int, 0, g.n)
	if g.spec.Kind != Hypercube || g.full() {
		for r := 0; r < g.n; r++ {
			out = append(out, r)
		}
		return out
	}
	for i := 0; i < 1<<g.dim; i++ {
		if c := i ^ (i >> 1); c < g.n {
			out = append(out, c)
		}
	}
	return out
}

// Tree is a breadth-first spanning tree of the neighbour graph: Parent[r]
// is r's parent (-1 for the root), Children[r] its children in ascending
// order. Every edge is a neighbour pair, so a tree schedule never relays;
// its depth is the root's eccentricity.
type Tree struct {
	Root     int
	Parent   []int
	Children [][]int
	Depth    int
}

// Tree returns the breadth-first tree rooted at root over the live ranks
// (failed may be nil); ranks unreachable from the root have Parent -2.
func (g *Graph) Tree(root int, failed func(int) bool) Tree {
	t := Tree{Root: root, Parent: make([]int, g.n), Children: make([][]int, g.n)}
	for i := range t.Parent {
		t.Parent[i] = -2
	}
	if root < 0 || root >= g.n {
		return t
	}
	t.Parent[root] = -1
	level := []int{root}
	for len(level) > 0 {
		var next []int
		for _, at := range level {
			for _, p := range g.Neighbors(at) {
				if t.Parent[p] != -2 || (failed != nil && failed(p)) {
					continue
				}
				t.Parent[p] = at
				t.Children[at] = append(t.Children[at], p)
				next = append(next, p)
			}
		}
		if len(next) > 0 {
			t.Depth++
		}
		level = next
	}
	return t
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func sortInts(s []int) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
