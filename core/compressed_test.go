package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/compress"
)

// rankData is rank r's input: distinct magnitudes, both signs.
func rankData(r, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		v := float32((i*7+r*13)%n) + 0.25*float32(r)
		if (i+r)%3 == 0 {
			v = -v
		}
		x[i] = v
	}
	return x
}

// topRef keeps x's k largest magnitudes (lower index on ties), zero elsewhere.
func topRef(x []float32, k int) []float32 {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return math.Abs(float64(x[idx[a]])) > math.Abs(float64(x[idx[b]])) })
	out := make([]float32, len(x))
	for _, i := range idx[:k] {
		out[i] = x[i]
	}
	return out
}

func runCompressed(t *testing.T, comms []*Comm, count int, m compress.Method, ratio float64, ef bool, seed uint64) ([][]float32, [][]float32) {
	t.Helper()
	out := make([][]float32, len(comms))
	res := make([][]float32, len(comms))
	mustAll(t, each(comms, func(c *Comm) error {
		buf := bytesOfF32(append([]float32(nil), rankData(c.Rank(), count)...))
		var residual []byte
		if ef {
			residual = make([]byte, len(buf))
		}
		if err := c.AllreduceCompressed(context.Background(), buf, residual, collective.Float32, m, ratio, seed); err != nil {
			return err
		}
		out[c.Rank()], res[c.Rank()] = asF32(buf), asF32(residual)
		return nil
	}))
	return out, res
}

// Every world size 1..5: each rank's contribution counted once, the same
// result on every rank.
func TestAllreduceCompressedTopK(t *testing.T) {
	const count = 37
	for n := 1; n <= 5; n++ {
		comms := newLocal(t, n)
		for _, ratio := range []float64{0.1, 0.5, 1} {
			t.Run(fmt.Sprintf("n%d/ratio%v", n, ratio), func(t *testing.T) {
				k := compress.K(count, ratio)
				want := make([]float32, count)
				for r := 0; r < n; r++ {
					for i, v := range topRef(rankData(r, count), k) {
						want[i] += v
					}
				}
				out, res := runCompressed(t, comms, count, compress.TopK, ratio, true, 0)
				for r := 0; r < n; r++ {
					for i := range want {
						if out[r][i] != want[i] {
							t.Fatalf("rank %d [%d] = %v, want %v", r, i, out[r][i], want[i])
						}
					}
					// The residual is what was not sent.
					x, sent := rankData(r, count), topRef(rankData(r, count), k)
					for i := range x {
						if res[r][i] != x[i]-sent[i] {
							t.Fatalf("rank %d residual [%d] = %v, want %v", r, i, res[r][i], x[i]-sent[i])
						}
					}
				}
			})
		}
	}
}

func TestAllreduceCompressedRandomK(t *testing.T) {
	const count = 41
	for n := 1; n <= 5; n++ {
		comms := newLocal(t, n)
		for _, ef := range []bool{false, true} {
			t.Run(fmt.Sprintf("n%d/ef%v", n, ef), func(t *testing.T) {
				const ratio, seed = 0.2, 77
				k := compress.K(count, ratio)
				idx := compress.RandomIndices(count, k, seed)
				scale := float32(1)
				if !ef {
					scale = float32(count) / float32(k)
				}
				want := make([]float32, count)
				for _, i := range idx {
					for r := 0; r < n; r++ {
						want[i] += rankData(r, count)[i] * scale
					}
				}
				out, _ := runCompressed(t, comms, count, compress.RandomK, ratio, ef, seed)
				for r := 0; r < n; r++ {
					for i := range want {
						// The allreduce may add in another order than
						// this loop: compare closely, and ranks exactly.
						if math.Abs(float64(out[r][i]-want[i])) > 1e-4*math.Abs(float64(want[i]))+1e-6 {
							t.Fatalf("rank %d [%d] = %v, want %v", r, i, out[r][i], want[i])
						}
						if out[r][i] != out[0][i] {
							t.Fatalf("rank %d [%d] = %v differs from rank 0's %v", r, i, out[r][i], out[0][i])
						}
					}
				}
			})
		}
	}
}

func TestAllreduceCompressedInvalid(t *testing.T) {
	comms := newLocal(t, 2)
	c := comms[0]
	ctx := context.Background()
	b := make([]byte, 16)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"dtype", c.AllreduceCompressed(ctx, b, nil, collective.Float64, compress.TopK, 0.5, 0), "float32 only"},
		{"ragged", c.AllreduceCompressed(ctx, b[:6], nil, collective.Float32, compress.TopK, 0.5, 0), "multiple"},
		{"residual", c.AllreduceCompressed(ctx, b, make([]byte, 8), collective.Float32, compress.TopK, 0.5, 0), "residual"},
		{"aligned", c.AllreduceCompressed(ctx, b[1:13], nil, collective.Float32, compress.TopK, 0.5, 0), "aligned"},
		{"method", c.AllreduceCompressed(ctx, b, nil, collective.Float32, compress.Method(9), 0.5, 0), "method"},
		{"ratio0", c.AllreduceCompressed(ctx, b, nil, collective.Float32, compress.TopK, 0, 0), "ratio"},
		{"ratio2", c.AllreduceCompressed(ctx, b, nil, collective.Float32, compress.RandomK, 2, 0), "ratio"},
	}
	for _, tc := range cases {
		var e *Error
		if !errors.As(tc.err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Msg, tc.want) || e.Op != "allreduce_compressed" {
			t.Errorf("%s: got %v, want CodeInvalidArgument from allreduce_compressed naming %q", tc.name, tc.err, tc.want)
		}
	}
	mustAll(t, each(comms, func(c *Comm) error { return c.Barrier(ctx) }))
}

// Ranks with different ratios fail as mismatched, never hang.
func TestAllreduceCompressedMismatch(t *testing.T) {
	comms := newLocal(t, 2)
	errs := each(comms, func(c *Comm) error {
		ratio := 0.25
		if c.Rank() == 1 {
			ratio = 0.5
		}
		return c.AllreduceCompressed(context.Background(), make([]byte, 64), nil, collective.Float32, compress.TopK, ratio, 0)
	})
	for r, err := range errs {
		if CodeOf(err) != CodeMismatch {
			t.Errorf("rank %d: %v, want a mismatch", r, err)
		}
	}
}
