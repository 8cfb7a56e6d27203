//go:build cgo

package rdma

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/nexar-go/nexar/hw/cuda/cudatest"
)

var (
	fakeCUDA = cudatest.Fake
	devSlice = cudatest.Bytes
)

// TestGPUDirect sends a buffer of device memory and receives into device
// memory, registered with the NIC by dma-buf, as peer memory, or staged
// through host memory, as the fakes are told the driver, kernel and NIC
// allow; each way moves the bytes without a host access to device memory
// (which would crash the test) and is the one reported.
func TestGPUDirect(t *testing.T) {
	rt := fakeCUDA(t)
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"dma-buf", nil, WayDmaBuf},
		{"peer memory: no dma-buf export", map[string]string{"NEXAR_FAKE_CUDA_DMABUF": "0", "NEXAR_FAKE_IBV_PEERMEM": "1"}, WayPeer},
		{"peer memory: a NIC kernel without dma-buf", map[string]string{"NEXAR_FAKE_IBV_DMABUF": "0", "NEXAR_FAKE_IBV_PEERMEM": "1"}, WayPeer},
		{"staged", map[string]string{"NEXAR_FAKE_CUDA_DMABUF": "0"}, WayStaged},
	}
	const n = 1<<20 + 4096 + 17
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			a := openDev(t, Options{Device: "fake_roce0", GPU: CUDA(rt)})
			b := openDev(t, Options{Device: "fake_roce0", GPU: CUDA(rt)})
			tx, rx := pair(t, a, b)
			if d := tx.Detail(); d != "gpu: direct, untried" {
				t.Errorf("before the first device buffer: Detail() = %q", d)
			}
			src, err := rt.Malloc(n)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Free(src)
			dst, err := rt.Malloc(n)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Free(dst)
			small, err := rt.Malloc(100)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Free(small)
			want := pattern(3, n)
			if err := rt.CopyToDevice(src, want); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				// A device buffer, then host bytes read into device memory.
				_, err := tx.Write(ctx, devSlice(src, n), want[:100])
				errc <- err
			}()
			if _, err := io.ReadFull(rx, devSlice(dst, n)); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(rx, devSlice(small, 100)); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n)
			if err := rt.CopyFromDevice(got, dst); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("device buffer differs")
			}
			if err := rt.CopyFromDevice(got[:100], small); err != nil || !bytes.Equal(got[:100], want[:100]) {
				t.Fatalf("host bytes read into device memory differ (%v)", err)
			}
			for name, d := range map[string]*Device{"sender": a, "receiver": b} {
				if w := d.GPUWays(); len(w) != 1 || w[tt.want] != 1 {
					t.Errorf("%s: device buffers went %v, want one by %s", name, w, tt.want)
				}
			}
			if d := tx.Detail(); d != "gpu: "+tt.want+" 1" {
				t.Errorf("Detail() = %q", d)
			}
		})
	}
}

// TestNoGPUDirectWithoutGPU: without Options.GPU, device memory is not
// known as such: registration fails as the kernel fails it (EFAULT), with
// an error, not a crash.
func TestNoGPUDirectWithoutGPU(t *testing.T) {
	rt := fakeCUDA(t)
	a, b := openDev(t, Options{Device: "fake_ib0"}), openDev(t, Options{Device: "fake_ib0"})
	tx, _ := pair(t, a, b)
	if d := tx.Detail(); d != "" {
		t.Errorf("Detail() = %q without a GPU runtime", d)
	}
	src, err := rt.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(src)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := tx.Write(ctx, devSlice(src, 1<<20)); err == nil {
		t.Fatal("a device buffer was sent without GPU support")
	} else {
		t.Log(err)
	}
}
