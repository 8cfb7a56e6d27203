package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// forEachReduction runs body over world sizes × counts × combos, with the
// large count for the combos and sizes of largeCases. variants restricts the
// combos for forced algorithms to keep the run short.
func forEachReduction(t *testing.T, forced bool, body func(t *testing.T, rng *rand.Rand, n, count int, c combo)) {
	combos := allCombos()
	if forced {
		combos = someCombos()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range worldSizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			for _, count := range smallCount {
				for _, c := range combos {
					body(t, rng, n, count, c)
				}
			}
		})
	}
	lc, ln := largeCases(forced)
	for _, n := range ln {
		t.Run(fmt.Sprintf("n=%d/large", n), func(t *testing.T) {
			for _, c := range lc {
				body(t, rng, n, largeCount, c)
			}
		})
	}
}

func TestAllreduce(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoRecursiveDoubling, AlgoRing} {
		t.Run(algo.String(), func(t *testing.T) {
			withForce(&testTuning.Force.Allreduce, algo, func() {
				forEachReduction(t, algo != AlgoAuto, func(t *testing.T, rng *rand.Rand, n, count int, c combo) {
					checkAllreduce(t, rng, n, count, c, false)
					if count == 7 {
						checkAllreduce(t, rng, n, count, c, true)
					}
				})
			})
		})
	}
}

// TestAllreducePairStream: 2 ranks over links that stream take the fused,
// pipelined ring (pairStream), in and out of place, over chunk counts from
// one to many, with both ranks streaming or just one (the other runs the
// unfused ring: the two send the same messages), and give the unfused
// ring's bits.
func TestAllreducePairStream(t *testing.T) {
	// Chunks above InlineSendMax: memLink's Send of those waits for the
	// matching Recv, the strictest order a transport can impose.
	old := testTuning
	testTuning.ChunkSize = 2 * InlineSendMax
	defer func() { testTuning, testStream = old, nil }()
	rng := rand.New(rand.NewPCG(5, 6))
	who := map[string]func(int) bool{
		"both":   func(int) bool { return true },
		"rank 0": func(r int) bool { return r == 0 },
		"rank 1": func(r int) bool { return r == 1 },
	}
	for name, f := range who {
		for _, count := range []int{2, 7, 1000, 3*InlineSendMax/4 + 5, 100003} {
			for _, c := range someCombos() {
				for _, inPlace := range []bool{false, true} {
					withForce(&testTuning.Force.Allreduce, AlgoRing, func() {
						testStream = f
						t.Run(fmt.Sprintf("%s/%d/%v/inplace=%v", name, count, c, inPlace), func(t *testing.T) {
							checkAllreduce(t, rng, 2, count, c, inPlace)
						})
						testStream = nil
					})
				}
			}
		}
	}
	// Rounding floats: the same bits as the unfused ring, on both ranks.
	for _, c := range []combo{{Float32, Sum}, {Float64, Avg}, {BFloat16, Prod}} {
		count := 5000
		ins := [][]byte{make([]byte, count*c.dt.Size()), make([]byte, count*c.dt.Size())}
		for r := range ins {
			for i := 0; i < count; i++ {
				putFloat(ins[r], c.dt, i, rng.NormFloat64()*1e3)
			}
		}
		run := func(stream bool) [][]byte {
			outs := [][]byte{make([]byte, len(ins[0])), make([]byte, len(ins[0]))}
			withForce(&testTuning.Force.Allreduce, AlgoRing, func() {
				testStream = func(int) bool { return stream }
				runRanks(t, 2, func(ctx context.Context, l Link) error {
					if _, ok := l.(Streamer); ok != stream {
						return fmt.Errorf("link streams: %v, want %v", ok, stream)
					}
					return Allreduce(ctx, l, ins[l.Rank()], outs[l.Rank()], c.dt, c.op)
				})
				testStream = nil
			})
			return outs
		}
		ring, fused := run(false), run(true)
		for r := range 2 {
			equalBytes(t, fmt.Sprintf("%v rank %d: fused vs ring", c, r), fused[r], ring[r])
		}
		equalBytes(t, fmt.Sprintf("%v: fused rank 1 vs rank 0", c), fused[1], fused[0])
	}
}

