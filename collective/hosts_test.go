package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// withHosts sets testTuning.Hosts from comma-separated host keys (one per
// rank) for the duration of f.
func withHosts(keys string, f func()) {
	old := testTuning.Hosts
	testTuning.Hosts = NewHostMap(strings.Split(keys, ","))
	defer func() { testTuning.Hosts = old }()
	f()
}

func TestHostMap(t *testing.T) {
	h := NewHostMap([]string{"b", "a", "b", "c", "a", "c"})
	if h.Hosts() != 3 || h.Of(0) != 0 || h.Of(1) != 1 || h.Of(3) != 2 || h.Of(4) != 1 {
		t.Fatalf("hosts numbered by lowest rank: got %v", h.of)
	}
	if got := h.String(); got != "3 hosts x 2 ranks" {
		t.Fatalf("String: %q", got)
	}
	if NewHostMap([]string{"x", "y", "x", "z", "y", "z"}).Digest() != h.Digest() {
		t.Fatal("the same grouping under other keys has another digest")
	}
	if NewHostMap([]string{"a", "a", "b", "b", "c", "c"}).Digest() == h.Digest() {
		t.Fatal("another grouping has the same digest")
	}
	if got := NewHostMap([]string{"a", "a", "a", "b"}).String(); got != "2 hosts (1-3 ranks)" {
		t.Fatalf("String: %q", got)
	}
}

// hierLayouts are host assignments (rank order) the two-level allreduce
// must handle: contiguous, interleaved, and scattered ranks.
var hierLayouts = []string{"A,A,B,B", "A,B,A,B", "A,A,A,B,B,B", "A,B,C,A,B,C", "B,A,A,C,C,B", "A,B,B,A,A,B,B,A"}

func TestAllreduceHier(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	combos := someCombos()
	if !quick() {
		combos = allCombos()
	}
	for _, keys := range hierLayouts {
		n := strings.Count(keys, ",") + 1
		t.Run(keys, func(t *testing.T) {
			withHosts(keys, func() {
				withForce(&testTuning.Force.Allreduce, AlgoHier, func() {
					for _, count := range []int{0, 1, n, 7, 1000} {
						for _, c := range combos {
							checkAllreduce(t, rng, n, count, c, false)
							checkAllreduce(t, rng, n, count, c, true)
						}
					}
				})
				// Auto: a payload in the ring's range takes the two
				// levels (TestAllreduceHierCrossesLeast checks that it did).
				for _, c := range quickCombos {
					checkAllreduce(t, rng, n, largeCount/4, c, false)
					checkAllreduce(t, rng, n, largeCount/4, c, true)
				}
			})
		})
	}
}

// TestAllreduceHierStreams: the between-host step over links that stream
// takes the fused pair schedule (2 hosts), with other ranks not streaming.
func TestAllreduceHierStreams(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	old := testStream
	testStream = func(rank int) bool { return rank%2 == 0 }
	defer func() { testStream = old }()
	withHosts("A,B,A,B", func() {
		for _, c := range quickCombos {
			checkAllreduce(t, rng, 4, largeCount/4, c, false)
		}
	})
}

func TestAllreduceHierBitIdentical(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, keys := range []string{"A,B,A,B,A,B", "A,A,B,B,C,C"} {
		withHosts(keys, func() {
			withForce(&testTuning.Force.Allreduce, AlgoHier, func() {
				// 4001 elements take the leader schedule, 300001 the
				// two-level ring.
				for _, count := range []int{4001, 300001} {
					for _, c := range []combo{{Float32, Sum}, {Float64, Avg}, {BFloat16, Prod}} {
						checkBitIdentical(t, rng, fmt.Sprintf("%s %d %v", keys, count, c), 6, count, c)
					}
				}
			})
		})
	}
}

