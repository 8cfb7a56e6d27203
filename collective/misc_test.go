package collective

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestChunking shrinks ChunkSize and PipelineSegment so that every
// algorithm splits its messages into many chunks and segments.
func TestChunking(t *testing.T) {
	old := testTuning
	testTuning.ChunkSize, testTuning.PipelineSegment = 64, 24
	defer func() { testTuning = old }()
	rng := rand.New(rand.NewPCG(13, 14))
	const count = 999
	for _, n := range []int{1, 2, 3, 5, 8} {
		for _, c := range []combo{{Float64, Sum}, {Int8, Bxor}, {Float16, Avg}} {
			for _, a := range []Algorithm{AlgoRecursiveDoubling, AlgoRing} {
				withForce(&testTuning.Force.Allreduce, a, func() { checkAllreduce(t, rng, n, count, c, false) })
			}
			for _, a := range []Algorithm{AlgoBinomial, AlgoRing} {
				withForce(&testTuning.Force.Reduce, a, func() { checkRootedReduce(t, rng, n, count, c, n-1, false) })
			}
			for _, a := range []Algorithm{AlgoRecursiveDoubling, AlgoPipeline} {
				withForce(&testTuning.Force.Scan, a, func() {
					checkScan(t, rng, n, count, c, false, false)
					checkScan(t, rng, n, count, c, true, true)
				})
			}
		}
		for _, a := range []Algorithm{AlgoBinomial, AlgoLinear} {
			withForce(&testTuning.Force.Gather, a, func() {
				withForce(&testTuning.Force.Scatter, a, func() {
					checkGather(t, rng, n, 333, n/2, false)
					checkScatter(t, rng, n, 333, n/2, false)
				})
			})
		}
		for _, a := range []Algorithm{AlgoBinomial, AlgoPipeline} {
			withForce(&testTuning.Force.Broadcast, a, func() {
				want := randBytes(rng, 1001)
				bufs := make([][]byte, n)
				for r := range bufs {
					bufs[r] = make([]byte, len(want))
				}
				copy(bufs[n-1], want)
				runRanks(t, n, func(ctx context.Context, l Link) error { return Broadcast(ctx, l, bufs[l.Rank()], n-1) })
				for r := range bufs {
					equalBytes(t, fmt.Sprintf("chunked broadcast %v n=%d rank %d", a, n, r), bufs[r], want)
				}
			})
		}
	}
}

func TestBarrier(t *testing.T) {
	for _, n := range worldSizes {
		var entered atomic.Int32
		runRanks(t, n, func(ctx context.Context, l Link) error {
			// Late arrivals must hold everyone back.
			time.Sleep(time.Duration(l.Rank()%3) * 5 * time.Millisecond)
			entered.Add(1)
			if err := Barrier(ctx, l); err != nil {
				return err
			}
			if got := entered.Load(); got != int32(n) {
				return fmt.Errorf("left barrier with %d of %d ranks entered", got, n)
			}
			return nil
		})
	}
}

func TestArgumentErrors(t *testing.T) {
	l := &memLink{newMemNet(2), 0}
	ctx := context.Background()
	b8 := make([]byte, 8)
	tests := []struct {
		name string
		err  error
	}{
		{"nil link", Allreduce(ctx, nil, nil, b8, Int32, Sum)},
		{"bad op", Allreduce(ctx, l, nil, b8, Float32, Band)},
		{"avg int", Allreduce(ctx, l, nil, b8, Int32, Avg)},
		{"bad dtype", Allreduce(ctx, l, nil, b8, DType(99), Sum)},
		{"length mismatch", Allreduce(ctx, l, make([]byte, 4), b8, Int32, Sum)},
		{"partial element", Allreduce(ctx, l, nil, make([]byte, 6), Int32, Sum)},
		{"root range", Broadcast(ctx, l, b8, 2)},
		{"reduce root", Reduce(ctx, l, b8, b8, Int8, Sum, -1)},
		{"rs blocks", ReduceScatter(ctx, l, b8, b8, Int8, Sum)},
		{"rs in place blocks", ReduceScatterInPlace(ctx, l, make([]byte, 7), Int8, Sum)},
		{"allgather", Allgather(ctx, l, b8, b8)},
		{"allgatherv counts", Allgatherv(ctx, l, nil, b8, []int{1}, []int{0})},
		{"allgatherv range", Allgatherv(ctx, l, nil, b8, []int{4, 5}, []int{0, 4})},
		{"alltoall", Alltoall(ctx, l, make([]byte, 4), b8)},
		{"alltoallv", Alltoallv(ctx, l, b8, []int{1, 1}, []int{0, 8}, b8, []int{1, 1}, []int{0, 1})},
		{"gather", Gather(ctx, l, b8, b8, 0)},
		{"gatherv", Gatherv(ctx, l, b8, b8, []int{4, 4}, []int{0, 4}, 0)},
		{"scatter", Scatter(ctx, l, b8, b8, 0)},
		{"scatterv", Scatterv(ctx, l, b8, []int{4, 4}, []int{0, 6}, nil, 0)},
		{"scan", Scan(ctx, l, make([]byte, 4), b8, Int8, Sum)},
		{"exscan op", Exscan(ctx, l, nil, b8, Float64, Bor)},
	}
	for _, tt := range tests {
		if tt.err == nil {
			t.Errorf("%s: no error", tt.name)
		} else if !strings.HasPrefix(tt.err.Error(), "collective: ") {
			t.Errorf("%s: error %q lacks the package prefix", tt.name, tt.err)
		}
	}
	withForce(&testTuning.Force.Allreduce, AlgoBruck, func() {
		l := &memLink{newMemNet(2), 0} // carries the forced tuning
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := Allreduce(ctx, l, nil, b8, Int32, Sum)
		if err == nil || !strings.Contains(err.Error(), "no bruck algorithm") {
			t.Errorf("forcing a foreign algorithm: %v, want an error naming it", err)
		}
	})
}

