package topology

import (
	"errors"
	"math/bits"
	"strings"
	"testing"
)

func specs() []Spec {
	return []Spec{{Kind: FullMesh}, {Kind: KRegular, N: 2}, {Kind: KRegular, N: 4}, {Kind: KRegular, N: 8},
		{Kind: Hypercube}, {Kind: OnDemand, N: 4}}
}

func TestParse(t *testing.T) {
	good := map[string]Spec{
		"": {}, "full": {}, "FULL": {}, "kregular:8": {Kind: KRegular, N: 8}, "hypercube": {Kind: Hypercube},
		"ondemand:16": {Kind: OnDemand, N: 16}, " kregular:2 ": {Kind: KRegular, N: 2},
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("Parse(%q.String()=%q) = %v, %v", in, got.String(), again, err)
		}
	}
	for _, in := range []string{"ring", "kregular", "kregular:3", "kregular:0", "kregular:x", "hypercube:2", "full:1", "ondemand", "ondemand:0", "ondemand:-1"} {
		_, err := Parse(in)
		if err == nil || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "\""+in+"\"") {
			t.Errorf("Parse(%q) = %v; want an ErrSpec naming the value", in, err)
		}
	}
}

// bfs is an independent all-pairs distance check (plain BFS over
// IsNeighbor, not over the package's own Neighbors).
func bfs(g *Graph, src int, failed map[int]bool) []int {
	d := make([]int, g.Size())
	for i := range d {
		d[i] = -1
	}
	d[src] = 0
	q := []int{src}
	for len(q) > 0 {
		a := q[0]
		q = q[1:]
		for b := 0; b < g.Size(); b++ {
			if d[b] < 0 && !failed[b] && g.IsNeighbor(a, b) {
				d[b] = d[a] + 1
				q = append(q, b)
			}
		}
	}
	return d
}

func TestNeighborsSymmetricAndDegree(t *testing.T) {
	for n := 1; n <= 64; n++ {
		for _, s := range specs() {
			g, err := New(s, n)
			if err != nil {
				t.Fatal(err)
			}
			for a := 0; a < n; a++ {
				nb := g.Neighbors(a)
				if len(nb) > g.MaxDegree() {
					t.Fatalf("%s n=%d: rank %d has %d neighbours > max degree %d", s, n, a, len(nb), g.MaxDegree())
				}
				seen := map[int]bool{}
				for i, b := range nb {
					if b == a || seen[b] || !g.IsNeighbor(b, a) || (i > 0 && nb[i-1] >= b) {
						t.Fatalf("%s n=%d: neighbours of %d = %v: self, duplicate, asymmetric or unsorted at %d", s, n, a, nb, b)
					}
					seen[b] = true
				}
				for b := 0; b < n; b++ {
					if g.IsNeighbor(a, b) != seen[b] {
						t.Fatalf("%s n=%d: IsNeighbor(%d,%d) disagrees with Neighbors", s, n, a, b)
					}
				}
			}
			switch s.Kind {
			case KRegular:
				if n > s.N+1 && g.MaxDegree() != s.N {
					t.Fatalf("kregular:%d n=%d: degree %d", s.N, n, g.MaxDegree())
				}
			case Hypercube:
				if n > 1 && g.MaxDegree() != bits.Len(uint(n-1)) {
					t.Fatalf("hypercube n=%d: degree %d", n, g.MaxDegree())
				}
			}
		}
	}
}

// Every pair routable for world 2-64, on shortest paths within the diameter.
func TestEveryPairRoutableShortest(t *testing.T) {
	for n := 2; n <= 64; n++ {
		for _, s := range specs() {
			g, _ := New(s, n)
			diam := 0
			for src := 0; src < n; src++ {
				d := bfs(g, src, nil)
				for dst := 0; dst < n; dst++ {
					if dst == src {
						if _, ok := g.NextHop(src, dst, nil); ok {
							t.Fatalf("%s n=%d: NextHop to self", s, n)
						}
						continue
					}
					if h := g.NextHops(src, nil)[dst]; h != path0(g, src, dst) {
						t.Fatalf("%s n=%d: NextHops(%d)[%d] = %d, NextHop says %d", s, n, src, dst, h, path0(g, src, dst))
					}
					path, ok := g.Route(src, dst, nil)
					if !ok {
						t.Fatalf("%s n=%d: %d->%d unroutable", s, n, src, dst)
					}
					if len(path) != d[dst] {
						t.Fatalf("%s n=%d: %d->%d route %v has %d hops, shortest is %d", s, n, src, dst, path, len(path), d[dst])
					}
					prev := src
					for _, h := range path {
						if !g.IsNeighbor(prev, h) || h < 0 || h >= n {
							t.Fatalf("%s n=%d: %d->%d route %v: %d->%d is not an edge", s, n, src, dst, path, prev, h)
						}
						prev = h
					}
					diam = max(diam, len(path))
				}
			}
			if diam != g.Diameter() {
				t.Fatalf("%s n=%d: measured diameter %d, Diameter() %d", s, n, diam, g.Diameter())
			}
			if s.Kind == KRegular && n > 2 && diam > (n/2+s.N/2-1)/(s.N/2) {
				t.Fatalf("kregular:%d n=%d: diameter %d over the bound", s.N, n, diam)
			}
			if s.Kind == Hypercube && diam > bits.Len(uint(n-1)) {
				t.Fatalf("hypercube n=%d: diameter %d over log2", n, diam)
			}
		}
	}
}