// TestAllreduceLeaders: below the ring's range, hosts of any rank counts
// (one with two or more) take the leader schedule by default; results as
// the flat schedules', in and out of place, every dtype and op.
func TestAllreduceLeaders(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	combos := someCombos()
	if !quick() {
		combos = allCombos()
	}
	for _, keys := range []string{"A,A,A,B", "A,B,B,C,C,C", "A,B,C,A", "B,A,A,B,A"} {
		n := strings.Count(keys, ",") + 1
		t.Run(keys, func(t *testing.T) {
			withHosts(keys, func() {
				for _, count := range []int{1, n, 7, 1000} {
					for _, c := range combos {
						checkAllreduce(t, rng, n, count, c, false)
						checkAllreduce(t, rng, n, count, c, true)
					}
				}
			})
		})
	}
}

// TestAllreduceLeadersCross: a small allreduce with several ranks on a
// host sends between hosts only what its leaders' recursive doubling
// sends, S per leader and step (2(H-1)·S, the least, for 2 and 3 hosts);
// recursive doubling over every rank sends more.
func TestAllreduceLeadersCross(t *testing.T) {
	count := 16 // 64 B: latency-bound
	s := int64(4 * count)
	// sends of recursive doubling over h ranks: the 2·rem folding sends
	// and pof2·log2(pof2) exchanges.
	sends := func(h int) int64 {
		pof2, steps := 1, 0
		for pof2*2 <= h {
			pof2, steps = pof2*2, steps+1
		}
		return int64(2*(h-pof2) + pof2*steps)
	}
	for _, keys := range []string{"A,A,B,B", "A,B,A,B", "A,A,A,B", "A,B,C,A,B,C", "A,A,B,B,C,C,D,D"} {
		hosts := NewHostMap(strings.Split(keys, ",")).Hosts()
		want := sends(hosts) * s
		if hosts <= 3 && want != 2*int64(hosts-1)*s {
			t.Fatalf("%s: %d bytes is not the least, 2(H-1)·S", keys, want)
		}
		if got := allreduceCross(t, keys, count, AlgoAuto); got != want {
			t.Errorf("%s: auto sent %d bytes between hosts, want %d (%.2fx)", keys, got, want, float64(got)/float64(want))
		}
		if got := allreduceCross(t, keys, count, AlgoRecursiveDoubling); got <= want {
			t.Errorf("%s: recursive doubling sent %d bytes between hosts, no more than the leaders' %d: the check cannot tell", keys, got, want)
		}
	}
}

// crossLink counts the payload bytes its rank sends to ranks on other
// hosts.
type crossLink struct {
	*memLink
	hosts *HostMap
	cross *atomic.Int64
	msgs  *atomic.Int64
}

func (c crossLink) Send(ctx context.Context, peer int, step uint32, data []byte) error {
	if c.hosts.Of(peer) != c.hosts.Of(c.rank) {
		c.cross.Add(int64(len(data)))
		c.msgs.Add(1)
	}
	return c.memLink.Send(ctx, peer, step, data)
}

// crossBytes runs call on every rank of the hosts keys, over links that
// count, and returns the payload bytes that crossed between hosts.
func crossBytes(t *testing.T, keys string, call func(ctx context.Context, l Link) error) int64 {
	t.Helper()
	b, _ := crossCounts(t, keys, call)
	return b
}

// crossCounts is crossBytes with the number of messages that crossed.
func crossCounts(t *testing.T, keys string, call func(ctx context.Context, l Link) error) (bytes, msgs int64) {
	t.Helper()
	var cross, sent atomic.Int64
	withHosts(keys, func() {
		n := strings.Count(keys, ",") + 1
		net := newMemNet(n)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for r := 0; r < n; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = call(ctx, crossLink{&memLink{net, r}, net.tuning.Hosts, &cross, &sent})
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%s rank %d: %v", keys, r, err)
			}
		}
	})
	return cross.Load(), sent.Load()
}

// allreduceCross is crossBytes of one float32 sum allreduce of count
// elements with the allreduce algorithm force.
func allreduceCross(t *testing.T, keys string, count int, force Algorithm) int64 {
	var got int64
	withForce(&testTuning.Force.Allreduce, force, func() {
		got = crossBytes(t, keys, func(ctx context.Context, l Link) error {
			return Allreduce(ctx, l, nil, make([]byte, 4*count), Float32, Sum)
		})
	})
	return got
}

