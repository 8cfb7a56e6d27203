//go:build cgo && linux

package hier

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
)

// TestCrossGPUDirect: the hierarchy's crossing between hosts (allreduce,
// two simulated hosts of 2 ranks, in one process) goes by GPUDirect RDMA
// where every path of a piece's group moves device memory (the fake NIC
// reaching the fake CUDA's memory by dma-buf): the NIC moved device bytes
// and no Sum piece was staged. With the NIC refusing device memory the
// NIC moves no device bytes: a path not tried yet still offers GPUDirect,
// so the first call may choose it (the channel then stages, and the path
// says so from then on), and a later call is staged. Every result is
// right, Avg's too (staged either way: it divides by the world size).
func TestCrossGPUDirect(t *testing.T) {
	for _, gpudirect := range []bool{true, false} {
		t.Run(fmt.Sprintf("gpudirect=%v", gpudirect), func(t *testing.T) {
			rt := cudatest.Fake(t)
			if !gpudirect {
				t.Setenv("NEXAR_FAKE_IBV_DMABUF", "0")
				t.Setenv("NEXAR_FAKE_IBV_PEERMEM", "0")
			}
			_, ncPath := fakes(t)
			lib, err := nccl.Open(ncPath)
			if err != nil {
				t.Fatal(err)
			}
			vlib, _ := ibverbs.Cached()
			const p = 4
			hosts := []string{"A", "B", "A", "B"}
			comms := directWorld(t, rt, p, gpudirect)
			st := stage.New(rt, stage.Options{})
			ctx := context.Background()
			hs := make([]*Comm, p)
			if err := firstErr(each(comms, func(r int, c *core.Comm) error {
				var err error
				hs[r], err = New(ctx, c, Deps{Runtime: rt, Stager: st, NCCL: lib}, Options{Mode: On, HostID: hosts[r]})
				return err
			})); err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, h := range hs {
					h.Close()
				}
			}()
			before, err := ibverbs.Moved(vlib)
			if err != nil {
				t.Fatal(err)
			}
			const count = 70001
			var lastDirect int64 // pieces this rank sent by GPUDirect before the last call
			for call, op := range []collective.Op{collective.Sum, collective.Avg, collective.Sum} {
				if call == 2 {
					lastDirect, _ = hs[0].Crossings()
				}
				send := make([]cuda.DevicePtr, p)
				recv := make([]cuda.DevicePtr, p)
				streams := make([]cuda.Stream, p)
				for r := range p {
					v := make([]float64, count)
					for i := range v {
						v[i] = float64((i+r)%7 + 1)
					}
					send[r] = cudatest.Upload(t, rt, cudatest.Encode(collective.Float32, v))
					recv[r] = cudatest.Upload(t, rt, make([]byte, count*4))
					if streams[r], err = rt.StreamCreate(); err != nil {
						t.Fatal(err)
					}
				}
				if err := firstErr(each(comms, func(r int, c *core.Comm) error {
					return hs[r].Allreduce(ctx, send[r], recv[r], count, collective.Float32, op, streams[r], true)
				})); err != nil {
					t.Fatalf("%v: %v", op, err)
				}
				for r := range p {
					got := cudatest.Download(t, rt, streams[r], recv[r], count*4)
					for i := 0; i < count; i++ {
						want := 0.0
						for q := range p {
							want += float64((i+q)%7 + 1)
						}
						if op == collective.Avg {
							want /= p
						}
						if g := math.Float32frombits(binary.LittleEndian.Uint32(got[i*4:])); g != float32(want) {
							t.Fatalf("%v rank %d element %d: %v, want %v", op, r, i, g, want)
						}
					}
				}
			}
			// A broadcast from rank 1 (host B), after the allreduces.
			const bn = 50003
			bufs := make([]cuda.DevicePtr, p)
			bstreams := make([]cuda.Stream, p) // one each: in one process the legacy stream is shared
			want := make([]byte, bn)
			for i := range want {
				want[i] = byte(i*13 + 1)
			}
			for r := range p {
				b := make([]byte, bn)
				if r == 1 {
					copy(b, want)
				}
				bufs[r] = cudatest.Upload(t, rt, b)
				if bstreams[r], err = rt.StreamCreate(); err != nil {
					t.Fatal(err)
				}
			}
			dBefore, sBefore := hs[0].Crossings()
			if err := firstErr(each(comms, func(r int, c *core.Comm) error {
				return hs[r].Broadcast(ctx, bufs[r], bn, collective.Uint8, 1, bstreams[r], true)
			})); err != nil {
				t.Fatalf("broadcast: %v", err)
			}
			for r := range p {
				if got := cudatest.Download(t, rt, bstreams[r], bufs[r], bn); string(got) != string(want) {
					t.Fatalf("broadcast: rank %d got the wrong bytes", r)
				}
			}
			if d, s := hs[0].Crossings(); gpudirect && (d != dBefore+1 || s != sBefore) {
				t.Errorf("broadcast: %d pieces by GPUDirect, %d staged; want its piece by GPUDirect", d-dBefore, s-sBefore)
			}
			after, err := ibverbs.Moved(vlib)
			if err != nil {
				t.Fatal(err)
			}
			for r, h := range hs {
				direct, staged := h.Crossings()
				t.Logf("rank %d: %d pieces crossed by GPUDirect, %d staged", r, direct, staged)
				if gpudirect && (direct != 3 || staged != 1) { // one piece per call and rank: 2 sums, the broadcast
					t.Errorf("rank %d: %d direct, %d staged crossings; want the sums' and the broadcast's by GPUDirect, Avg's staged", r, direct, staged)
				}
			}
			if d, _ := hs[0].Crossings(); !gpudirect && d != lastDirect {
				// (the broadcast too: the last two calls were staged)
				t.Errorf("rank 0: the last call crossed by GPUDirect after the NIC refused device memory")
			}
			t.Logf("fake NIC moved: before %+v, after %+v", before, after)
			if moved := after.DmaBuf - before.DmaBuf; gpudirect && moved == 0 {
				t.Error("the fake NIC moved no bytes through dma-buf registrations")
			}
		})
	}
}
