//go:build cgo

package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	trdma "github.com/nexar-go/nexar/transport/rdma"
)

// devBuf is n bytes of device memory holding fill, and a []byte over it
// that host code must never touch.
type devBuf struct {
	rt  *cuda.Runtime
	ptr cuda.DevicePtr
	b   []byte
}

func newDevBuf(t *testing.T, rt *cuda.Runtime, fill []byte) *devBuf {
	t.Helper()
	p, err := rt.Malloc(len(fill))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Free(p) })
	if err := rt.CopyToDevice(p, fill); err != nil {
		t.Fatal(err)
	}
	return &devBuf{rt: rt, ptr: p, b: cudatest.Bytes(p, len(fill))}
}

func (d *devBuf) read(t *testing.T) []byte {
	t.Helper()
	got := make([]byte, len(d.b))
	if err := d.rt.CopyFromDevice(got, d.ptr); err != nil {
		t.Fatal(err)
	}
	return got
}

func devPattern(seed, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*seed + i>>9 + seed)
	}
	return p
}

// deviceP2P runs the point-to-point cases of device buffers between
// comms[0] (sender) and comms[1]: for each size, a receive posted before
// the message arrives, one posted after it was buffered, one from any
// source, and a too-small receive (truncated: the bytes that fit, nothing
// past the buffer, CodeTruncated).
func deviceP2P(t *testing.T, rt *cuda.Runtime, comms []*Comm, sizes []int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, r := comms[0], comms[1]
	tag := uint64(0)
	for _, n := range sizes {
		want := devPattern(n%251+3, n)
		src := newDevBuf(t, rt, want)
		check := func(what string, dst *devBuf, st Status, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%d bytes, %s: %v", n, what, err)
			}
			if st.Source != 0 || st.Count != n {
				t.Fatalf("%d bytes, %s: status %+v", n, what, st)
			}
			if !bytes.Equal(dst.read(t), want) {
				t.Fatalf("%d bytes, %s: the received bytes differ", n, what)
			}
		}
		t.Run(fmt.Sprintf("%d/posted first", n), func(t *testing.T) {
			tag++
			dst := newDevBuf(t, rt, make([]byte, n))
			req := r.IRecvDevice(dst.b, 0, tag)
			if err := s.SendDevice(ctx, src.b, 1, tag); err != nil {
				t.Fatal(err)
			}
			err := req.Wait(ctx)
			check("posted first", dst, req.Status(), err)
		})
		t.Run(fmt.Sprintf("%d/arrived first", n), func(t *testing.T) {
			tag++
			base := r.Stats().BytesBuffered
			if err := s.SendDevice(ctx, src.b, 1, tag); err != nil {
				t.Fatal(err)
			}
			for r.Stats().BytesBuffered < base+int64(n) {
				if ctx.Err() != nil {
					t.Fatal("the message was never buffered at the receiver")
				}
				time.Sleep(time.Millisecond)
			}
			dst := newDevBuf(t, rt, make([]byte, n))
			st, err := r.RecvDevice(ctx, dst.b, 0, tag)
			check("arrived first", dst, st, err)
		})
		t.Run(fmt.Sprintf("%d/any source", n), func(t *testing.T) {
			tag++
			dst := newDevBuf(t, rt, make([]byte, n))
			errc := make(chan error, 1)
			go func() { errc <- s.SendDevice(ctx, src.b, 1, tag) }()
			st, err := r.RecvDevice(ctx, dst.b, AnySource, tag)
			check("any source", dst, st, err)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
		t.Run(fmt.Sprintf("%d/truncated", n), func(t *testing.T) {
			for _, early := range []bool{false, true} {
				tag++
				const guard = 64
				fit := n / 2
				fill := bytes.Repeat([]byte{0xEE}, fit+guard)
				dst := newDevBuf(t, rt, fill)
				var req *Request
				if !early {
					req = r.IRecvDevice(dst.b[:fit], 0, tag)
				}
				if err := s.SendDevice(ctx, src.b, 1, tag); err != nil {
					t.Fatal(err)
				}
				if early {
					req = r.IRecvDevice(dst.b[:fit], 0, tag)
				}
				err := req.Wait(ctx)
				var ce *Error
				if !errors.As(err, &ce) || ce.Code != CodeTruncated || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes", n)) {
					t.Fatalf("early %v: %v, want CodeTruncated naming the message's length", early, err)
				}
				got := dst.read(t)
				if !bytes.Equal(got[:fit], want[:fit]) {
					t.Fatalf("early %v: the bytes that fit differ", early)
				}
				if !bytes.Equal(got[fit:], fill[fit:]) {
					t.Fatalf("early %v: bytes past the receive's buffer were written", early)
				}
			}
		})
	}
}

