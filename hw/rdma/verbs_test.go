//go:build rdma && cgo

package rdma

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// TestDevicesLibverbs calls libibverbs even when sysfs lists nothing, to
// check that the binding itself works on a machine without hardware.
func TestDevicesLibverbs(t *testing.T) {
	devs, err := Devices()
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("skipping: libibverbs loaded and reports: %v", err)
	}
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	t.Logf("libibverbs lists %d devices", len(devs))
}

// TestLoopbackSend connects two RC QPs of the first device to each other and
// moves 64 KiB through them with SEND/RECV.
func TestLoopbackSend(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := ctx.NewCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	const n = 64 << 10
	src, dst := bytes.Repeat([]byte{0xa5}, n), make([]byte, n)
	var pin runtime.Pinner
	pin.Pin(&src[0])
	pin.Pin(&dst[0])
	defer pin.Unpin()
	rc, err := pd.NewRegCache(4)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sa, da := uintptr(unsafe.Pointer(&src[0])), uintptr(unsafe.Pointer(&dst[0]))
	sh, err := rc.Acquire(sa, n)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Release()
	dh, err := rc.Acquire(da, n)
	if err != nil {
		t.Fatal(err)
	}
	defer dh.Release()

	var qps [2]*QP
	var infos [2]QPInfo
	for i := range qps {
		if qps[i], err = pd.NewRCQP(ctx, cq, cq, 16, 16); err != nil {
			t.Fatal(err)
		}
		defer qps[i].Close()
		if err := qps[i].Init(1, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
		if infos[i], err = qps[i].Info(uint32(100 + i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range qps {
		if err := qps[i].Connect(infos[i], infos[1-i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := qps[1].PostRecv(dh.Value(), da, n, 2); err != nil {
		t.Fatal(err)
	}
	if err := qps[0].PostSend(sh.Value(), sa, n, 1, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	wc := make([]Completion, 4)
	for done := 0; done < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("timed out with %d of 2 completions", done)
		}
		k, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:k] {
			if err := c.Err(); err != nil {
				t.Fatal(err)
			}
		}
		done += k
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("received data differs from sent data")
	}
}