// TestAllreduceHierCrossesLeast: with H hosts the least a schedule can
// send between hosts per allreduce of S bytes is 2(H-1)·S in all (each
// host must send its contribution to every element once and receive the
// others' once); the automatic choice reaches it, the flat ring does not.
func TestAllreduceHierCrossesLeast(t *testing.T) {
	count := 1 << 20 // 4 MiB: in the ring's range
	s := int64(4 * count)
	for _, keys := range []string{"A,A,B,B", "A,B,A,B", "A,A,A,B,B,B", "A,B,C,A,B,C"} {
		hosts := int64(NewHostMap(strings.Split(keys, ",")).Hosts())
		least := 2 * (hosts - 1) * s
		if got := allreduceCross(t, keys, count, AlgoAuto); got != least {
			t.Errorf("%s: auto sent %d bytes between hosts, the least is %d (%.2fx)", keys, got, least, float64(got)/float64(least))
		}
		if got := allreduceCross(t, keys, count, AlgoRing); got <= least {
			t.Errorf("%s: the flat ring sent %d bytes between hosts, no more than the least %d: the check cannot tell", keys, got, least)
		}
	}
}

func TestAllreduceHierUnusable(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	// Unequal hosts: auto keeps the flat ring in its range, forcing hier
	// there is an error.
	withHosts("A,A,A,B", func() {
		checkAllreduce(t, rng, 4, largeCount/4, combo{Float32, Sum}, false)
		withForce(&testTuning.Force.Allreduce, AlgoHier, func() {
			err := tryRanks(4, 10*time.Second, func(ctx context.Context, l Link) error {
				return Allreduce(ctx, l, nil, make([]byte, 4*(largeCount/4)), Float32, Sum)
			})
			if err == nil || !strings.Contains(err.Error(), "2 hosts (1-3 ranks)") {
				t.Fatalf("forced hier on unequal hosts: %v", err)
			}
		})
	})
	// One rank per host: no leader schedule either.
	withHosts("A,B,C", func() {
		withForce(&testTuning.Force.Allreduce, AlgoHier, func() {
			err := tryRanks(3, 10*time.Second, func(ctx context.Context, l Link) error {
				return Allreduce(ctx, l, nil, make([]byte, 64), Float32, Sum)
			})
			if err == nil || !strings.Contains(err.Error(), "3 hosts x 1 ranks") {
				t.Fatalf("forced hier with one rank per host: %v", err)
			}
		})
	})
}