func checkAllreduce(t *testing.T, rng *rand.Rand, n, count int, c combo, inPlace bool) {
	t.Helper()
	ins := genInputs(rng, n, count, c.dt, c.op, false)
	orig := make([][]byte, n)
	outs := make([][]byte, n)
	for r := range ins {
		orig[r] = append([]byte(nil), ins[r]...)
		outs[r] = make([]byte, len(ins[r]))
		if inPlace {
			copy(outs[r], ins[r])
		}
	}
	runRanks(t, n, func(ctx context.Context, l Link) error {
		r := l.Rank()
		if inPlace {
			return Allreduce(ctx, l, nil, outs[r], c.dt, c.op)
		}
		return Allreduce(ctx, l, ins[r], outs[r], c.dt, c.op)
	})
	want := refFold(orig, c.dt, c.op)
	for r := range outs {
		what := fmt.Sprintf("allreduce n=%d count=%d %v inplace=%v rank %d", n, count, c, inPlace, r)
		equalBytes(t, what, outs[r], want)
		equalBytes(t, what+" (send modified)", ins[r], orig[r])
	}
}

// TestAllreduceBitIdentical uses arbitrary floats, whose sums round, and
// checks that every rank still computes the very same bits.
func TestAllreduceBitIdentical(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, algo := range []Algorithm{AlgoRecursiveDoubling, AlgoRing} {
		withForce(&testTuning.Force.Allreduce, algo, func() {
			for _, n := range []int{3, 5, 6, 8} {
				for _, c := range []combo{{Float32, Sum}, {Float64, Avg}, {Float16, Sum}, {BFloat16, Prod}} {
					checkBitIdentical(t, rng, fmt.Sprintf("%v n=%d %v", algo, n, c), n, 333, c)
				}
			}
		})
	}
}

// checkBitIdentical allreduces arbitrary floats (whose sums round) on n
// ranks and checks that every rank computed the very same bits.
func checkBitIdentical(t *testing.T, rng *rand.Rand, what string, n, count int, c combo) {
	t.Helper()
	ins := make([][]byte, n)
	outs := make([][]byte, n)
	for r := range ins {
		ins[r] = make([]byte, count*c.dt.Size())
		for i := 0; i < count; i++ {
			putFloat(ins[r], c.dt, i, rng.NormFloat64()*1e3)
		}
		outs[r] = make([]byte, len(ins[r]))
	}
	runRanks(t, n, func(ctx context.Context, l Link) error {
		return Allreduce(ctx, l, ins[l.Rank()], outs[l.Rank()], c.dt, c.op)
	})
	for r := 1; r < n; r++ {
		equalBytes(t, fmt.Sprintf("%s rank %d vs 0", what, r), outs[r], outs[0])
	}
}

func TestReduce(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoBinomial, AlgoRing} {
		t.Run(algo.String(), func(t *testing.T) {
			withForce(&testTuning.Force.Reduce, algo, func() {
				forEachReduction(t, algo != AlgoAuto, func(t *testing.T, rng *rand.Rand, n, count int, c combo) {
					root := (count + int(c.op)) % n
					checkRootedReduce(t, rng, n, count, c, root, false)
					if count == 7 {
						checkRootedReduce(t, rng, n, count, c, n-1, true)
					}
				})
			})
		})
	}
}

func checkRootedReduce(t *testing.T, rng *rand.Rand, n, count int, c combo, root int, inPlace bool) {
	t.Helper()
	ins := genInputs(rng, n, count, c.dt, c.op, false)
	orig := make([][]byte, n)
	for r := range ins {
		orig[r] = append([]byte(nil), ins[r]...)
	}
	out := make([]byte, len(ins[root]))
	runRanks(t, n, func(ctx context.Context, l Link) error {
		r := l.Rank()
		switch {
		case r != root:
			return Reduce(ctx, l, ins[r], nil, c.dt, c.op, root)
		case inPlace:
			copy(out, ins[r])
			return Reduce(ctx, l, nil, out, c.dt, c.op, root)
		}
		return Reduce(ctx, l, ins[r], out, c.dt, c.op, root)
	})
	what := fmt.Sprintf("reduce n=%d count=%d %v root=%d inplace=%v", n, count, c, root, inPlace)
	equalBytes(t, what, out, refFold(orig, c.dt, c.op))
	for r := range ins {
		equalBytes(t, what+" (send modified)", ins[r], orig[r])
	}
}

