package core

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/topology"
)

// BenchmarkScale measures a world of many ranks in this process (docs/scale.md):
// bootstrap time, connections per rank, goroutines and heap per rank,
// heartbeats per second, allreduce of 8 B and 1 MiB, payload relayed and
// the time to close, for each topology. Run once per configuration:
//
//	NEXAR_SCALE_RANKS=64,256,1024 NEXAR_SCALE_TOPOLOGIES=full,kregular:8,hypercube \
//	NEXAR_SCALE_TRANSPORT=mem go test ./core -run '^$' -bench Scale -benchtime 1x -timeout 60m
//
// NEXAR_SCALE_TRANSPORT=quic uses real QUIC on loopback (and allows
// ondemand:M, which the in-memory mesh refuses). Worlds whose full mesh
// would not fit (NEXAR_SCALE_MAX_FULL ranks, default 256) are skipped with
// their estimated cost. Processes on one host: bench/scale.
func BenchmarkScale(b *testing.B) {
	ranks := envInts("NEXAR_SCALE_RANKS", []int{64, 256})
	topos := strings.Split(envOr("NEXAR_SCALE_TOPOLOGIES", "full,kregular:8,hypercube"), ",")
	tr := envOr("NEXAR_SCALE_TRANSPORT", "mem")
	maxFull := envInts("NEXAR_SCALE_MAX_FULL", []int{256})[0]
	for _, n := range ranks {
		for _, ts := range topos {
			spec, err := topology.Parse(ts)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/%d/%s", tr, n, spec), func(b *testing.B) {
				if spec.Kind == topology.OnDemand && tr == "mem" {
					b.Skip("on demand needs QUIC (NEXAR_SCALE_TRANSPORT=quic)")
				}
				if spec.Kind != topology.OnDemand && !spec.Sparse(n) && n > maxFull {
					b.Skipf("full mesh of %d ranks: %d heartbeat loops and %d inbound queues at least; over NEXAR_SCALE_MAX_FULL=%d", n, n*(n-1), n*(n-1), maxFull)
				}
				for range b.N {
					scaleOnce(b, tr, n, spec)
				}
			})
		}
	}
}

func scaleOnce(b *testing.B, tr string, n int, spec topology.Spec) {
	cfg := Config{Timeout: 10 * time.Minute, ConnectTimeout: 10 * time.Minute, HeartbeatInterval: 500 * time.Millisecond,
		HeartbeatTimeout: 60 * time.Second, Topology: spec, Logger: testConfig().Logger}
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()
	start := time.Now()
	var comms []*Comm
	var err error
	switch tr {
	case "mem":
		comms, err = testNewLocal(n, cfg)
	case "quic":
		comms, err = testNewLocalQUIC(n, cfg)
	default:
		b.Fatalf("NEXAR_SCALE_TRANSPORT=%q: want mem or quic", tr)
	}
	if err != nil {
		b.Fatal(err)
	}
	boot := time.Since(start)
	closed := false
	defer func() {
		if !closed {
			closeAll(b, comms)
		}
	}()
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	gor := runtime.NumGoroutine() - g0
	heap := int64(m1.HeapInuse+m1.StackInuse) - int64(m0.HeapInuse+m0.StackInuse)
	heartbeats := func() (sum int64) {
		for _, c := range comms {
			sum += c.Stats().HeartbeatsSent
		}
		return sum
	}
	// Heartbeats over a window, counted where each rank sends them.
	hb0 := heartbeats()
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	hbRate := float64(heartbeats()-hb0) / time.Since(t0).Seconds() // the sleep overruns under load
	ctx := context.Background()
	timeAllreduce := func(size, reps int) []time.Duration {
		var ds []time.Duration
		bufs := make([][2][]byte, n)
		for i := range bufs {
			bufs[i] = [2][]byte{make([]byte, size), make([]byte, size)}
		}
		for range reps {
			t := time.Now()
			mustAllB(b, each(comms, func(c *Comm) error {
				return c.Allreduce(ctx, bufs[c.Rank()][0], bufs[c.Rank()][1], collective.Float32, collective.Sum)
			}))
			ds = append(ds, time.Since(t))
		}
		slices.Sort(ds)
		return ds
	}
	small := timeAllreduce(8, 7)
	large := timeAllreduce(1<<20, 3)
	var relayed int64
	conns := 0 // after the calls: on demand, the connections they left open
	for _, c := range comms {
		st := c.Stats()
		relayed += st.RelayedBytes
		conns += st.Connections
	}
	// Every rank closes at once, as the processes of a job would.
	t := time.Now()
	each(comms, func(c *Comm) error { return c.Close() })
	closed = true
	closeTime := time.Since(t)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(boot), "boot-ms")
	b.ReportMetric(float64(conns)/float64(n), "conns/rank")
	b.ReportMetric(float64(gor)/float64(n), "goroutines/rank")
	b.ReportMetric(float64(heap)/float64(n)/1024, "heap-KiB/rank")
	b.ReportMetric(hbRate, "heartbeats/s")
	b.ReportMetric(ms(small[len(small)/2]), "ar8B-med-ms")
	b.ReportMetric(ms(small[len(small)-1]), "ar8B-max-ms")
	b.ReportMetric(ms(large[len(large)/2]), "ar1MiB-med-ms")
	b.ReportMetric(ms(large[len(large)-1]), "ar1MiB-max-ms")
	b.ReportMetric(float64(relayed)/float64(n)/1024, "relayed-KiB/rank")
	b.ReportMetric(ms(closeTime), "close-ms")
}

func mustAllB(b *testing.B, errs []error) {
	b.Helper()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInts(k string, def []int) []int {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.Atoi(strings.TrimSpace(f))
		if err == nil {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return def
	}
	return out
}
