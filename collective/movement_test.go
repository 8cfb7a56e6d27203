package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// byteCounts are the block sizes, in bytes, for the data-movement
// collectives (which ignore the dtype): 0, 1, 7, 1000 elements of 1 and 8
// bytes, and the large count of single bytes for a few world sizes.
func forEachMovement(t *testing.T, body func(t *testing.T, rng *rand.Rand, n, blk int)) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range worldSizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			for _, es := range []int{1, 8} {
				for _, c := range smallCount {
					body(t, rng, n, c*es)
				}
			}
		})
	}
	_, ln := largeCases(false)
	for _, n := range ln {
		t.Run(fmt.Sprintf("n=%d/large", n), func(t *testing.T) { body(t, rng, n, largeCount) })
	}
}

func TestBroadcast(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoBinomial, AlgoPipeline} {
		t.Run(algo.String(), func(t *testing.T) {
			withForce(&testTuning.Force.Broadcast, algo, func() {
				forEachMovement(t, func(t *testing.T, rng *rand.Rand, n, blk int) {
					for _, root := range roots(n) {
						want := randBytes(rng, blk)
						bufs := make([][]byte, n)
						for r := range bufs {
							bufs[r] = make([]byte, blk)
						}
						copy(bufs[root], want)
						runRanks(t, n, func(ctx context.Context, l Link) error {
							return Broadcast(ctx, l, bufs[l.Rank()], root)
						})
						for r := range bufs {
							equalBytes(t, fmt.Sprintf("broadcast n=%d len=%d root=%d rank %d", n, blk, root, r), bufs[r], want)
						}
					}
				})
			})
		})
	}
}

// roots picks first, last and a middle rank.
func roots(n int) []int {
	if n <= 2 {
		return []int{0, n - 1}[:n]
	}
	return []int{0, n / 2, n - 1}
}

func TestAllgather(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoBruck, AlgoRing} {
		for _, inPlace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/inplace=%v", algo, inPlace), func(t *testing.T) {
				withForce(&testTuning.Force.Allgather, algo, func() {
					forEachMovement(t, func(t *testing.T, rng *rand.Rand, n, blk int) {
						if blk == largeCount {
							blk /= n
						}
						ins := make([][]byte, n)
						want := make([]byte, 0, n*blk)
						outs := make([][]byte, n)
						for r := range ins {
							ins[r] = randBytes(rng, blk)
							want = append(want, ins[r]...)
							outs[r] = make([]byte, n*blk)
							if inPlace {
								copy(outs[r][r*blk:], ins[r])
							}
						}
						runRanks(t, n, func(ctx context.Context, l Link) error {
							r := l.Rank()
							if inPlace {
								return Allgather(ctx, l, nil, outs[r])
							}
							return Allgather(ctx, l, ins[r], outs[r])
						})
						for r := range outs {
							equalBytes(t, fmt.Sprintf("allgather n=%d blk=%d rank %d", n, blk, r), outs[r], want)
						}
					})
				})
			})
		}
	}
}

// vlayout makes uneven per-rank byte counts (some zero) and displacements
// laid out in reverse rank order with gaps, in a buffer of the returned
// length.
func vlayout(rng *rand.Rand, n, maxc int) (counts, displs []int, total int) {
	counts, displs = make([]int, n), make([]int, n)
	for i := range counts {
		if rng.IntN(4) != 0 {
			counts[i] = rng.IntN(maxc + 1)
		}
	}
	for i := n - 1; i >= 0; i-- {
		total += rng.IntN(3) // gap
		displs[i] = total
		total += counts[i]
	}
	return counts, displs, total + 1
}

const gapByte = 0xEE

func filled(n int) []byte { return bytes.Repeat([]byte{gapByte}, n) }

