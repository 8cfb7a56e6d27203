package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

const benchSynopsis = "bench [-n N] [--ops LIST] [--sizes LIST | --min B --max B] [--iters K] [--dtype T] [--op OP] [--json] [--inproc] [--inplace]"

// benchOpts is one `nexar bench` invocation.
type benchOpts struct {
	n       int
	ops     []benchOp
	sizes   []int
	iters   int // 0: by size
	warmup  int
	dt      collective.DType
	op      collective.Op
	json    bool
	inproc  bool
	inplace bool // allreduce with recv as its input (torch.distributed's all_reduce)
	timeout time.Duration
	force   collective.Forced // --algo: the communicators' Tuning.Force
}

// benchBufs are one rank's buffers for one (op, size).
type benchBufs struct{ send, recv []byte }

// benchOp is one collective as nccl-tests measures it: the nominal size S
// is the buffer of allreduce/broadcast, the whole gathered or scattered
// array of allgather/reduce_scatter, and all that one rank sends for
// alltoall; factor turns algbw into busbw (nccl-tests' doc/PERFORMANCE.md).
type benchOp struct {
	name    string
	reduces bool // uses --op
	factor  func(n int) float64
	// layout returns the element counts of send and recv per rank for a
	// nominal size of S bytes, and S as actually used.
	layout func(S, es, n int) (send, recv, used int)
	run    func(ctx context.Context, c *core.Comm, b benchBufs, o *benchOpts) error
	// want is the expected value of element i of rank's result.
	want func(o *benchOpts, rank, n, i, recvCount int) float64
}

// rankValue is what rank r contributes (small integers: exact in every
// dtype, and their sums too, for any world size nexar bench runs).
func rankValue(r int) float64 { return float64(r%7 + 1) }

func reduceWant(o *benchOpts, n int) float64 {
	v := 0.0
	for r := range n {
		x := rankValue(r)
		switch {
		case r == 0:
			v = x
		case o.op == collective.Max:
			v = max(v, x)
		case o.op == collective.Min:
			v = min(v, x)
		default:
			v += x
		}
	}
	if o.op == collective.Avg {
		v /= float64(n)
	}
	return v
}

func equalLayout(S, es, n int) (int, int, int) {
	c := max(1, S/es)
	return c, c, c * es
}

func blockLayout(send, recv func(blk, n int) int) func(S, es, n int) (int, int, int) {
	return func(S, es, n int) (int, int, int) {
		blk := max(1, S/es/n)
		return send(blk, n), recv(blk, n), blk * n * es
	}
}

var benchOps = []benchOp{
	{
		name: "allreduce", reduces: true,
		factor: func(n int) float64 { return 2 * float64(n-1) / float64(n) },
		layout: equalLayout,
		run: func(ctx context.Context, c *core.Comm, b benchBufs, o *benchOpts) error {
			if o.inplace {
				return c.Allreduce(ctx, nil, b.recv, o.dt, o.op)
			}
			return c.Allreduce(ctx, b.send, b.recv, o.dt, o.op)
		},
		want: func(o *benchOpts, rank, n, i, rc int) float64 { return reduceWant(o, n) },
	},
	{
		name:   "broadcast",
		factor: func(int) float64 { return 1 },
		layout: equalLayout,
		run: func(ctx context.Context, c *core.Comm, b benchBufs, o *benchOpts) error {
			return c.Broadcast(ctx, b.recv, o.dt, 0)
		},
		want: func(o *benchOpts, rank, n, i, rc int) float64 { return rankValue(0) },
	},
	{
		name:   "allgather",
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		layout: blockLayout(func(b, n int) int { return b }, func(b, n int) int { return b * n }),
		run: func(ctx context.Context, c *core.Comm, b benchBufs, o *benchOpts) error {
			return c.Allgather(ctx, b.send, b.recv, o.dt)
		},
		want: func(o *benchOpts, rank, n, i, rc int) float64 { return rankValue(i / (rc / n)) },
	},
	{
		name: "reduce_scatter", reduces: true,
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		layout: blockLayout(func(b, n int) int { return b * n }, func(b, n int) int { return b }),
		run: func(ctx context.Context, c *core.Comm, b benchBufs, o *benchOpts) error {
			return c.ReduceScatter(ctx, b.send, b.recv, o.dt, o.op)
		},
		want: func(o *benchOpts, rank, n, i, rc int) float64 { return reduceWant(o, n) },
	},
	{
		name:   "alltoall",
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		layout: blockLayout(func(b, n int) int { return b * n }, func(b, n int) int { return b * n }),
		run: func(ctx context.Context, c *core.Comm, b benchBufs, o *benchOpts) error {
			return c.Alltoall(ctx, b.send, b.recv, o.dt)
		},
		want: func(o *benchOpts, rank, n, i, rc int) float64 { return rankValue(i / (rc / n)) },
	},
}

func cmdBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", benchSynopsis, stderr)
	n := fs.Int("n", 2, "number of local ranks to start (ignored under a launcher, which sets the world)")
	ops := fs.String("ops", "allreduce,broadcast,allgather,reduce_scatter,alltoall", "comma-separated collectives")
	sizes := fs.String("sizes", "", "comma-separated sizes in bytes (suffixes K, M, G: binary); overrides --min/--max")
	minB := fs.String("min", "8", "smallest size in bytes")
	maxB := fs.String("max", "64M", "largest size in bytes")
	factor := fs.Int("factor", 4, "size step of the --min..--max sweep")
	iters := fs.Int("iters", 0, "timed iterations per size (0: clamp(256 MiB / size, 5, 1000))")
	warmup := fs.Int("warmup", 3, "untimed iterations per size")
	dtype := fs.String("dtype", "float32", "element type")
	opName := fs.String("op", "sum", "reduction: sum, avg, min or max")
	asJSON := fs.Bool("json", false, "print one JSON object per result instead of the table")
	inproc := fs.Bool("inproc", false, "run the ranks as goroutines of this process, meshed as separate processes would be (QUIC on loopback, the shared-memory data path)")
	inplace := fs.Bool("inplace", false, "allreduce in place, the result over the input (as torch.distributed's all_reduce); other collectives are unchanged")
	timeout := fs.Duration("timeout", 10*time.Minute, "deadline of the whole run")
	profile := fs.String("cpuprofile", "", "write each rank's CPU profile to `DIR`/rank-R.pprof")
	algos := fs.String("algo", "", "force algorithms, e.g. allreduce=ring,broadcast=pipeline (see collective.Forced); default: chosen by size")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	o := benchOpts{n: *n, iters: *iters, warmup: *warmup, json: *asJSON, inproc: *inproc, inplace: *inplace, timeout: *timeout}
	var err error
	if o.sizes, err = benchSizes(*sizes, *minB, *maxB, *factor); err != nil {
		return usageError("bench: %v", err)
	}
	if o.dt, err = parseDType(*dtype); err != nil {
		return usageError("bench: %v", err)
	}
	switch strings.ToLower(*opName) {
	case "sum":
		o.op = collective.Sum
	case "avg":
		o.op = collective.Avg
	case "min":
		o.op = collective.Min
	case "max":
		o.op = collective.Max
	default:
		return usageError("bench: --op %q: want sum, avg, min or max", *opName)
	}
	if err := collective.Check(o.dt, o.op); err != nil {
		return usageError("bench: %v", err)
	}
	if err := forceAlgorithms(*algos, &o.force); err != nil {
		return usageError("bench: --algo: %v", err)
	}
	if o.n < 1 || o.iters < 0 || o.warmup < 0 {
		return usageError("bench: need -n >= 1, --iters >= 0, --warmup >= 0")
	}
	for _, name := range strings.Split(*ops, ",") {
		i := slices.IndexFunc(benchOps, func(b benchOp) bool { return b.name == strings.TrimSpace(name) })
		if i < 0 {
			return usageError("bench: unknown collective %q", name)
		}
		o.ops = append(o.ops, benchOps[i])
	}

	switch {
	case o.inproc:
		comms, err := core.NewLocalQUIC(o.n, core.Config{Tuning: collective.Tuning{Force: o.force}, Mesh: mesh.Builder{}})
		if err != nil {
			return err
		}
		defer func() {
			for _, c := range comms {
				c.Close()
			}
		}()
		return benchSweep(comms, &o, stdout)
	case inJob():
		cfg, err := core.ConfigFromEnv()
		if err != nil {
			return err
		}
		cfg.Tuning.Force = o.force
		if *profile != "" {
			f, err := os.Create(filepath.Join(*profile, fmt.Sprintf("rank-%d.pprof", cfg.Rank)))
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.ConnectTimeout+time.Minute)
		cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
		c, err := core.New(ctx, cfg)
		cancel()
		if err != nil {
			return err
		}
		defer c.Close()
		return benchSweep([]*core.Comm{c}, &o, stdout)
	}
	// Start the ranks: this same binary under the launcher, flags passed on.
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: finding this program to start the ranks: %w", err)
	}
	prog := append([]string{exe, "bench"}, args...)
	return launch(runOptions{n: o.n, bind: "127.0.0.1", grace: 5 * time.Second, prog: prog,
		stdout: stdout, stderr: stderr, plain: true})
}

