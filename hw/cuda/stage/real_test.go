//go:build cgo

package stage

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/transport/mesh"
)

// TestRealCUDAAllreduce2Proc runs staged allreduce of real device memory
// between two processes (this test binary again, as ranks 0 and 1): the
// blocking and the stream-ordered variant, checked element by element, and
// then prints staged device against host allreduce bus bandwidth. It needs
// a GPU and the CUDA runtime (NEXAR_CUDART or libcudart on the loader's
// path) and skips, saying so, without them. scripts/gpu_check.sh runs it
// from a prebuilt binary.
func TestRealCUDAAllreduce2Proc(t *testing.T) {
	if os.Getenv("STAGE_REAL_RANK") != "" {
		realRank(t)
		return
	}
	if err := cuda.Available(); err != nil {
		t.Skipf("skipping: needs a CUDA device: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRealCUDAAllreduce2Proc$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "STAGE_REAL_RANK=1", fmt.Sprintf("NEXAR_RANK=%d", r), "NEXAR_WORLD_SIZE=2",
			fmt.Sprintf("NEXAR_SEED=127.0.0.1:%d", port), "NEXAR_TOKEN=0123456789abcdef0123456789abcdef")
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
		}(r)
	}
	wg.Wait()
	for r := range outs {
		t.Logf("----- rank %d -----\n%s", r, outs[r])
		if errs[r] != nil || !strings.Contains(outs[r], "real cuda ok") {
			t.Errorf("rank %d failed: %v", r, errs[r])
		}
	}
}

func f32s(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }

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
	st := New(rt, Options{WaitTimeout: time.Minute})
	defer st.Close()
	r, n := c.Rank(), c.Size()
	stream, err := rt.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer rt.StreamDestroy(stream)

	for _, count := range []int{2, 1000, 1 << 20, 16 << 20} {
		nb := 4 * count
		host := make([]byte, nb)
		for i := 0; i < count; i++ {
			binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(float32(r+1)*float32(i%1000)))
		}
		d, err := rt.Malloc(nb)
		if err != nil {
			t.Fatal(err)
		}
		for _, blocking := range []bool{true, false} {
			if err := rt.CopyToDevice(d, host); err != nil {
				t.Fatal(err)
			}
			err := stagedCall(st, stream, blocking, []Buf{{Name: "recvbuf", Ptr: uintptr(d), Len: nb, In: true, Out: true}},
				func(h [][]byte) error { return c.Allreduce(ctx, nil, h[0], collective.Float32, collective.Sum) })
			if err != nil {
				t.Fatalf("count %d blocking=%v: %v", count, blocking, err)
			}
			got := make([]byte, nb)
			if !blocking {
				// In stream order: a copy on the stream, then a sync.
				pin, err := rt.MallocHost(nb)
				if err != nil {
					t.Fatal(err)
				}
				if err := rt.MemcpyAsync(uintptr(unsafe.Pointer(&pin[0])), uintptr(d), nb, cuda.MemcpyDeviceToHost, stream); err != nil {
					t.Fatal(err)
				}
				if err := rt.StreamSynchronize(stream); err != nil {
					t.Fatal(err)
				}
				copy(got, pin)
				rt.FreeHost(pin)
			} else if err := rt.CopyFromDevice(got, d); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < count; i++ {
				want := float32(n*(n+1)/2) * float32(i%1000)
				if g := f32s(got, i); g != want {
					t.Fatalf("count %d blocking=%v: element %d = %v, want %v", count, blocking, i, g, want)
				}
			}
			fmt.Printf("rank %d: staged device allreduce of %d float32 (blocking=%v): correct\n", r, count, blocking)
		}
		rt.Free(d)
	}

	// Figures: staged device against host allreduce, 64 MiB, median of 7.
	const nb = 64 << 20
	d, err := rt.Malloc(nb)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(d)
	hostBuf := make([]byte, nb)
	busbw := func(f func() error) (float64, error) {
		var ts []float64
		for i := 0; i < 8; i++ {
			start := time.Now()
			if err := f(); err != nil {
				return 0, err
			}
			if i > 0 { // the first warms the pool and connections
				ts = append(ts, time.Since(start).Seconds())
			}
		}
		sort.Float64s(ts)
		return 2 * float64(n-1) / float64(n) * nb / ts[len(ts)/2] / 1e9, nil
	}
	dev, err := busbw(func() error {
		return stagedCall(st, 0, true, []Buf{{Name: "recvbuf", Ptr: uintptr(d), Len: nb, In: true, Out: true}},
			func(h [][]byte) error { return c.Allreduce(ctx, nil, h[0], collective.Float32, collective.Sum) })
	})
	if err != nil {
		t.Fatal(err)
	}
	hst, err := busbw(func() error { return c.Allreduce(ctx, nil, hostBuf, collective.Float32, collective.Sum) })
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("rank %d: 64 MiB float32 allreduce, 2 processes, median of 7: staged device %.2f GB/s busbw, host memory %.2f GB/s busbw\n", r, dev, hst)
	fmt.Printf("rank %d: real cuda ok\n", r)
}
