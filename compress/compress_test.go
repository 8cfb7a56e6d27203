package compress

import (
	"math"
	"math/rand"
	"sort"
	"testing"
)

func TestK(t *testing.T) {
	cases := []struct {
		n     int
		ratio float64
		want  int
	}{{0, 0.5, 0}, {1, 0.01, 1}, {10, 0.01, 1}, {10, 0.25, 3}, {100, 0.01, 1}, {1000, 0.01, 10}, {7, 1, 7}}
	for _, c := range cases {
		if got := K(c.n, c.ratio); got != c.want {
			t.Errorf("K(%d, %v) = %d, want %d", c.n, c.ratio, got, c.want)
		}
	}
	for _, r := range []float64{0, -1, 1.5, math.NaN()} {
		if CheckRatio(r) == nil {
			t.Errorf("CheckRatio(%v) accepted", r)
		}
	}
}

// topkRef is TopKIndices by a full sort.
func topkRef(x []float32, k int) []uint32 {
	idx := make([]uint32, len(x))
	for i := range idx {
		idx[i] = uint32(i)
	}
	sort.SliceStable(idx, func(a, b int) bool { return mag(x[idx[a]]) > mag(x[idx[b]]) })
	idx = idx[:k]
	sort.Slice(idx, func(a, b int) bool { return idx[a] < idx[b] })
	return idx
}

func TestTopKIndices(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, n := range []int{0, 1, 2, 5, 33, 1000} {
		for _, k := range []int{0, 1, n / 3, n - 1, n} {
			if k < 0 || k > n {
				continue
			}
			x := make([]float32, n)
			for i := range x {
				// few distinct magnitudes: many ties, both signs
				x[i] = float32(rng.Intn(7)-3) * 0.5
			}
			if n > 3 {
				x[2] = float32(math.NaN())
			}
			got, want := TopKIndices(x, k), topkRef(x, k)
			if len(got) != len(want) {
				t.Fatalf("n=%d k=%d: %d indices, want %d", n, k, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("n=%d k=%d: got %v, want %v (x=%v)", n, k, got, want, x)
				}
			}
		}
	}
}

func TestRandomIndices(t *testing.T) {
	const n, k = 50, 10
	counts := make([]int, n)
	for seed := uint64(0); seed < 2000; seed++ {
		idx := RandomIndices(n, k, seed)
		if len(idx) != k {
			t.Fatalf("seed %d: %d indices, want %d", seed, len(idx), k)
		}
		for j, i := range idx {
			if int(i) >= n || (j > 0 && idx[j-1] >= i) {
				t.Fatalf("seed %d: not ascending distinct in range: %v", seed, idx)
			}
			counts[i]++
		}
		again := RandomIndices(n, k, seed)
		for j := range idx {
			if idx[j] != again[j] {
				t.Fatalf("seed %d: not deterministic", seed)
			}
		}
	}
	// Each index is chosen with probability k/n: 400 of 2000 expected; the
	// seeds are fixed, so this bound is not a flaky statistical test.
	for i, c := range counts {
		if c < 300 || c > 500 {
			t.Errorf("index %d chosen %d times of 2000, want about 400", i, c)
		}
	}
	if a, b := RandomIndices(1000, 5, 1), RandomIndices(1000, 5, 2); equalU32(a, b) {
		t.Errorf("seeds 1 and 2 chose the same indices %v", a)
	}
	if got := RandomIndices(5, 5, 9); !equalU32(got, []uint32{0, 1, 2, 3, 4}) {
		t.Errorf("k == n: %v", got)
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Error feedback loses nothing: what is sent plus the new residual is
// exactly the input plus the old residual.
func TestCompressErrorFeedback(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for _, m := range []Method{TopK, RandomK} {
		x := make([]float32, 100)
		res := make([]float32, 100)
		for i := range res {
			res[i] = float32(rng.NormFloat64())
		}
		for step := 0; step < 5; step++ {
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			want := make([]float32, len(x))
			for i := range x {
				want[i] = x[i] + res[i]
			}
			idx, vals := Compress(m, x, res, 7, uint64(step))
			got := append([]float32(nil), res...)
			if err := Accumulate(got, idx, vals); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%v step %d: sent+residual [%d] = %v, want %v", m, step, i, got[i], want[i])
				}
			}
			for _, i := range idx {
				if res[i] != 0 {
					t.Fatalf("%v: residual at sent index %d is %v", m, i, res[i])
				}
			}
			if m == TopK {
				// Nothing left in the residual is larger than what was sent.
				small := float32(math.Inf(1))
				for _, v := range vals {
					small = min(small, float32(math.Abs(float64(v))))
				}
				for _, v := range res {
					if float32(math.Abs(float64(v))) > small {
						t.Fatalf("topk left %v unsent but sent %v", v, small)
					}
				}
			}
		}
	}
}

// RandomK without error feedback is unbiased: averaged over seeds, the
// decompressed vector approaches the input.
func TestRandomKUnbiased(t *testing.T) {
	x := make([]float32, 40)
	for i := range x {
		x[i] = float32(i%5) - 1.5
	}
	mean := make([]float64, len(x))
	const trials = 20000
	for s := uint64(0); s < trials; s++ {
		idx, vals := Compress(RandomK, x, nil, 4, s)
		for j, i := range idx {
			mean[i] += float64(vals[j]) / trials
		}
	}
	for i := range x {
		if math.Abs(mean[i]-float64(x[i])) > 0.15 {
			t.Errorf("mean[%d] = %.3f, want %.3f", i, mean[i], x[i])
		}
	}
	if _, vals := Compress(RandomK, x, nil, 4, 0); vals[0] == 0 && vals[1] == 0 {
		t.Log("zeros picked")
	}
}

func TestAccumulateChecks(t *testing.T) {
	out := make([]float32, 3)
	if Accumulate(out, []uint32{3}, []float32{1}) == nil {
		t.Error("index out of range accepted")
	}
	if Accumulate(out, []uint32{0, 1}, []float32{1}) == nil {
		t.Error("length mismatch accepted")
	}
}
