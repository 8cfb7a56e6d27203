//go:build cgo

package bulk

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/transport"
	trdma "github.com/nexar-go/nexar/transport/rdma"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// gpuRDMAMesh is rdmaMesh on a device that moves device memory through rt;
// before edits each rank's endpoint before it starts.
func gpuRDMAMesh(t *testing.T, n int, rt *cuda.Runtime, h []transport.Handler, down []transport.DownHandler, before func(int, *Endpoint)) []*Endpoint {
	t.Helper()
	d, err := trdma.Open(trdma.Options{Library: fakeIBVerbs(t), Device: "fake_roce0", GPU: trdma.CUDA(rt)})
	if err != nil {
		t.Fatal(err)
	}
	eps := meshWith(t, n, Options{Mode: ModeRDMA, RDMA: &sharedRDMA{Device: d, refs: n}}, h, down, before)
	t.Cleanup(func() {
		for _, e := range eps {
			e.Close()
		}
	})
	return eps
}

func TestRDMADeviceDataPath(t *testing.T) {
	rt := cudatest.Fake(t)
	transporttest.RunDataPath(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath {
		eps := gpuRDMAMesh(t, n, rt, h, down, nil)
		out := make([]transport.DataPath, n)
		for i, e := range eps {
			if !e.Caps().Device {
				t.Fatal("Caps().Device is false on a device given a GPU runtime")
			}
			out[i] = e
		}
		return out
	})
}

// TestRDMADevicePayload sends payloads in device memory (below the
// channel's WRITE threshold, at it, and far above) with SendDevice, placed
// by the receiver into device memory or, for a receive not posted, handed
// to the Handler in host memory: the bytes arrive whole, no host code
// touches device memory (the fake would crash the test), and the path
// reports how the NIC reached it.
func TestRDMADevicePayload(t *testing.T) {
	rt := cudatest.Fake(t)
	sizes := []int{100, trdma.DefaultWriteMin, 1<<20 + 3}
	type placed struct {
		ptr  cuda.DevicePtr
		n    int
		done chan error
	}
	var mu sync.Mutex
	dst := map[int]*placed{} // by sequence number (header byte 0: 0 host, 1 placed)
	delivered := make(chan []byte, 8)
	h := []transport.Handler{nil, func(from int, lane transport.Lane, hd *transport.Header, p []byte) {
		if lane == transport.LaneData {
			delivered <- p
		}
	}}
	eps := gpuRDMAMesh(t, 2, rt, h, nil, func(i int, e *Endpoint) {
		if i != 1 {
			return
		}
		e.opt.Place = func(from int, hd *transport.Header, n int) ([]byte, func(error)) {
			mu.Lock()
			defer mu.Unlock()
			pl := dst[int(hd[1])]
			if hd[0] != 1 || pl == nil || pl.n != n {
				return nil, nil
			}
			return cudatest.Bytes(pl.ptr, n), func(err error) { pl.done <- err }
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for seq, n := range sizes {
		want := bytes.Repeat([]byte{byte(seq + 1), 0x5c, byte(n)}, n/3+1)[:n]
		src, err := rt.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Free(src)
		if err := rt.CopyToDevice(src, want); err != nil {
			t.Fatal(err)
		}
		into, err := rt.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Free(into)
		pl := &placed{ptr: into, n: n, done: make(chan error, 1)}
		mu.Lock()
		dst[seq] = pl
		mu.Unlock()
		for _, place := range []byte{1, 0} {
			var hd transport.Header
			hd[0], hd[1] = place, byte(seq)
			if err := eps[0].SendDevice(ctx, 1, &hd, cudatest.Bytes(src, n)); err != nil {
				t.Fatalf("%d bytes: SendDevice: %v", n, err)
			}
			got := make([]byte, n)
			if place == 1 {
				select {
				case err := <-pl.done:
					if err != nil {
						t.Fatalf("%d bytes placed in device memory: %v", n, err)
					}
				case <-ctx.Done():
					t.Fatalf("%d bytes: the placed payload never landed", n)
				}
				if err := rt.CopyFromDevice(got, into); err != nil {
					t.Fatal(err)
				}
			} else {
				select {
				case got = <-delivered:
				case <-ctx.Done():
					t.Fatalf("%d bytes: nothing delivered", n)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes (placed %v): the payload differs", n, place == 1)
			}
		}
	}
	if send, _ := eps[0].DeviceData(1); !send {
		t.Error("rank 0: DeviceData(1) does not report its channel to rank 1 as moving device memory")
	}
	if _, recv := eps[1].DeviceData(0); !recv {
		t.Error("rank 1: DeviceData(0) does not report its channel from rank 0 as moving device memory")
	}
	if p := eps[0].Paths()[1]; !strings.Contains(p, "gpu: dma-buf") {
		t.Errorf("rank 0's path to rank 1 is %q: it does not say device buffers went by dma-buf", p)
	}
	// A peer without a device channel: itself (loopback).
	var hd transport.Header
	if err := eps[0].SendDevice(ctx, 0, &hd, []byte{1}); !errors.Is(err, transport.ErrNoDevicePath) {
		t.Errorf("SendDevice to itself: %v, want ErrNoDevicePath", err)
	}
}