// TestReduceScatterAllgatherHier: on hosts of equal rank counts the
// reduce-scatter and the ring-sized allgather take two levels; results as
// the flat schedules', in and out of place, and each host sends the others
// (H-1)/H of the data once: (H-1)·S between hosts in all.
func TestReduceScatterAllgatherHier(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	combos := quickCombos
	if !quick() {
		combos = someCombos()
	}
	for _, keys := range hierLayouts {
		n := strings.Count(keys, ",") + 1
		hosts := int64(NewHostMap(strings.Split(keys, ",")).Hosts())
		t.Run(keys, func(t *testing.T) {
			withHosts(keys, func() {
				for _, count := range []int{1, 7, 1000, 70000} {
					for _, c := range combos {
						for _, inPlace := range []bool{false, true} {
							checkReduceScatter(t, rng, fmt.Sprintf("reduce-scatter %s count=%d %v", keys, count, c), n, count, c, inPlace)
						}
					}
					blk := count * 4
					ins := make([][]byte, n)
					var want []byte
					for r := range ins {
						ins[r] = randBytes(rng, blk)
						want = append(want, ins[r]...)
					}
					for _, inPlace := range []bool{false, true} {
						outs := make([][]byte, n)
						for r := range outs {
							outs[r] = make([]byte, n*blk)
							if inPlace {
								copy(outs[r][r*blk:], ins[r])
							}
						}
						runRanks(t, n, func(ctx context.Context, l Link) error {
							if inPlace {
								return Allgather(ctx, l, nil, outs[l.Rank()])
							}
							return Allgather(ctx, l, ins[l.Rank()], outs[l.Rank()])
						})
						for r := range outs {
							equalBytes(t, fmt.Sprintf("allgather %s blk=%d inplace=%v rank %d", keys, blk, inPlace, r), outs[r], want)
						}
					}
				}
			})
			blk := 1 << 20
			s := int64(n * blk)
			if got := crossBytes(t, keys, func(ctx context.Context, l Link) error {
				return ReduceScatter(ctx, l, make([]byte, n*blk), make([]byte, blk), Float32, Sum)
			}); got != (hosts-1)*s {
				t.Errorf("%s: reduce-scatter sent %d bytes between hosts, the least is %d", keys, got, (hosts-1)*s)
			}
			if got := crossBytes(t, keys, func(ctx context.Context, l Link) error {
				return Allgather(ctx, l, make([]byte, blk), make([]byte, n*blk))
			}); got != (hosts-1)*s {
				t.Errorf("%s: allgather sent %d bytes between hosts, the least is %d", keys, got, (hosts-1)*s)
			}
		})
	}
}

// TestHostOrderedRings: with hosts and no Layout the ring schedules visit
// each host's ranks in a row and a broadcast chain from any root crosses
// once to each other host; results unchanged.
func TestHostOrderedRings(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, keys := range []string{"A,B,A,B", "A,B,C,A,B,C", "A,A,A,B"} {
		n := strings.Count(keys, ",") + 1
		hosts := int64(NewHostMap(strings.Split(keys, ",")).Hosts())
		size := 1 << 20
		for root := 0; root < n; root++ {
			want := randBytes(rng, size)
			bufs := make([][]byte, n)
			var cross int64
			withForce(&testTuning.Force.Broadcast, AlgoPipeline, func() {
				cross = crossBytes(t, keys, func(ctx context.Context, l Link) error {
					b := make([]byte, size)
					if l.Rank() == root {
						copy(b, want)
					}
					bufs[l.Rank()] = b
					return Broadcast(ctx, l, b, root)
				})
			})
			for r := range bufs {
				equalBytes(t, fmt.Sprintf("broadcast %s root %d rank %d", keys, root, r), bufs[r], want)
			}
			if cross != (hosts-1)*int64(size) {
				t.Errorf("%s root %d: the broadcast chain sent %d bytes between hosts, want %d", keys, root, cross, (hosts-1)*int64(size))
			}
		}
		// The flat ring allreduce crosses between hosts H times (each
		// crossing edge carries 2(n-1)/n of the data), not at every edge.
		count := 1 << 18
		s := int64(4 * count)
		if got, want := allreduceCross(t, keys, count, AlgoRing), hosts*2*int64(n-1)*s/int64(n); got != want {
			t.Errorf("%s: the ring allreduce sent %d bytes between hosts, want %d", keys, got, want)
		}
	}
}