func TestAllgatherv(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range worldSizes {
		for _, maxc := range []int{0, 1, 13, 5000} {
			for _, inPlace := range []bool{false, true} {
				counts, displs, total := vlayout(rng, n, maxc)
				ins := make([][]byte, n)
				want := filled(total)
				outs := make([][]byte, n)
				for r := range ins {
					ins[r] = randBytes(rng, counts[r])
					copy(want[displs[r]:], ins[r])
				}
				for r := range outs {
					outs[r] = filled(total)
					if inPlace {
						copy(outs[r][displs[r]:], ins[r])
					}
				}
				runRanks(t, n, func(ctx context.Context, l Link) error {
					r := l.Rank()
					if inPlace {
						return Allgatherv(ctx, l, nil, outs[r], counts, displs)
					}
					return Allgatherv(ctx, l, ins[r], outs[r], counts, displs)
				})
				for r := range outs {
					equalBytes(t, fmt.Sprintf("allgatherv n=%d counts=%v rank %d", n, counts, r), outs[r], want)
				}
			}
		}
	}
}

func TestAlltoall(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoBruck, AlgoPairwise} {
		for _, inPlace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/inplace=%v", algo, inPlace), func(t *testing.T) {
				withForce(&testTuning.Force.Alltoall, algo, func() {
					testAlltoall(t, inPlace)
				})
			})
		}
	}
}

func testAlltoall(t *testing.T, inPlace bool) {
	forEachMovement(t, func(t *testing.T, rng *rand.Rand, n, blk int) {
		if blk == largeCount {
			blk /= n
		}
		ins := make([][]byte, n)
		outs := make([][]byte, n)
		for r := range ins {
			ins[r] = randBytes(rng, n*blk)
			outs[r] = make([]byte, n*blk)
			if inPlace {
				copy(outs[r], ins[r])
			}
		}
		runRanks(t, n, func(ctx context.Context, l Link) error {
			r := l.Rank()
			if inPlace {
				return Alltoall(ctx, l, nil, outs[r])
			}
			return Alltoall(ctx, l, ins[r], outs[r])
		})
		for r := range outs {
			for s := 0; s < n; s++ {
				equalBytes(t, fmt.Sprintf("alltoall n=%d blk=%d rank %d from %d", n, blk, r, s),
					outs[r][s*blk:(s+1)*blk], ins[s][r*blk:(r+1)*blk])
			}
		}
	})
}

func TestAlltoallv(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range worldSizes {
		for _, maxc := range []int{0, 1, 13, 3000} {
			// m[s][d] bytes go from s to d.
			m := make([][]int, n)
			for s := range m {
				m[s] = make([]int, n)
				for d := range m[s] {
					if rng.IntN(4) != 0 {
						m[s][d] = rng.IntN(maxc + 1)
					}
				}
			}
			type side struct {
				counts, displs []int
				buf            []byte
			}
			snd, rcv := make([]side, n), make([]side, n)
			for r := 0; r < n; r++ {
				sc, rc := make([]int, n), make([]int, n)
				for p := 0; p < n; p++ {
					sc[p], rc[p] = m[r][p], m[p][r]
				}
				var st, rt int
				snd[r].counts, rcv[r].counts = sc, rc
				snd[r].displs, rcv[r].displs = make([]int, n), make([]int, n)
				for p := n - 1; p >= 0; p-- { // reversed, with gaps
					snd[r].displs[p], st = st+1, st+1+sc[p]
					rcv[r].displs[p], rt = rt+2, rt+2+rc[p]
				}
				snd[r].buf = randBytes(rng, st)
				rcv[r].buf = filled(rt + 1)
			}
			runRanks(t, n, func(ctx context.Context, l Link) error {
				r := l.Rank()
				return Alltoallv(ctx, l, snd[r].buf, snd[r].counts, snd[r].displs, rcv[r].buf, rcv[r].counts, rcv[r].displs)
			})
			for r := 0; r < n; r++ {
				want := filled(len(rcv[r].buf))
				for s := 0; s < n; s++ {
					d := snd[s].displs[r]
					copy(want[rcv[r].displs[s]:], snd[s].buf[d:d+m[s][r]])
				}
				equalBytes(t, fmt.Sprintf("alltoallv n=%d rank %d", n, r), rcv[r].buf, want)
			}
		}
	}
}