// Routes avoid failed ranks whenever the live graph connects the pair,
// stay shortest over the live graph, and report false when it does not.
func TestRoutesAvoidFailed(t *testing.T) {
	for n := 3; n <= 40; n++ {
		for _, s := range specs() {
			g, _ := New(s, n)
			for _, fs := range [][]int{{1}, {n / 2}, {1, 2}, {0, n - 1, n / 3}} {
				failed := map[int]bool{}
				for _, f := range fs {
					failed[f] = true
				}
				isFailed := func(r int) bool { return failed[r] }
				for src := 0; src < n; src++ {
					if failed[src] {
						continue
					}
					d := bfs(g, src, failed)
					for dst := 0; dst < n; dst++ {
						if dst == src {
							continue
						}
						if h := g.NextHops(src, isFailed)[dst]; (h < 0) != (failed[dst] || d[dst] < 0) || (h >= 0 && (failed[h] || !g.IsNeighbor(src, h) || (h != dst && bfs(g, h, failed)[dst] != d[dst]-1))) {
							t.Fatalf("%s n=%d failed=%v: NextHops(%d)[%d] = %d is not on a shortest live path", s, n, fs, src, dst, h)
						}
						path, ok := g.Route(src, dst, isFailed)
						if failed[dst] || d[dst] < 0 {
							if ok {
								t.Fatalf("%s n=%d failed=%v: %d->%d routed %v to a failed or cut-off rank", s, n, fs, src, dst, path)
							}
							continue
						}
						if !ok || len(path) != d[dst] {
							t.Fatalf("%s n=%d failed=%v: %d->%d route %v ok=%v, live shortest %d", s, n, fs, src, dst, path, ok, d[dst])
						}
						for _, h := range path {
							if failed[h] {
								t.Fatalf("%s n=%d failed=%v: %d->%d route %v crosses a failed rank", s, n, fs, src, dst, path)
							}
						}
					}
				}
			}
		}
	}
}

func TestRingAndTree(t *testing.T) {
	for n := 1; n <= 64; n++ {
		for _, s := range specs() {
			g, _ := New(s, n)
			ring := g.Ring()
			seen := map[int]bool{}
			for _, r := range ring {
				if r < 0 || r >= n || seen[r] {
					t.Fatalf("%s n=%d: ring %v is not a permutation", s, n, ring)
				}
				seen[r] = true
			}
			if len(ring) != n {
				t.Fatalf("%s n=%d: ring has %d ranks", s, n, len(ring))
			}
			pow2 := n&(n-1) == 0
			if n > 1 && (s.Kind != Hypercube || pow2) {
				for i := range ring {
					a, b := ring[i], ring[(i+1)%n]
					if !g.IsNeighbor(a, b) {
						t.Fatalf("%s n=%d: ring step %d->%d is not an edge", s, n, a, b)
					}
				}
			}
			for _, root := range []int{0, n - 1} {
				tr := g.Tree(root, nil)
				count := 0
				for r := 0; r < n; r++ {
					p := tr.Parent[r]
					switch {
					case r == root && p != -1, r != root && (p < 0 || !g.IsNeighbor(r, p)):
						t.Fatalf("%s n=%d root %d: parent of %d is %d", s, n, root, r, p)
					}
					count += len(tr.Children[r])
				}
				if count != n-1 {
					t.Fatalf("%s n=%d: tree has %d edges", s, n, count)
				}
				if tr.Depth != max(bfsMax(bfs(g, root, nil)), 0) {
					t.Fatalf("%s n=%d: tree depth %d", s, n, tr.Depth)
				}
			}
		}
	}
}

func bfsMax(d []int) int {
	m := 0
	for _, v := range d {
		m = max(m, v)
	}
	return m
}

func TestSparse(t *testing.T) {
	cases := []struct {
		s    Spec
		n    int
		want bool
	}{{Spec{}, 64, false}, {Spec{Kind: KRegular, N: 8}, 9, false}, {Spec{Kind: KRegular, N: 8}, 10, true},
		{Spec{Kind: Hypercube}, 2, false}, {Spec{Kind: Hypercube}, 3, true}, {Spec{Kind: OnDemand, N: 2}, 64, false}}
	for _, c := range cases {
		g, _ := New(c.s, c.n)
		full := true
		for a := 0; a < c.n; a++ {
			full = full && len(g.Neighbors(a)) == c.n-1
		}
		if c.s.Sparse(c.n) != c.want || full == c.want {
			t.Errorf("%s n=%d: Sparse=%v, every pair neighbours=%v", c.s, c.n, c.s.Sparse(c.n), full)
		}
	}
}

func path0(g *Graph, src, dst int) int {
	h, ok := g.NextHop(src, dst, nil)
	if !ok {
		return -1
	}
	return h
}
