// Package compress holds the pure part of compressed allreduce: choosing
// which elements of a gradient each rank sends (TopK, RandomK), error
// feedback, and summing the ranks' sparse contributions. It does no IO;
// core moves the bytes.
//
// Every function is deterministic: given the same inputs, every rank gets
// the same indices and the same sums, so a compressed allreduce leaves
// bit-identical results on every rank.
package compress

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// Method chooses the elements a rank sends. Values are in the C ABI
// (NEXAR_COMPRESS_*).
type Method uint8

const (
	// TopK sends the k elements of largest magnitude (ties: lower index).
	// Ranks choose different indices.
	TopK Method = 1
	// RandomK sends k elements chosen by a seed shared by every rank, so
	// all ranks send the same indices. Without error feedback the values
	// are scaled by n/k, which makes the estimate unbiased.
	RandomK Method = 2
)

func (m Method) String() string {
	switch m {
	case TopK:
		return "topk"
	case RandomK:
		return "randomk"
	}
	return fmt.Sprintf("method(%d)", uint8(m))
}

// Valid reports whether m is a known method.
func (m Method) Valid() bool { return m == TopK || m == RandomK }

// K is the number of elements kept of n at ratio (0 < ratio <= 1):
// ceil(ratio*n), at least 1 when n > 0.
func K(n int, ratio float64) int {
	if n == 0 {
		return 0
	}
	k := int(math.Ceil(ratio * float64(n)))
	return min(max(k, 1), n)
}

// CheckRatio reports a ratio outside (0, 1].
func CheckRatio(ratio float64) error {
	if !(ratio > 0 && ratio <= 1) {
		return fmt.Errorf("ratio %v is not in (0, 1]", ratio)
	}
	return nil
}

// TopKIndices returns the indices of the k elements of x of largest
// magnitude, ties going to the lower index, in ascending order. NaN counts
// as the largest magnitude (it is sent, not hidden in the residual).
func TopKIndices(x []float32, k int) []uint32 {
	n := len(x)
	k = min(max(k, 0), n)
	idx := make([]uint32, n)
	for i := range idx {
		idx[i] = uint32(i)
	}
	if k < n {
		// before(a, b): a ranks ahead of b; a strict total order.
		before := func(a, b uint32) bool {
			ma, mb := mag(x[a]), mag(x[b])
			if ma != mb {
				return ma > mb
			}
			return a < b
		}
		selectK(idx, k, before)
		idx = idx[:k]
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
	return idx
}

// mag orders magnitudes, NaN as +Inf.
func mag(v float32) float64 {
	if v != v {
		return math.Inf(1) // NaN ranks with +Inf; the index breaks the tie
	}
	return math.Abs(float64(v))
}

// selectK partially orders idx so that its first k entries are the k
// first under before (quickselect, median-of-three pivots).
func selectK(idx []uint32, k int, before func(a, b uint32) bool) {
	lo, hi := 0, len(idx)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// median of three into idx[hi] as the pivot
		if before(idx[mid], idx[lo]) {
			idx[mid], idx[lo] = idx[lo], idx[mid]
		}
		if before(idx[hi], idx[lo]) {
			idx[hi], idx[lo] = idx[lo], idx[hi]
		}
		if before(idx[mid], idx[hi]) {
			idx[mid], idx[hi] = idx[hi], idx[mid]
		}
		p := idx[hi]
		s := lo
		for i := lo; i < hi; i++ {
			if before(idx[i], p) {
				idx[i], idx[s] = idx[s], idx[i]
				s++
			}
		}
		idx[s], idx[hi] = idx[hi], idx[s]
		switch {
		case s == k || s == k-1:
			return
		case s < k:
			lo = s + 1
		default:
			hi = s - 1
		}
	}
}

// splitmix64 is the seed's generator: tiny, fast, and identical on every
// platform (math/rand's sources are not promised to stay the same).
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// below returns a uniform integer in [0, n) (Lemire's method, unbiased).
func (s *splitmix64) below(n uint64) uint64 {
	for {
		hi, lo := bits.Mul64(s.next(), n)
		if lo >= n || lo >= (-n)%n {
			return hi
		}
	}
}

// RandomIndices returns k distinct indices of [0, n), uniformly chosen by
// seed, in ascending order (Floyd's algorithm over a bitset: O(k) draws,
// n/8 bytes).
func RandomIndices(n, k int, seed uint64) []uint32 {
	k = min(max(k, 0), n)
	taken := make([]uint64, (n+63)/64)
	rng := splitmix64(seed)
	for j := n - k; j < n; j++ {
		t := int(rng.below(uint64(j) + 1))
		if taken[t/64]&(1<<(t%64)) != 0 {
			t = j
		}
		taken[t/64] |= 1 << (t % 64)
	}
	out := make([]uint32, 0, k)
	for w, word := range taken {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			out = append(out, uint32(w*64+b))
			word &= word - 1
		}
	}
	return out
}

// Compress chooses this rank's contribution from x: the indices (ascending)
// and the values to send. With residual (error feedback, len(residual) ==
// len(x)) the input is x + residual, and residual becomes what was not
// sent: input minus the sent values (zero at the sent indices). RandomK
// values are scaled by n/k only without error feedback: with it, scaling
// would leave (1 - n/k) times the input in the residual at each pick,
// which grows without bound for ratios below 1/2; the residual already
// makes the sum over steps unbiased. x is not modified.
func Compress(m Method, x, residual []float32, k int, seed uint64) ([]uint32, []float32) {
	in := x
	if residual != nil {
		for i := range residual {
			residual[i] += x[i]
		}
		in = residual
	}
	var idx []uint32
	scale := float32(1)
	switch m {
	case TopK:
		idx = TopKIndices(in, k)
	case RandomK:
		idx = RandomIndices(len(in), k, seed)
		if residual == nil && len(idx) > 0 {
			scale = float32(float64(len(in)) / float64(len(idx)))
		}
	default:
		panic("compress: unknown method " + m.String())
	}
	vals := make([]float32, len(idx))
	for j, i := range idx {
		vals[j] = in[i] * scale
	}
	if residual != nil {
		for _, i := range idx {
			residual[i] = 0
		}
	}
	return idx, vals
}

// Accumulate adds vals at idx into out (out[idx[j]] += vals[j]); an index
// out of range is an error (a peer's corrupt or mismatched contribution).
func Accumulate(out []float32, idx []uint32, vals []float32) error {
	if len(idx) != len(vals) {
		return fmt.Errorf("compress: %d indices for %d values", len(idx), len(vals))
	}
	for j, i := range idx {
		if int(i) >= len(out) {
			return fmt.Errorf("compress: index %d out of range [0, %d)", i, len(out))
		}
		out[i] += vals[j]
	}
	return nil
}
