package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
)

const benchSynopsis = "bench [-n N] [--min B] [--max B] [--iters K] [--ops LIST]"

// benchBufs are one rank's buffers for one (op, size).
type benchBufs struct{ send, recv []byte }

// benchOp is one collective as nccl-tests measures it: size is the total
// buffer size in bytes (the output of allgather, the input of
// reduce_scatter), factor turns algbw into busbw (DESIGN.md §7).
type benchOp struct {
	name   string
	op     string // reduction shown in the table
	factor func(n int) float64
	bufs   func(rank, n, count int) benchBufs
	run    func(ctx context.Context, c *core.Comm, b benchBufs) error
	check  func(rank, n, count int, b benchBufs) bool
}

var benchOps = []benchOp{
	{
		name: "allreduce", op: "sum",
		factor: func(n int) float64 { return 2 * float64(n-1) / float64(n) },
		bufs: func(rank, n, count int) benchBufs {
			return benchBufs{send: filled(count, float32(rank)), recv: make([]byte, 4*count)}
		},
		run: func(ctx context.Context, c *core.Comm, b benchBufs) error {
			return c.Allreduce(ctx, b.send, b.recv, collective.Float32, collective.Sum)
		},
		check: func(rank, n, count int, b benchBufs) bool { return all(b.recv, float32(n*(n-1)/2)) },
	},
	{
		name: "broadcast", op: "none",
		factor: func(int) float64 { return 1 },
		bufs: func(rank, n, count int) benchBufs {
			v := float32(-1)
			if rank == 0 {
				v = 42
			}
			return benchBufs{recv: filled(count, v)}
		},
		run: func(ctx context.Context, c *core.Comm, b benchBufs) error {
			return c.Broadcast(ctx, b.recv, collective.Float32, 0)
		},
		check: func(rank, n, count int, b benchBufs) bool { return all(b.recv, 42) },
	},
	{
		name: "allgather", op: "none",
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		bufs: func(rank, n, count int) benchBufs {
			return benchBufs{send: filled(count/n, float32(rank)), recv: make([]byte, 4*(count/n)*n)}
		},
		run: func(ctx context.Context, c *core.Comm, b benchBufs) error {
			return c.Allgather(ctx, b.send, b.recv, collective.Float32)
		},
		check: func(rank, n, count int, b benchBufs) bool {
			blk := 4 * (count / n)
			for j := range n {
				if !all(b.recv[j*blk:(j+1)*blk], float32(j)) {
					return false
				}
			}
			return true
		},
	},
	{
		name: "reduce_scatter", op: "sum",
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		bufs: func(rank, n, count int) benchBufs {
			return benchBufs{send: filled((count/n)*n, float32(rank)), recv: make([]byte, 4*(count/n))}
		},
		run: func(ctx context.Context, c *core.Comm, b benchBufs) error {
			return c.ReduceScatter(ctx, b.send, b.recv, collective.Float32, collective.Sum)
		},
		check: func(rank, n, count int, b benchBufs) bool { return all(b.recv, float32(n*(n-1)/2)) },
	},
	{
		name: "alltoall", op: "none",
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		bufs: func(rank, n, count int) benchBufs {
			return benchBufs{send: filled((count/n)*n, float32(rank)), recv: make([]byte, 4*(count/n)*n)}
		},
		run: func(ctx context.Context, c *core.Comm, b benchBufs) error {
			return c.Alltoall(ctx, b.send, b.recv, collective.Float32)
		},
		check: func(rank, n, count int, b benchBufs) bool {
			blk := 4 * (count / n)
			for j := range n {
				if !all(b.recv[j*blk:(j+1)*blk], float32(j)) {
					return false
				}
			}
			return true
		},
	},
}

func cmdBench(args []string, stdout io.Writer) error {
	fs := newFlagSet("bench", benchSynopsis, stdout)
	n := fs.Int("n", 4, "number of ranks, run in this process over QUIC on loopback")
	minB := fs.Int("min", 1<<10, "smallest size in bytes")
	maxB := fs.Int("max", 16<<20, "largest size in bytes")
	iters := fs.Int("iters", 5, "timed iterations per size (after one warm-up)")
	ops := fs.String("ops", "allreduce,broadcast,allgather,reduce_scatter,alltoall", "comma-separated collectives")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	if *n < 1 || *minB < 4 || *maxB < *minB || *iters < 1 {
		return usageError("bench: need -n >= 1, 4 <= --min <= --max, --iters >= 1")
	}
	var sel []benchOp
	for _, name := range strings.Split(*ops, ",") {
		found := false
		for _, o := range benchOps {
			if o.name == strings.TrimSpace(name) {
				sel, found = append(sel, o), true
			}
		}
		if !found {
			return usageError("bench: unknown collective %q", name)
		}
	}
	comms, err := core.NewLocalQUIC(*n, core.Config{})
	if err != nil {
		return err
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	fmt.Fprintf(stdout, "# nexar %s bench: %d ranks in one process, QUIC on loopback, float32, %d iterations\n", version, *n, *iters)
	failed := false
	for _, o := range sel {
		fmt.Fprintf(stdout, "#\n# %s\n# %12s %12s %8s %6s %12s %10s %10s %6s\n",
			o.name, "size(B)", "count", "type", "op", "time(us)", "algbw", "busbw", "check")
		for size := *minB; size <= *maxB; size *= 4 {
			count := size / 4
			t, ok, err := benchOne(comms, o, count, *iters)
			if err != nil {
				return fmt.Errorf("bench: %s of %d bytes: %w", o.name, size, err)
			}
			alg := float64(size) / t.Seconds() / 1e9
			check := "ok"
			if !ok {
				check, failed = "FAIL", true
			}
			fmt.Fprintf(stdout, "  %12d %12d %8s %6s %12.1f %10.3f %10.3f %6s\n",
				size, count, "float32", o.op, float64(t.Nanoseconds())/1e3, alg, alg*o.factor(*n), check)
		}
	}
	fmt.Fprintln(stdout, "# algbw, busbw in GB/s; busbw factors as in nccl-tests")
	if failed {
		return &exitError{code: 1, msg: "bench: some results were wrong (check column)"}
	}
	return nil
}

// benchOne runs one warm-up and iters timed calls of o on every rank and
// returns the mean time per call and whether every rank's result checked.
func benchOne(comms []*core.Comm, o benchOp, count, iters int) (time.Duration, bool, error) {
	n := len(comms)
	bufs := make([]benchBufs, n)
	for r := range n {
		bufs[r] = o.bufs(r, n, count)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	round := func() error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = o.run(ctx, c, bufs[r])
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := round(); err != nil {
		return 0, false, err
	}
	start := time.Now()
	for range iters {
		if err := round(); err != nil {
			return 0, false, err
		}
	}
	t := time.Since(start) / time.Duration(iters)
	ok := true
	for r := range n {
		ok = ok && o.check(r, n, count, bufs[r])
	}
	return t, ok, nil
}

func filled(count int, v float32) []byte {
	b := make([]byte, 4*count)
	for i := range count {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func all(b []byte, v float32) bool {
	for i := 0; i+4 <= len(b); i += 4 {
		if math.Float32frombits(binary.NativeEndian.Uint32(b[i:])) != v {
			return false
		}
	}
	return true
}