// TestDeviceP2PRDMA: device buffers between two ranks whose data path is
// an RDMA channel (the fake libibverbs) on a device given the (fake) CUDA
// runtime: sizes below, at and above the channel's WRITE threshold reach
// the NIC by dma-buf, whichever way the receive meets the message, and the
// path says so.
func TestDeviceP2PRDMA(t *testing.T) {
	rt := cudatest.Fake(t)
	lib, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_IBVERBS", lib)
	t.Setenv("NEXAR_IB_HCA", "fake_roce0")
	cfg := testConfig()
	cfg.Bulk, cfg.GPU = "rdma", trdma.CUDA(rt)
	comms, err := testNewLocalQUIC(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	for deadline := time.Now().Add(10 * time.Second); !comms[1].DevicePath(0, false); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rank 1's channel from rank 0 never moved device memory")
		}
	}
	if !comms[0].DevicePath(1, true) || !comms[1].DevicePath(AnySource, false) || comms[0].DevicePath(0, true) {
		t.Fatalf("DevicePath: send 0->1 %v, recv at 1 from any %v, send 0->0 %v",
			comms[0].DevicePath(1, true), comms[1].DevicePath(AnySource, false), comms[0].DevicePath(0, true))
	}
	deviceP2P(t, rt, comms, []int{100, trdma.DefaultWriteMin, 1<<20 + 3})
	for i, c := range comms {
		if p := c.Paths()[1-i]; !strings.Contains(p, "gpu: dma-buf") || strings.Contains(p, "staged") {
			t.Errorf("rank %d: path %q: device buffers did not all reach the NIC by dma-buf", i, p)
		}
	}
}

// TestDeviceP2PNoDevicePath: over a path that carries no device memory
// (in-process here), SendDevice copies to the host first and RecvDevice
// copies what arrives into device memory, with the runtime's copies only.
func TestDeviceP2PNoDevicePath(t *testing.T) {
	rt := cudatest.Fake(t)
	cfg := testConfig()
	cfg.GPU = trdma.CUDA(rt)
	comms, err := testNewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	if comms[0].DevicePath(1, true) || comms[1].DevicePath(0, false) {
		t.Fatal("DevicePath reports a device path in process")
	}
	deviceP2P(t, rt, comms, []int{100, 300000})
}

// TestDeviceP2PWithoutGPU: a communicator made without a GPU runtime
// refuses device buffers, naming the reason.
func TestDeviceP2PWithoutGPU(t *testing.T) {
	comms := newLocal(t, 2)
	ctx := context.Background()
	buf := make([]byte, 8)
	for _, err := range []error{comms[0].SendDevice(ctx, buf, 1, 0), func() error { _, err := comms[1].RecvDevice(ctx, buf, 0, 0); return err }()} {
		var ce *Error
		if !errors.As(err, &ce) || ce.Code != CodeInvalidArgument || !strings.Contains(err.Error(), "GPU runtime") {
			t.Errorf("%v, want CodeInvalidArgument naming the missing GPU runtime", err)
		}
	}
}
