//go:build cgo && linux

package hier

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/internal/dtype"
	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport/mesh"
	trdma "github.com/nexar-go/nexar/transport/rdma"
)

// directWorld makes n ranks in this process whose data paths are RDMA
// channels of the fake NIC, with the fake CUDA runtime, and waits, when
// want, until every path moves device memory.
func directWorld(t *testing.T, rt *cuda.Runtime, n int, want bool) []*core.Comm {
	t.Helper()
	lib, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	cfg := core.Config{Timeout: 60 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler), NormalSysmon: true, Mesh: mesh.Builder{}, Bulk: "rdma", GPU: trdma.CUDA(rt)}
	cfg.RDMA.Library, cfg.RDMA.Device = lib, "fake_roce0"
	comms, err := core.NewLocalQUIC(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	for deadline := time.Now().Add(20 * time.Second); want; time.Sleep(time.Millisecond) {
		all := true
		for _, c := range comms {
			all = all && DirectPaths(c)
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the RDMA paths never all moved device memory")
		}
	}
	return comms
}

func each(comms []*core.Comm, f func(r int, c *core.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, c)
		}()
	}
	wg.Wait()
	return errs
}

func firstErr(errs []error) error {
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// TestDirect: device allreduce (uneven blocks), broadcast and allgather
// between 3 ranks whose paths are RDMA channels of the fake NIC. Where the
// NIC reaches device memory (dma-buf), Router.Direct picks GPUDirect on
// every rank at every call, the NIC moves device memory and the paths say
// so; where it cannot, it picks it only until the first device buffer
// showed that (the channel stages that one itself), then staging (here as
// Router's staged path does it: a copy to the host, the host collective, a
// copy back). The results are the host's, element by element, either way,
// and the host never touched device memory (the fake CUDA's device memory
// faults on host access).
func TestDirect(t *testing.T) {
	for _, gpudirect := range []bool{true, false} {
		t.Run(fmt.Sprintf("gpudirect=%v", gpudirect), func(t *testing.T) {
			rt := cudatest.Fake(t)
			if !gpudirect {
				t.Setenv("NEXAR_FAKE_IBV_DMABUF", "0")
				t.Setenv("NEXAR_FAKE_IBV_PEERMEM", "0")
			}
			lib, _ := ibverbs.Cached()
			const p = 3
			comms := directWorld(t, rt, p, gpudirect)
			// One router per process, as capi has; here the ranks share it.
			router := NewRouter()
			router.Probe(core.Config{CUDARuntime: os.Getenv("NEXAR_CUDART")})
			if router.Runtime() == nil {
				t.Fatal(router.Reason())
			}
			defer func() {
				for _, c := range comms {
					router.Release(c)
				}
			}()
			before, err := ibverbs.Moved(lib)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var chosen [][p]bool // per call, per rank: GPUDirect
			// call runs one device collective on every rank: direct, or
			// staged through host buffers of n bytes (host runs the host
			// collective on them).
			call := func(kind string, root int, x Collective, direct func(r int, d *Direct) error, n int, stage func(r int, c *core.Comm, host []byte) error) {
				t.Helper()
				var got [p]bool
				if err := firstErr(each(comms, func(r int, c *core.Comm) error {
					x := x
					x.Bufs = []uintptr{x.Bufs[r]}
					d, err := router.Direct(ctx, c, c, kind, root, x)
					if err != nil {
						return err
					}
					got[r] = d != nil
					if d != nil {
						return direct(r, d)
					}
					return stage(r, c, make([]byte, n))
				})); err != nil {
					t.Fatal(err)
				}
				chosen = append(chosen, got)
			}
			for _, tc := range []struct {
				dt    dtype.DType
				op    collective.Op
				count int
			}{{dtype.Float32, collective.Sum, 70001}, {dtype.Int64, collective.Max, 1001}, {dtype.Float32, collective.Avg, 2}, {dtype.BFloat16, collective.Sum, 7}} {
				in := make([][]float64, p)
				bufs := make([]cuda.DevicePtr, p)
				for r := range p {
					in[r] = make([]float64, tc.count)
					for i := range in[r] {
						in[r][i] = float64((r+1)*(i%13) + r)
					}
					bufs[r] = cudatest.Upload(t, rt, cudatest.Encode(tc.dt, in[r]))
				}
				nb := tc.count * tc.dt.Size()
				outs := bufs // in place, but for Max: into buffers of their own
				if tc.op == collective.Max {
					outs = make([]cuda.DevicePtr, p)
					for r := range outs {
						outs[r] = cudatest.Upload(t, rt, make([]byte, nb))
					}
				}
				x := Collective{Count: tc.count, DType: tc.dt, Op: tc.op, Reduces: true, Bufs: ptrs(bufs)}
				call("allreduce", 0, x, func(r int, d *Direct) error { return d.Allreduce(ctx, bufs[r], outs[r], tc.count, tc.dt, tc.op) }, nb,
					func(r int, c *core.Comm, host []byte) error {
						if err := rt.CopyFromDevice(host, bufs[r]); err != nil {
							return err
						}
						if err := c.Allreduce(ctx, host, host, tc.dt, tc.op); err != nil {
							return err
						}
						return rt.CopyToDevice(outs[r], host)
					})
				want := make([]float64, tc.count)
				for i := range want {
					for r := range p {
						switch {
						case r == 0:
							want[i] = in[r][i]
						case tc.op == collective.Max:
							want[i] = max(want[i], in[r][i])
						default:
							want[i] += in[r][i]
						}
					}
					if tc.op == collective.Avg {
						want[i] /= p
					}
				}
				wb := cudatest.Encode(tc.dt, want)
				for r := range p {
					if got := cudatest.Download(t, rt, 0, outs[r], len(wb)); string(got) != string(wb) {
						t.Fatalf("allreduce %v %v of %d: rank %d's result differs from the host's", tc.dt, tc.op, tc.count, r)
					}
					if outs[r] != bufs[r] {
						if got := cudatest.Download(t, rt, 0, bufs[r], nb); string(got) != string(cudatest.Encode(tc.dt, in[r])) {
							t.Fatalf("allreduce %v %v of %d: rank %d's send buffer changed", tc.dt, tc.op, tc.count, r)
						}
						rt.Free(outs[r])
					}
					rt.Free(bufs[r])
				}
			}
			// Broadcast from rank 1, then allgather, 300 KiB per rank.
			const n = 300 << 10
			src := make([]cuda.DevicePtr, p)
			dst := make([]cuda.DevicePtr, p)
			for r := range p {
				src[r] = cudatest.Upload(t, rt, pattern(r, n))
				dst[r] = cudatest.Upload(t, rt, make([]byte, p*n))
			}
			call("broadcast", 1, Collective{Count: n, DType: collective.Uint8, Bufs: ptrs(src)}, func(r int, d *Direct) error { return d.Broadcast(ctx, src[r], n, 1) }, n,
				func(r int, c *core.Comm, host []byte) error {
					if err := rt.CopyFromDevice(host, src[r]); err != nil {
						return err
					}
					if err := c.Broadcast(ctx, host, collective.Uint8, 1); err != nil {
						return err
					}
					return rt.CopyToDevice(src[r], host)
				})
			call("allgather", 0, Collective{Count: n, DType: collective.Uint8, Bufs: ptrs(src)}, func(r int, d *Direct) error { return d.Allgather(ctx, src[r], dst[r], n) }, p*n,
				func(r int, c *core.Comm, host []byte) error {
					own := make([]byte, n)
					if err := rt.CopyFromDevice(own, src[r]); err != nil {
						return err
					}
					if err := c.Allgather(ctx, own, host, collective.Uint8); err != nil {
						return err
					}
					return rt.CopyToDevice(dst[r], host)
				})
			for r := range p {
				got := cudatest.Download(t, rt, 0, dst[r], p*n)
				for q := range p {
					if string(got[q*n:(q+1)*n]) != string(pattern(1, n)) {
						t.Fatalf("rank %d: block %d of the allgather after the broadcast from rank 1 differs", r, q)
					}
				}
			}
			// Different calls (rank 2's count differs) fail on every rank
			// as mismatched, before any data moves.
			if errs := each(comms, func(r int, c *core.Comm) error {
				x := Collective{Count: n - r/2, DType: collective.Uint8, Bufs: []uintptr{uintptr(src[r])}}
				_, err := router.Direct(ctx, c, c, "broadcast", 1, x)
				return err
			}); core.CodeOf(errs[0]) != core.CodeMismatch || core.CodeOf(errs[1]) != core.CodeMismatch || core.CodeOf(errs[2]) != core.CodeMismatch {
				t.Errorf("different calls: %v", errs)
			}
			after, _ := ibverbs.Moved(lib)
			dma := after.DmaBuf - before.DmaBuf
			t.Logf("GPUDirect chosen per call and rank: %v; the fake NIC moved %d bytes through dma-buf registrations, %d through host ones", chosen, dma, after.Host-before.Host)
			for i, got := range chosen {
				// Without GPUDirect only the first call, before any device
				// buffer met the NIC, may choose it.
				if want := gpudirect || i == 0; got != [p]bool{want, want, want} {
					t.Errorf("call %d: GPUDirect chosen by rank %v, want %v on every rank", i, got, want)
				}
			}
			for r, c := range comms {
				path := fmt.Sprint(c.Paths())
				if strings.Contains(path, "dma-buf") != gpudirect || strings.Contains(path, "staged") == gpudirect {
					t.Errorf("rank %d: paths %q", r, path)
				}
			}
			if (dma > 0) != gpudirect {
				t.Errorf("%d bytes of device memory reached the NIC by dma-buf", dma)
			}
		})
	}
}

func ptrs(b []cuda.DevicePtr) []uintptr {
	out := make([]uintptr, len(b))
	for i, p := range b {
		out[i] = uintptr(p)
	}
	return out
}

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed*31 + i>>9)
	}
	return b
}