func TestGatherScatter(t *testing.T) {
	for _, algo := range []Algorithm{AlgoAuto, AlgoBinomial, AlgoLinear} {
		t.Run(algo.String(), func(t *testing.T) {
			withForce(&testTuning.Force.Gather, algo, func() {
				withForce(&testTuning.Force.Scatter, algo, func() {
					forEachMovement(t, func(t *testing.T, rng *rand.Rand, n, blk int) {
						rs := roots(n)
						if blk == largeCount {
							blk /= n
							rs = rs[len(rs)-1:]
						}
						for _, root := range rs {
							for _, inPlace := range []bool{false, true} {
								checkGather(t, rng, n, blk, root, inPlace)
								checkScatter(t, rng, n, blk, root, inPlace)
							}
						}
					})
				})
			})
		})
	}
}

func checkGather(t *testing.T, rng *rand.Rand, n, blk, root int, inPlace bool) {
	t.Helper()
	ins := make([][]byte, n)
	want := make([]byte, 0, n*blk)
	for r := range ins {
		ins[r] = randBytes(rng, blk)
		want = append(want, ins[r]...)
	}
	out := make([]byte, n*blk)
	if inPlace {
		copy(out[root*blk:], ins[root])
	}
	runRanks(t, n, func(ctx context.Context, l Link) error {
		r := l.Rank()
		switch {
		case r != root:
			return Gather(ctx, l, ins[r], nil, root)
		case inPlace:
			return Gather(ctx, l, nil, out, root)
		}
		return Gather(ctx, l, ins[r], out, root)
	})
	equalBytes(t, fmt.Sprintf("gather n=%d blk=%d root=%d inplace=%v", n, blk, root, inPlace), out, want)
}

func checkScatter(t *testing.T, rng *rand.Rand, n, blk, root int, inPlace bool) {
	t.Helper()
	send := randBytes(rng, n*blk)
	orig := append([]byte(nil), send...)
	outs := make([][]byte, n)
	for r := range outs {
		outs[r] = make([]byte, blk)
	}
	runRanks(t, n, func(ctx context.Context, l Link) error {
		r := l.Rank()
		switch {
		case r != root:
			return Scatter(ctx, l, nil, outs[r], root)
		case inPlace:
			return Scatter(ctx, l, send, nil, root)
		}
		return Scatter(ctx, l, send, outs[r], root)
	})
	equalBytes(t, "scatter modified send", send, orig)
	for r := range outs {
		if r == root && inPlace {
			continue
		}
		equalBytes(t, fmt.Sprintf("scatter n=%d blk=%d root=%d rank %d", n, blk, root, r), outs[r], orig[r*blk:(r+1)*blk])
	}
}

func TestGathervScatterv(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range worldSizes {
		for _, maxc := range []int{0, 1, 13, 5000} {
			for _, root := range roots(n) {
				for _, inPlace := range []bool{false, true} {
					counts, displs, total := vlayout(rng, n, maxc)
					ins := make([][]byte, n)
					want := filled(total)
					for r := range ins {
						ins[r] = randBytes(rng, counts[r])
						copy(want[displs[r]:], ins[r])
					}
					out := filled(total)
					if inPlace {
						copy(out[displs[root]:], ins[root])
					}
					outs := make([][]byte, n)
					for r := range outs {
						outs[r] = make([]byte, counts[r])
					}
					runRanks(t, n, func(ctx context.Context, l Link) error {
						r := l.Rank()
						if r != root {
							// Non-roots pass no counts, as MPI allows.
							if err := Gatherv(ctx, l, ins[r], nil, nil, nil, root); err != nil {
								return err
							}
							return Scatterv(ctx, l, nil, nil, nil, outs[r], root)
						}
						send, recv := ins[r], outs[r]
						if inPlace {
							send, recv = nil, nil
						}
						if err := Gatherv(ctx, l, send, out, counts, displs, root); err != nil {
							return err
						}
						return Scatterv(ctx, l, want, counts, displs, recv, root)
					})
					what := fmt.Sprintf("n=%d counts=%v root=%d inplace=%v", n, counts, root, inPlace)
					equalBytes(t, "gatherv "+what, out, want)
					for r := range outs {
						if r != root || !inPlace {
							equalBytes(t, fmt.Sprintf("scatterv %s rank %d", what, r), outs[r], ins[r])
						}
					}
				}
			}
		}
	}
}
