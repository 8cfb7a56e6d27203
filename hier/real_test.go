//go:build cgo

package hier

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
	"github.com/nexar-go/nexar/transport/mesh"
)

// TestRealNCCLHier runs the hierarchical collectives on real GPUs with real
// NCCL: two simulated hosts (Options.HostID), with one GPU 1+1 ranks (one
// rank per host: NCCL refuses two ranks of one communicator on one GPU),
// with two or more 2+2 (device = local index). Every collective is checked
// element by element; then each rank prints allreduce bus bandwidth at
// 64 MiB (median and p99 of 9) for this path, for staging the device buffer
// around nexar's host allreduce, and for host memory. It needs CUDA
// (NEXAR_CUDART or libcudart on the loader's path) and NCCL (NEXAR_NCCL or
// libnccl.so.2) and skips, saying so, without them. scripts/gpu_check.sh
// runs it from a prebuilt binary.
func TestRealNCCLHier(t *testing.T) {
	if os.Getenv("HIER_REAL_HOST") != "" {
		realRank(t)
		return
	}
	if err := nccl.Available(); err != nil {
		t.Skipf("skipping: needs NCCL and a CUDA device: %v", err)
	}
	hosts := []string{"A", "B"}
	if n, _ := cuda.DeviceCount(); n >= 2 {
		hosts = []string{"A", "A", "B", "B"}
	}
	port := freePort(t)
	outs := make([]string, len(hosts))
	errs := make([]error, len(hosts))
	done := make(chan int)
	for r, h := range hosts {
		dev := 0
		if len(hosts) == 4 {
			dev = r % 2
		}
		go func(r int) {
			cmd := execSelf("^TestRealNCCLHier$", "HIER_REAL_HOST="+h, fmt.Sprintf("HIER_REAL_DEVICE=%d", dev),
				fmt.Sprintf("NEXAR_RANK=%d", r), fmt.Sprintf("NEXAR_WORLD_SIZE=%d", len(hosts)),
				fmt.Sprintf("NEXAR_SEED=127.0.0.1:%d", port), "NEXAR_TOKEN=hier-real-test-0123456789abcdef")
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
			done <- r
		}(r)
	}
	for range hosts {
		<-done
	}
	for r := range outs {
		t.Logf("----- rank %d -----\n%s", r, outs[r])
		if errs[r] != nil {
			t.Errorf("rank %d failed: %v", r, errs[r])
		}
	}
}

func realRank(t *testing.T) {
	ctx := context.Background()
	cfg, err := core.ConfigFromLookup(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rt, err := cuda.Default()
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := strconv.Atoi(os.Getenv("HIER_REAL_DEVICE"))
	if err := rt.SetDevice(dev); err != nil {
		t.Fatal(err)
	}
	lib, err := nccl.Default()
	if err != nil {
		t.Fatal(err)
	}
	st := stage.New(rt, stage.Options{WaitTimeout: time.Minute})
	defer st.Close()
	h, err := New(ctx, c, Deps{Runtime: rt, Stager: st, NCCL: lib}, Options{Mode: On, HostID: os.Getenv("HIER_REAL_HOST"), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	stream, err := rt.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer rt.StreamDestroy(stream)
	m := &member{t: t, c: c, h: h, rt: rt, st: st, r: c.Rank(), n: c.Size(), stream: stream}
	m.collectives()
	fmt.Printf("rank %d: real nccl hier collectives ok\n", m.r)

	// Bus bandwidth at 64 MiB: this path, staging, host memory.
	const count = 16 << 20
	dt := collective.Float32
	nb := count * dt.Size()
	d, err := rt.Malloc(nb)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(d)
	host := make([]byte, nb)
	factor := 2 * float64(m.n-1) / float64(m.n)
	busbw := func(name string, call func() error) {
		var times []time.Duration
		for i := 0; i < 11; i++ {
			if err := c.Barrier(ctx); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := call(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if i >= 2 { // two warm-up rounds
				times = append(times, time.Since(start))
			}
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		bw := func(d time.Duration) float64 { return float64(nb) / d.Seconds() * factor / 1e9 }
		fmt.Printf("rank %d: allreduce 64 MiB float32 %-28s busbw median %.2f GB/s p99 %.2f GB/s\n",
			m.r, name, bw(times[len(times)/2]), bw(times[len(times)-1]))
	}
	busbw("nccl+nexar (device)", func() error {
		return h.Allreduce(ctx, d, d, count, dt, collective.Sum, 0, true)
	})
	busbw("staged (device)", func() error {
		call := st.Begin()
		b, err := call.Add(stage.Buf{Name: "buf", Ptr: uintptr(d), Len: nb, In: true, Out: true}, dev)
		if err != nil {
			return err
		}
		return call.Run(0, true, func() error { return c.Allreduce(ctx, nil, b, dt, collective.Sum) })
	})
	busbw("host memory", func() error { return c.Allreduce(ctx, nil, host, dt, collective.Sum) })
}
