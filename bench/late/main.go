// Command late times the wake-up of a rank waiting for a late peer, one
// process per rank (issue 15 item 2; docs/performance.md): rank 1 computes
// for LATE (a Go duration, default 1ms) before each 8-byte allreduce, rank 0
// waits in it, and rank 0 prints the median and 99th percentile of the time
// from rank 1's call to its own return over 500 calls, each after a
// barrier. Both ranks read one clock (CLOCK_MONOTONIC on one host), so run
// it on one host, under a launcher:
//
//	build/nexar run -n 2 -- go run ./bench/late
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

func main() {
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	late := time.Millisecond
	if v := os.Getenv("LATE"); v != "" {
		if late, err = time.ParseDuration(v); err != nil {
			panic(fmt.Sprintf("LATE=%q: %v", v, err))
		}
	}
	const n = 500
	buf := make([]byte, 8)
	stamp := make([]byte, 8)
	var wakes []int64
	for i := 0; i < n+5; i++ {
		if err := c.Barrier(ctx); err != nil {
			panic(err)
		}
		var called int64
		if c.Rank() == 1 {
			for t := time.Now(); time.Since(t) < late; {
			}
			called = time.Now().UnixNano()
		}
		if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
			panic(err)
		}
		ended := time.Now().UnixNano()
		binary.LittleEndian.PutUint64(stamp, uint64(called))
		if err := c.Allreduce(ctx, nil, stamp, collective.Int64, collective.Sum); err != nil {
			panic(err)
		}
		if c.Rank() == 0 && i >= 5 { // 5 warm-up calls
			wakes = append(wakes, ended-int64(binary.LittleEndian.Uint64(stamp)))
		}
	}
	if c.Rank() == 0 {
		slices.Sort(wakes)
		fmt.Printf("wake median %.1f us p99 %.1f us\n", float64(wakes[len(wakes)/2])/1e3, float64(wakes[(99*len(wakes)+99)/100-1])/1e3)
	}
}