// inJob reports whether a launcher (nexar run, torchrun, Slurm, Open MPI)
// made this process one rank of a job.
func inJob() bool {
	if _, ok := core.LookupKnob(nil, "NEXAR_WORLD_SIZE"); ok {
		return true
	}
	for _, v := range []string{"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// benchSweep runs every (op, size) on comms, which are the ranks this
// process drives (all of them with --inproc, else its own one). World rank
// 0 prints.
func benchSweep(comms []*core.Comm, o *benchOpts, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	n := comms[0].Size()
	var lead *core.Comm
	for _, c := range comms {
		if c.Rank() == 0 {
			lead = c
		}
	}
	say := func(format string, args ...any) {
		if lead != nil && !o.json {
			fmt.Fprintf(stdout, format, args...)
		}
	}
	where := "one process per rank"
	if o.inproc {
		where = "goroutine ranks in one process, loopback QUIC"
	}
	say("# nexar %s bench: %d ranks (%s), %s, op %s, %s\n", version, n, where, o.dt, o.op, itersDesc(o))
	if o.inplace {
		say("# allreduce in place: recv is the input (as torch.distributed's all_reduce)\n")
	}
	if lead != nil && !o.json {
		paths := lead.Paths()
		for r := 1; r < n; r++ {
			say("# data path rank 0 -> %d: %s\n", r, paths[r])
		}
	}
	failed := false
	for _, op := range o.ops {
		say("#\n# %s\n# %12s %12s %9s %6s %5s %11s %11s %11s %9s %9s %7s\n",
			op.name, "size(B)", "count", "type", "redop", "root", "time(us)", "p99(us)", "mean(us)", "algbw", "busbw", "#wrong")
		for _, size := range o.sizes {
			res := make([]benchResult, len(comms))
			errs := make([]error, len(comms))
			var wg sync.WaitGroup
			for i, c := range comms {
				wg.Go(func() { res[i], errs[i] = benchOne(ctx, c, op, size, o) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("bench: %s of %d bytes: %w", op.name, size, err)
			}
			if lead == nil {
				continue
			}
			r := res[slices.Index(comms, lead)]
			if r.wrong > 0 {
				failed = true
			}
			med := r.median.Seconds()
			alg := float64(r.used) / med / 1e9
			if o.json {
				line, _ := json.Marshal(map[string]any{
					"system": "nexar", "op": op.name, "bytes": r.used, "ranks": n,
					"dtype": o.dt.String(), "time_us": round2(med * 1e6), "p99_us": round2(r.p99.Seconds() * 1e6), "mean_us": round2(r.mean.Seconds() * 1e6),
					"algbw_gbs": round4(alg), "busbw_gbs": round4(alg * op.factor(n)), "cpu_us": round2(r.cpu.Seconds() * 1e6),
					"iters": r.iters, "wrong": r.wrong, "path": lead.Paths()[min(1, n-1)], "inplace": o.inplace && op.name == "allreduce",
					"stats": statsJSON(lead.Stats()),
				})
				fmt.Fprintln(stdout, string(line))
				continue
			}
			redop, root := "none", "-1"
			if op.reduces {
				redop = o.op.String()
			}
			if op.name == "broadcast" {
				root = "0"
			}
			say("  %12d %12d %9s %6s %5s %11.1f %11.1f %11.1f %9.3f %9.3f %7d\n",
				r.used, r.used/o.dt.Size(), o.dt, redop, root, med*1e6, r.p99.Seconds()*1e6, r.mean.Seconds()*1e6, alg, alg*op.factor(n), r.wrong)
		}
	}
	say("# time: median of the timed iterations on rank 0, each started after a barrier; their 99th percentile and mean alongside\n")
	say("# algbw, busbw in GB/s (1e9 B/s), busbw factors as in nccl-tests; #wrong: elements that differ from the expected result, all ranks\n")
	if lead != nil {
		st := lead.Stats()
		say("# stats of rank 0 (docs/memory.md; NEXAR_MEMORY_PROFILE sets the budgets): buffered %d B, rings %d B, relayed %d B (per process); scratch %d B, sent %d messages, %d B, received %d B (per communicator)\n",
			st.BytesBuffered, st.RingBytes, st.RelayedBytes, st.ScratchBytes, st.MessagesSent, st.BytesSent, st.BytesReceived)
	}
	if failed {
		return &exitError{code: 1, msg: "bench: some results were wrong (#wrong column)"}
	}
	return nil
}

func itersDesc(o *benchOpts) string {
	if o.iters > 0 {
		return fmt.Sprintf("%d warm-up + %d timed iterations", o.warmup, o.iters)
	}
	return fmt.Sprintf("%d warm-up + clamp(256 MiB / size, 5, 1000) timed iterations", o.warmup)
}

type benchResult struct {
	used         int
	median, mean time.Duration
	cpu          time.Duration // this process's CPU time per timed call, barrier included
	p99          time.Duration // nearest rank: the ceil(0.99 n)-th smallest
	iters        int
	wrong        int64 // over all ranks
}

// benchOne measures one (op, size) on one rank. Every rank computes the
// same iteration count from the size, so no agreement is needed.
func benchOne(ctx context.Context, c *core.Comm, op benchOp, size int, o *benchOpts) (benchResult, error) {
	n, rank, es := c.Size(), c.Rank(), o.dt.Size()
	sc, rc, used := op.layout(size, es, n)
	var b benchBufs
	var free func()
	b.recv, free = benchAlloc(rc * es)
	defer free()
	fill(b.recv, o.dt, rankValue(rank))
	if op.name == "broadcast" {
		if rank != 0 {
			fill(b.recv, o.dt, -1)
		}
	} else {
		b.send, free = benchAlloc(sc * es)
		defer free()
		fill(b.send, o.dt, rankValue(rank))
	}
	iters := o.iters
	if iters == 0 {
		iters = max(5, min(1000, (256<<20)/max(used, 1)))
	}
	// Collect the previous size's buffers now: a GC cycle during the timed
	// calls would measure this program's garbage, not nexar (the Python
	// and C benchmarks' buffers are not on a Go heap at all).
	runtime.GC()
	for range o.warmup {
		if err := op.run(ctx, c, b, o); err != nil {
			return benchResult{}, err
		}
	}
	times := make([]time.Duration, iters)
	cpu0 := cpuTime()
	for i := range times {
		if op.name == "broadcast" && rank != 0 {
			fill(b.recv, o.dt, -1) // a stale result must not pass the check
		}
		if err := c.Barrier(ctx); err != nil {
			return benchResult{}, err
		}
		t := time.Now()
		if err := op.run(ctx, c, b, o); err != nil {
			return benchResult{}, err
		}
		times[i] = time.Since(t)
	}
	cpu := cpuTime() - cpu0
	if o.inplace && op.name == "allreduce" {
		// The timed calls reduced the result into itself: check one call
		// on fresh input.
		fill(b.recv, o.dt, rankValue(rank))
		if err := op.run(ctx, c, b, o); err != nil {
			return benchResult{}, err
		}
	}
	wrong := int64(0)
	tol := map[collective.DType]float64{collective.Float16: 1e-3, collective.BFloat16: 1e-2,
		collective.Float32: 1e-6, collective.Float64: 1e-12}[o.dt] // avg divides; the rest is exact
	for i := range rc {
		if got, want := get(b.recv, o.dt, i), op.want(o, rank, n, i, rc); math.Abs(got-want) > tol*math.Abs(want) {
			wrong++
		}
	}
	w := make([]byte, 8)
	binary.LittleEndian.PutUint64(w, uint64(wrong))
	if err := c.Allreduce(ctx, nil, w, collective.Int64, collective.Sum); err != nil {
		return benchResult{}, err
	}
	var sum time.Duration
	for _, t := range times {
		sum += t
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	return benchResult{used: used, median: times[len(times)/2], p99: times[(99*len(times)+99)/100-1], mean: sum / time.Duration(iters),
		iters: iters, wrong: int64(binary.LittleEndian.Uint64(w)), cpu: cpu / time.Duration(iters)}, nil
}

// cpuTime is this process's CPU time so far, user and system, all threads
// (zero where getrusage fails).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// forceAlgorithms fills force from "op=algo,..." (every rank parses the
// same flags, and the tuning digest in each call's signature checks that
// they agree).
func forceAlgorithms(spec string, force *collective.Forced) error {
	if spec == "" {
		return nil
	}
	fields := map[string]*collective.Algorithm{
		"allreduce": &force.Allreduce, "reduce": &force.Reduce,
		"broadcast": &force.Broadcast, "allgather": &force.Allgather,
		"gather": &force.Gather, "scatter": &force.Scatter,
		"scan": &force.Scan, "alltoall": &force.Alltoall,
	}
	for _, kv := range strings.Split(spec, ",") {
		op, name, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f := fields[op]
		if !ok || f == nil {
			return fmt.Errorf("%q: want op=algorithm with op one of allreduce, reduce, broadcast, allgather, gather, scatter, scan, alltoall", kv)
		}
		a, err := collective.ParseAlgorithm(name)
		if err != nil {
			return err
		}
		*f = a
	}
	return nil
}

// benchSizes is the explicit list, or min..max by factor.
func benchSizes(list, minS, maxS string, factor int) ([]int, error) {
	if list != "" {
		var out []int
		for _, s := range strings.Split(list, ",") {
			v, err := parseSize(s)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	lo, err := parseSize(minS)
	if err != nil {
		return nil, err
	}
	hi, err := parseSize(maxS)
	if err != nil {
		return nil, err
	}
	if hi < lo || factor < 2 {
		return nil, fmt.Errorf("need --min <= --max and --factor >= 2")
	}
	var out []int
	for s := lo; s <= hi; s *= factor {
		out = append(out, s)
	}
	return out, nil
}

// parseSize reads "8", "4K", "64M", "1G" (binary multiples).
func parseSize(s string) (int, error) {
	s = strings.TrimSpace(s)
	mult := 1
	if s != "" {
		switch strings.ToUpper(s[len(s)-1:]) {
		case "K":
			mult = 1 << 10
		case "M":
			mult = 1 << 20
		case "G":
			mult = 1 << 30
		}
		if mult > 1 {
			s = s[:len(s)-1]
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 || v > (16<<30)/mult {
		return 0, fmt.Errorf("size %q is not a byte count in [1, 16G]", s)
	}
	return v * mult, nil
}

func parseDType(s string) (collective.DType, error) {
	for d := collective.Int8; d.Valid(); d++ {
		if d.String() == strings.ToLower(s) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

// fill sets every element of b to v.
func fill(b []byte, dt collective.DType, v float64) {
	es := dt.Size()
	if len(b) < es {
		return
	}
	put(b[:es], dt, v)
	for off := es; off < len(b); off *= 2 {
		copy(b[off:], b[:off])
	}
}

func put(b []byte, dt collective.DType, v float64) {
	le := binary.LittleEndian
	switch dt {
	case collective.Int8, collective.Uint8:
		b[0] = byte(int8(v))
	case collective.Int32, collective.Uint32:
		le.PutUint32(b, uint32(int32(v)))
	case collective.Int64, collective.Uint64:
		le.PutUint64(b, uint64(int64(v)))
	case collective.Float16:
		le.PutUint16(b, collective.F32ToF16(float32(v)))
	case collective.BFloat16:
		le.PutUint16(b, collective.F32ToBF16(float32(v)))
	case collective.Float32:
		le.PutUint32(b, math.Float32bits(float32(v)))
	case collective.Float64:
		le.PutUint64(b, math.Float64bits(v))
	}
}

func get(b []byte, dt collective.DType, i int) float64 {
	le := binary.LittleEndian
	b = b[i*dt.Size():]
	switch dt {
	case collective.Int8:
		return float64(int8(b[0]))
	case collective.Uint8:
		return float64(b[0])
	case collective.Int32:
		return float64(int32(le.Uint32(b)))
	case collective.Uint32:
		return float64(le.Uint32(b))
	case collective.Int64:
		return float64(int64(le.Uint64(b)))
	case collective.Uint64:
		return float64(le.Uint64(b))
	case collective.Float16:
		return float64(collective.F16ToF32(le.Uint16(b)))
	case collective.BFloat16:
		return float64(collective.BF16ToF32(le.Uint16(b)))
	case collective.Float32:
		return float64(math.Float32frombits(le.Uint32(b)))
	}
	return math.Float64frombits(le.Uint64(b))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }
func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }

// statsJSON is rank 0's core.Stats in a --json result line (after that
// size's iterations; docs/memory.md says which figures are per process).
func statsJSON(st core.Stats) map[string]int64 {
	return map[string]int64{
		"bytes_buffered": st.BytesBuffered, "scratch_bytes": st.ScratchBytes, "ring_bytes": st.RingBytes,
		"relayed_bytes": st.RelayedBytes, "messages_sent": st.MessagesSent, "bytes_sent": st.BytesSent,
		"bytes_received": st.BytesReceived,
	}
}
