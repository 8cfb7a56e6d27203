// Command tail shows where a small allreduce's slow iterations come from
// (issue 15 item 2; docs/performance.md, "The tail of a small allreduce"):
// each rank runs N (default 200000) allreduces of SIZE bytes (default 8),
// each after a barrier, after WARMUP (default 100) untimed ones, and
// prints its median, p90, p99, p99.9 and max and how many took over 10 µs.
// With LIST=1 rank 0 also prints each slow iteration's start on
// CLOCK_MONOTONIC, the clock of
// `perf record -k CLOCK_MONOTONIC`, so that a trace of the scheduler
// (sched_switch, sched_wakeup, local_timer_entry) can be matched to them.
// PROFILE=DIR writes each rank's CPU profile of the timed calls to
// DIR/rank-R.pprof. The calls are in place (the torch path's kind).
// One process per rank, under a launcher:
//
//	go build -o /tmp/tail ./bench/tail && build/nexar run -n 2 -- /tmp/tail
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

func envInt(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "tail: %s=%q: want a positive integer\n", name, v)
		os.Exit(2)
	}
	return n
}

func main() {
	n, size := envInt("N", 200000), envInt("SIZE", 8)
	list := os.Getenv("LIST") == "1"
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tail:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tail:", err)
		os.Exit(1)
	}
	defer c.Close()
	buf := make([]byte, size)
	run := func() {
		if err := c.Barrier(ctx); err != nil {
			panic(err)
		}
		if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
			panic(err)
		}
	}
	for range envInt("WARMUP", 100) {
		run()
	}
	if v := os.Getenv("SETTLE"); v != "" { // let start-up work end first (a Go duration)
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "tail: SETTLE=%q: %v\n", v, err)
			os.Exit(2)
		}
		time.Sleep(d)
		run()
	}
	if dir := os.Getenv("PROFILE"); dir != "" { // a CPU profile of the timed calls per rank
		f, err := os.Create(fmt.Sprintf("%s/rank-%d.pprof", dir, c.Rank()))
		if err != nil {
			panic(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			panic(err)
		}
		defer pprof.StopCPUProfile()
	}
	starts := make([]time.Duration, n)
	took := make([]time.Duration, n)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	t0, mono0 := time.Now(), time.Duration(ts.Nano())
	for i := range n {
		if err := c.Barrier(ctx); err != nil {
			panic(err)
		}
		t := time.Now()
		if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
			panic(err)
		}
		took[i] = time.Since(t)
		starts[i] = t.Sub(t0)
	}
	s := slices.Clone(took)
	slices.Sort(s)
	slow := 0
	for _, d := range took {
		if d > 10*time.Microsecond {
			slow++
		}
	}
	fmt.Printf("rank %d: %d × %d B allreduce: median %v p90 %v p99 %v p99.9 %v max %v; %d over 10µs\n",
		c.Rank(), n, size, s[n/2], s[n*9/10], s[n*99/100], s[n*999/1000], s[n-1], slow)
	if !list || c.Rank() != 0 {
		return
	}
	for i, d := range took {
		if d > 10*time.Microsecond {
			fmt.Printf("slow %d: CLOCK_MONOTONIC %.6f s, took %.1f µs\n", i, (mono0 + starts[i]).Seconds(), float64(d)/1e3)
		}
	}
}