// TestReduceScatter checks that rank r gets block r of the reduction (each
// block has distinct data, so a wrong block cannot pass).
func TestReduceScatter(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		t.Run(fmt.Sprintf("inplace=%v", inPlace), func(t *testing.T) {
			forEachReduction(t, inPlace, func(t *testing.T, rng *rand.Rand, n, count int, c combo) {
				if count == largeCount {
					count = largeCount / n
				}
				checkReduceScatter(t, rng, fmt.Sprintf("reduce-scatter n=%d count=%d %v", n, count, c), n, count, c, inPlace)
			})
		})
	}
}

// checkReduceScatter reduce-scatters count elements per rank on n ranks,
// in place or not, and checks each rank's block and that send is intact.
func checkReduceScatter(t *testing.T, rng *rand.Rand, what string, n, count int, c combo, inPlace bool) {
	t.Helper()
	ins := genInputs(rng, n, n*count, c.dt, c.op, false)
	want := refFold(ins, c.dt, c.op)
	blk := count * c.dt.Size()
	outs := make([][]byte, n)
	bufs := make([][]byte, n)
	for r := range outs {
		outs[r] = make([]byte, blk)
		bufs[r] = append([]byte(nil), ins[r]...)
	}
	runRanks(t, n, func(ctx context.Context, l Link) error {
		r := l.Rank()
		if inPlace {
			return ReduceScatterInPlace(ctx, l, bufs[r], c.dt, c.op)
		}
		return ReduceScatter(ctx, l, bufs[r], outs[r], c.dt, c.op)
	})
	for r := range outs {
		got := outs[r]
		if inPlace {
			got = bufs[r][r*blk : (r+1)*blk]
		} else {
			equalBytes(t, what+" send modified", bufs[r], ins[r])
		}
		equalBytes(t, fmt.Sprintf("%s inplace=%v rank %d", what, inPlace, r), got, want[r*blk:(r+1)*blk])
	}
}

func TestScan(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoRecursiveDoubling, AlgoPipeline} {
		for _, excl := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/exclusive=%v", algo, excl), func(t *testing.T) {
				withForce(&testTuning.Force.Scan, algo, func() {
					forEachReduction(t, algo != AlgoAuto, func(t *testing.T, rng *rand.Rand, n, count int, c combo) {
						checkScan(t, rng, n, count, c, excl, false)
						if count == 7 {
							checkScan(t, rng, n, count, c, excl, true)
						}
					})
				})
			})
		}
	}
}

func checkScan(t *testing.T, rng *rand.Rand, n, count int, c combo, excl, inPlace bool) {
	t.Helper()
	// Avg of a prefix divides by the prefix length, which the column sums
	// of genInputs are not made divisible by; equal inputs keep it exact.
	ins := genInputs(rng, n, count, c.dt, c.op, c.op == Avg)
	orig := make([][]byte, n)
	outs := make([][]byte, n)
	sentinel := byte(0xA5)
	for r := range ins {
		orig[r] = append([]byte(nil), ins[r]...)
		outs[r] = make([]byte, len(ins[r]))
		for i := range outs[r] {
			outs[r][i] = sentinel
		}
		if inPlace {
			copy(outs[r], ins[r])
		}
	}
	runRanks(t, n, func(ctx context.Context, l Link) error {
		r := l.Rank()
		send := ins[r]
		if inPlace {
			send = nil
		}
		if excl {
			return Exscan(ctx, l, send, outs[r], c.dt, c.op)
		}
		return Scan(ctx, l, send, outs[r], c.dt, c.op)
	})
	var prefix [][]byte
	for r := range outs {
		what := fmt.Sprintf("scan n=%d count=%d %v exclusive=%v inplace=%v rank %d", n, count, c, excl, inPlace, r)
		var want []byte
		switch {
		case excl && r == 0 && inPlace:
			want = orig[0]
		case excl && r == 0:
			want = make([]byte, len(outs[r]))
			for i := range want {
				want[i] = sentinel
			}
		case c.op == Avg:
			want = orig[0] // all inputs are equal, and so is their average
		default:
			// The prefix through rank k, folded one rank at a time; exact
			// data make this equal to a fold of the whole prefix.
			k := r
			if excl {
				k = r - 1
			}
			for len(prefix) <= k {
				if len(prefix) == 0 {
					prefix = append(prefix, orig[0])
				} else {
					prefix = append(prefix, refFold([][]byte{prefix[len(prefix)-1], orig[len(prefix)]}, c.dt, c.op))
				}
			}
			want = prefix[k]
		}
		equalBytes(t, what, outs[r], want)
		equalBytes(t, what+" (send modified)", ins[r], orig[r])
	}
}