// TestFailureNoLeak makes one rank stay away (and, separately, fail), and
// checks that the others return an error before the deadline and that no
// goroutine outlives the calls.
func TestFailureNoLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	ops := map[string]func(ctx context.Context, l Link) error{
		"allreduce-ring": func(ctx context.Context, l Link) error {
			return Allreduce(ctx, l, nil, make([]byte, DefaultTuning().AllreduceRingThresholdMany), Float32, Sum)
		},
		"allreduce-rd": func(ctx context.Context, l Link) error {
			return Allreduce(ctx, l, nil, make([]byte, 64), Int64, Max)
		},
		"broadcast-pipeline": func(ctx context.Context, l Link) error {
			return Broadcast(ctx, l, make([]byte, 3<<20), 0)
		},
		"scan-chain": func(ctx context.Context, l Link) error {
			return Scan(ctx, l, nil, make([]byte, 2<<20), Uint8, Sum)
		},
		"gather": func(ctx context.Context, l Link) error {
			return Gatherv(ctx, l, make([]byte, 10), make([]byte, 50), []int{10, 10, 10, 10, 10}, []int{0, 10, 20, 30, 40}, 0)
		},
		// Blocks above InlineSendMax: an eager send to an absent rank
		// rightly succeeds, and the others would all finish.
		"scatter": func(ctx context.Context, l Link) error {
			return Scatter(ctx, l, make([]byte, 5*(InlineSendMax+4096)), make([]byte, InlineSendMax+4096), 0)
		},
		"alltoall": func(ctx context.Context, l Link) error { return Alltoall(ctx, l, nil, make([]byte, 50)) },
		"barrier":  func(ctx context.Context, l Link) error { return Barrier(ctx, l) },
	}
	for name, f := range ops {
		for _, mode := range []string{"absent", "failing"} {
			start := time.Now()
			err := tryRanks(5, 300*time.Millisecond, func(ctx context.Context, l Link) error {
				if l.Rank() == 3 {
					if mode == "absent" {
						return nil
					}
					return errors.New("injected")
				}
				return f(ctx, l)
			})
			if err == nil {
				t.Errorf("%s with rank 3 %s: no error", name, mode)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s with rank 3 %s: took %v", name, mode, d)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after:\n%s", base, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestTuning covers the defaults, validation and the digest that core puts
// in every signature: changing any one field must change the digest.
func TestTuning(t *testing.T) {
	d := DefaultTuning()
	if got := (Tuning{}).WithDefaults(); got != d {
		t.Fatalf("zero Tuning with defaults = %+v, want %+v", got, d)
	}
	if (Tuning{}).Digest() != d.Digest() {
		t.Fatal("a zero Tuning and the defaults have different digests")
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	for _, bad := range []Tuning{
		{ChunkSize: MaxChunkSize + 1}, {ChunkSize: -1}, {PipelineSegment: -5},
		{ScanChainThreshold: -1}, {Force: Forced{Alltoall: Algorithm(200)}},
	} {
		if err := bad.Validate(); err == nil || !strings.HasPrefix(err.Error(), "collective: ") {
			t.Errorf("Validate(%+v) = %v, want a collective: error", bad, err)
		}
	}
	seen := map[uint16]string{d.Digest(): "defaults"}
	variant := func(name string, t2 Tuning) {
		g := t2.Digest()
		if prev, dup := seen[g]; dup {
			t.Errorf("tuning %s has the same digest %04x as %s", name, g, prev)
		}
		seen[g] = name
	}
	for i := range d.sizes() {
		v := DefaultTuning()
		*v.sizes()[i] += 4096
		variant(fmt.Sprintf("size field %d", i), v)
	}
	forced := []*Algorithm{}
	for i := 0; i < 8; i++ {
		v := DefaultTuning()
		f := []*Algorithm{&v.Force.Allreduce, &v.Force.Reduce, &v.Force.Broadcast, &v.Force.Allgather,
			&v.Force.Gather, &v.Force.Scatter, &v.Force.Scan, &v.Force.Alltoall}
		*f[i] = AlgoBinomial
		forced = append(forced, f[i])
		variant(fmt.Sprintf("force field %d", i), v)
	}
	if len(forced) != len((&Forced{}).all()) {
		t.Fatalf("test covers %d forced fields, Forced has %d", len(forced), len((&Forced{}).all()))
	}
}