// TestRootedHosts: binomial broadcast and reduce over hosts go through the
// hosts' chain order: right results from every root, and with hosts of
// equal power-of-two rank counts each other host is crossed to once (H-1
// messages of S bytes) where rank order crossed more on interleaved ranks.
func TestRootedHosts(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	const count = 64
	s := int64(4 * count)
	for _, keys := range []string{"A,B,A,B", "A,A,B,B", "A,B,C,D,A,B,C,D", "A,A,A,B,B", "B,A,C,A,C,B"} {
		n := strings.Count(keys, ",") + 1
		h := NewHostMap(strings.Split(keys, ","))
		withHosts(keys, func() {
			for root := range n {
				checkBroadcastLayout(t, rng, n, root)
				checkRootedReduce(t, rng, n, 7, combo{Float64, Sum}, root, false)
				checkRootedReduce(t, rng, n, 1000, combo{Int32, Max}, root, root%2 == 1)
			}
		})
		equal := true
		for i := range h.Hosts() {
			equal = equal && len(h.groups[i]) == len(h.groups[0]) && len(h.groups[0])&(len(h.groups[0])-1) == 0
		}
		if !equal {
			continue
		}
		least := int64(h.Hosts()-1) * s
		for root := range n {
			bc := crossBytes(t, keys, func(ctx context.Context, l Link) error {
				return Broadcast(ctx, l, make([]byte, s), root)
			})
			rd := crossBytes(t, keys, func(ctx context.Context, l Link) error {
				return Reduce(ctx, l, nil, make([]byte, s), Float32, Sum, root)
			})
			if bc != least || rd != least {
				t.Errorf("%s root %d: broadcast sent %d bytes between hosts, reduce %d; the least is %d", keys, root, bc, rd, least)
			}
		}
	}
}

// TestAlltoallHier: on hosts of equal rank counts the two-level all-to-all
// gives the flat schedules' results, in and out of place; each block
// crosses between hosts once,
// as in the flat schedules, in H-1 messages per rank instead of (H-1)·L.
func TestAlltoallHier(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for _, keys := range hierLayouts {
		n := strings.Count(keys, ",") + 1
		h := NewHostMap(strings.Split(keys, ","))
		withHosts(keys, func() {
			for _, force := range []Algorithm{AlgoAuto, AlgoHier} { // auto: the flat schedules
				withForce(&testTuning.Force.Alltoall, force, func() {
					for _, blk := range []int{0, 1, 7, 1000, 40000} {
						for _, inPlace := range []bool{false, true} {
							ins, outs := make([][]byte, n), make([][]byte, n)
							for r := range ins {
								ins[r], outs[r] = randBytes(rng, n*blk), make([]byte, n*blk)
								if inPlace {
									copy(outs[r], ins[r])
								}
							}
							runRanks(t, n, func(ctx context.Context, l Link) error {
								if inPlace {
									return Alltoall(ctx, l, nil, outs[l.Rank()])
								}
								return Alltoall(ctx, l, ins[l.Rank()], outs[l.Rank()])
							})
							for r := range outs {
								for s := range n {
									equalBytes(t, fmt.Sprintf("%s %v blk=%d inplace=%v rank %d from %d", keys, force, blk, inPlace, r, s),
										outs[r][s*blk:(s+1)*blk], ins[s][r*blk:(r+1)*blk])
								}
							}
						}
					}
				})
			}
		})
		const blk = 64
		per := int64(n / h.Hosts())
		wantBytes := int64(n) * int64(n-int(per)) * blk // every block for another host crosses once
		for _, c := range []struct {
			force Algorithm
			msgs  int64
		}{{AlgoHier, int64(n) * int64(h.Hosts()-1)}, {AlgoPairwise, int64(n) * int64(n-int(per))}} {
			var bytes, msgs int64
			withForce(&testTuning.Force.Alltoall, c.force, func() {
				bytes, msgs = crossCounts(t, keys, func(ctx context.Context, l Link) error {
					return Alltoall(ctx, l, make([]byte, n*blk), make([]byte, n*blk))
				})
			})
			if bytes != wantBytes || msgs != c.msgs {
				t.Errorf("%s %v: %d bytes in %d messages crossed between hosts, want %d in %d", keys, c.force, bytes, msgs, wantBytes, c.msgs)
			}
		}
	}
	// Unequal hosts: forcing hier fails.
	withHosts("A,A,A,B", func() {
		withForce(&testTuning.Force.Alltoall, AlgoHier, func() {
			err := tryRanks(4, 10*time.Second, func(ctx context.Context, l Link) error {
				return Alltoall(ctx, l, nil, make([]byte, 64))
			})
			if err == nil || !strings.Contains(err.Error(), "2 hosts (1-3 ranks)") {
				t.Fatalf("forced hier alltoall on unequal hosts: %v", err)
			}
		})
	})
}
