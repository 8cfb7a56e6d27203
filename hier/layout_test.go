package hier

import (
	"reflect"
	"testing"
)

func TestLayout(t *testing.T) {
	tests := []struct {
		name    string
		keys    []string
		hosts   [][]int
		local   []int
		pieces  int
		owned   map[[2]int][]int // (host, local) → pieces
		blocks  [][]int          // by piece
		nativeN map[int][]bool   // n → Native by host
	}{
		{
			name: "3+1 interleaved", keys: []string{"a", "b", "a", "a"},
			hosts: [][]int{{0, 2, 3}, {1}}, local: []int{0, 0, 1, 2}, pieces: 3,
			owned:   map[[2]int][]int{{0, 0}: {0}, {0, 1}: {1}, {0, 2}: {2}, {1, 0}: {0, 1, 2}},
			blocks:  [][]int{{0, 1}, {2}, {3}},
			nativeN: map[int][]bool{9: {true, false}, 7: {false, false}},
		},
		{
			name: "2+2 alternating", keys: []string{"x", "y", "x", "y"},
			hosts: [][]int{{0, 2}, {1, 3}}, local: []int{0, 0, 1, 1}, pieces: 2,
			owned:   map[[2]int][]int{{0, 0}: {0}, {0, 1}: {1}, {1, 0}: {0}, {1, 1}: {1}},
			blocks:  [][]int{{0, 1}, {2, 3}},
			nativeN: map[int][]bool{4: {true, true}, 5: {false, false}},
		},
		{
			name: "one host", keys: []string{"h", "h", "h"},
			hosts: [][]int{{0, 1, 2}}, local: []int{0, 1, 2}, pieces: 3,
			owned:  map[[2]int][]int{{0, 0}: {0}, {0, 1}: {1}, {0, 2}: {2}},
			blocks: [][]int{{0}, {1}, {2}},
		},
		{
			name: "2+3+1", keys: []string{"b", "a", "b", "b", "c", "a"},
			hosts: [][]int{{0, 2, 3}, {1, 5}, {4}}, local: []int{0, 0, 1, 2, 0, 1}, pieces: 3,
			owned:  map[[2]int][]int{{1, 0}: {0, 2}, {1, 1}: {1}, {2, 0}: {0, 1, 2}},
			blocks: [][]int{{0, 1, 4}, {2, 5}, {3}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLayout(tt.keys)
			if !reflect.DeepEqual(l.Hosts, tt.hosts) || !reflect.DeepEqual(l.LocalOf, tt.local) || l.Pieces != tt.pieces {
				t.Fatalf("layout %+v", l)
			}
			for r := range tt.keys {
				if l.Hosts[l.HostOf[r]][l.LocalOf[r]] != r {
					t.Errorf("rank %d: HostOf/LocalOf disagree with Hosts", r)
				}
			}
			for k, want := range tt.owned {
				if got := l.Owned(k[0], k[1]); !reflect.DeepEqual(got, want) {
					t.Errorf("Owned%v = %v, want %v", k, got, want)
				}
			}
			// Every piece has exactly one owner per host, and Owner agrees.
			for h := range l.Hosts {
				for p := 0; p < l.Pieces; p++ {
					n := 0
					for li := range l.Hosts[h] {
						for _, q := range l.Owned(h, li) {
							if q == p {
								n++
								if l.Owner(h, p) != li {
									t.Errorf("Owner(%d, %d) = %d, Owned says %d", h, p, l.Owner(h, p), li)
								}
							}
						}
					}
					if n != 1 {
						t.Errorf("host %d: piece %d has %d owners", h, p, n)
					}
				}
			}
			for p, want := range tt.blocks {
				if got := l.Blocks(p); !reflect.DeepEqual(got, want) {
					t.Errorf("Blocks(%d) = %v, want %v", p, got, want)
				}
			}
			for n, want := range tt.nativeN {
				for h := range l.Hosts {
					if l.Native(h, n) != want[h] {
						t.Errorf("Native(%d, %d) = %v", h, n, !want[h])
					}
				}
			}
		})
	}
}

func TestSpan(t *testing.T) {
	for _, n := range []int{0, 1, 2, 7, 8, 1001} {
		for _, parts := range []int{1, 2, 3, 8} {
			end := 0
			for p := 0; p < parts; p++ {
				off, ln := Span(n, parts, p)
				if off != end || ln < n/parts || ln > n/parts+1 {
					t.Fatalf("Span(%d, %d, %d) = %d, %d after %d", n, parts, p, off, ln, end)
				}
				end = off + ln
			}
			if end != n {
				t.Fatalf("Span(%d, %d, ·) covers %d elements", n, parts, end)
			}
		}
	}
	if off, ln := Span(9, 3, 1); off != 3 || ln != 3 {
		t.Fatalf("equal pieces: Span(9, 3, 1) = %d, %d", off, ln)
	}
}
