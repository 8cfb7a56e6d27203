//go:build cgo

package hier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
	"github.com/nexar-go/nexar/tests/fakes/hip"
	"github.com/nexar-go/nexar/transport/mesh"
)

// countingProber answers from a table and counts the questions.
type countingProber struct {
	mu    sync.Mutex
	kinds map[uintptr]cuda.MemoryType
	fail  map[uintptr]bool
	asked map[uintptr]int
}

func (c *countingProber) PointerType(p uintptr) (cuda.MemoryType, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked[p]++
	if c.fail[p] {
		return 0, -1, errors.New("boom")
	}
	t := c.kinds[p]
	if t == cuda.Device {
		return t, 1, nil
	}
	return t, -2, nil
}

// TestKinds checks the caching rule (Kinds' doc): device and plain host
// answers are asked once, page-locked and managed memory every time,
// errors are not kept, Forget and Purge drop answers, and the cache is
// bounded.
func TestKinds(t *testing.T) {
	pr := &countingProber{
		kinds: map[uintptr]cuda.MemoryType{0x1000: cuda.Device, 0x2000: cuda.Unregistered, 0x3000: cuda.Host, 0x4000: cuda.Managed},
		fail:  map[uintptr]bool{0x5000: true},
		asked: map[uintptr]int{},
	}
	k := NewKinds(pr)
	k.readable = func(p uintptr) bool { return p != 0x6000 } // the table's addresses are not mapped
	pr.kinds[0x6000] = cuda.Unregistered
	for range 3 {
		for p, want := range map[uintptr]Place{0x1000: {true, 1}, 0x2000: Host, 0x3000: Host, 0x4000: Host} {
			got, err := k.Of(p)
			if err != nil || got != want {
				t.Fatalf("Of(%#x) = %v, %v; want %v", p, got, err, want)
			}
		}
		if _, err := k.Of(0x5000); err == nil {
			t.Fatal("Of(0x5000): no error")
		}
		// Unknown to the runtime and not readable: an error naming it,
		// asked again each time (not remembered).
		var u *UnknownPointerError
		if _, err := k.Of(0x6000); !errors.As(err, &u) || u.Ptr != 0x6000 || !strings.Contains(err.Error(), "0x6000") {
			t.Fatalf("Of(0x6000) unreadable: %v, want an UnknownPointerError naming it", err)
		}
	}
	want := map[uintptr]int{0x1000: 1, 0x2000: 1, 0x3000: 3, 0x4000: 3, 0x5000: 3, 0x6000: 3}
	for p, n := range want {
		if pr.asked[p] != n {
			t.Errorf("%#x asked %d times, want %d", p, pr.asked[p], n)
		}
	}
	if pl, _ := k.Of(0); pl != Host || pr.asked[0] != 0 {
		t.Errorf("Of(0) = %v after %d questions; want host, none", pl, pr.asked[0])
	}
	k.Forget(0x1000)
	k.Of(0x1000)
	k.Of(0x2000)
	if pr.asked[0x1000] != 2 || pr.asked[0x2000] != 1 {
		t.Errorf("after Forget(0x1000): asked %d and %d times, want 2 and 1", pr.asked[0x1000], pr.asked[0x2000])
	}
	k.Purge()
	k.Of(0x2000)
	if pr.asked[0x2000] != 2 {
		t.Errorf("after Purge: 0x2000 asked %d times, want 2", pr.asked[0x2000])
	}
	for i := range KindCacheSize + 100 {
		k.Of(0x10000 + uintptr(i)*8)
	}
	if k.Len() != KindCacheSize {
		t.Errorf("Len = %d, want the bound %d", k.Len(), KindCacheSize)
	}
}

// TestRouterNoDevice: without a CUDA runtime every buffer the host can
// read is host memory, nothing is routed, and a stream is refused.
func TestRouterNoDevice(t *testing.T) {
	r := NewRouter()
	y := []byte{1}
	if pl, err := r.Place(uintptr(unsafe.Pointer(&y[0]))); err != nil || pl != Host {
		t.Fatalf("Place = %v, %v", pl, err)
	}
	if _, err := r.Begin(true, true, cuda.Stream(7)); !errors.As(err, new(*ArgError)) {
		t.Fatalf("Begin with a stream and no CUDA: %v, want an ArgError", err)
	}
	c, err := r.Begin(false, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	x := []byte{1, 2, 3}
	b, err := c.Buf("buf", unsafe.Pointer(&x[0]), 3, true, true)
	if err != nil || &b[0] != &x[0] {
		t.Fatalf("Buf = %p, %v; want the host buffer itself", b, err)
	}
	if _, err := c.Buf("buf", nil, 3, true, true); !errors.As(err, new(*ArgError)) {
		t.Fatalf("Buf(NULL): %v, want an ArgError", err)
	}
	if err := c.Run(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestRouterStaged: a Go program's allreduce on device memory of the fake
// CUDA runtime through the Router (NCCL off): staged, correct, each
// buffer's kind asked once over several calls; the non-staging form
// refuses device memory.
func TestRouterStaged(t *testing.T) {
	rtPath, err := cudart.Cached()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_FAKE_CUDA_DELAY_US", "0")
	cfg := core.Config{Timeout: 20 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler), CUDARuntime: rtPath, NCCLHier: "off", Mesh: mesh.Builder{}}
	comms, err := core.NewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	r := NewRouter()
	r.Probe(comms[0].Config())
	rt := r.Runtime()
	if rt == nil {
		t.Fatalf("no runtime: %s", r.Reason())
	}
	const n = 64
	ctx := context.Background()
	send := make([]cuda.DevicePtr, 2)
	recv := make([]cuda.DevicePtr, 2)
	for i := range 2 {
		send[i] = cudatest.Upload(t, rt, bytes.Repeat([]byte{byte(i + 1)}, n))
		recv[i] = cudatest.Upload(t, rt, make([]byte, n))
	}
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := Collective{Count: n, DType: collective.Uint8, Op: collective.Sum, Reduces: true, Bufs: []uintptr{uintptr(send[i]), uintptr(recv[i])}}
				if h, err := r.Route(ctx, c, c, x); h != nil || err != nil {
					errs[i] = errors.Join(errors.New("routed with NEXAR_NCCL_HIER=off"), err)
					return
				}
				call, err := r.Begin(true, false, 0)
				if err != nil {
					errs[i] = err
					return
				}
				s, err := call.Buf("sendbuf", devPointer(send[i]), n, true, false)
				if err != nil {
					errs[i] = err
					return
				}
				d, err := call.Buf("recvbuf", devPointer(recv[i]), n, true, true)
				if err != nil {
					errs[i] = err
					return
				}
				errs[i] = call.Run(func() error { return c.Allreduce(ctx, s, d, collective.Uint8, collective.Sum) })
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d rank %d: %v", round, i, err)
			}
		}
		for i := range 2 {
			if got := cudatest.Download(t, rt, 0, recv[i], n); !bytes.Equal(got, bytes.Repeat([]byte{3}, n)) {
				t.Fatalf("round %d rank %d: %v", round, i, got[:8])
			}
		}
		if got := r.Kinds().Len(); got != 4 {
			t.Fatalf("round %d: %d kinds remembered, want the 4 buffers", round, got)
		}
	}
	call, err := r.Begin(false, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := call.Buf("buf", devPointer(send[0]), n, true, false); !errors.As(err, new(*ArgError)) {
		t.Fatalf("device memory in a call that does not stage: %v, want an ArgError", err)
	}
	r.Release(comms[0])
	if got := r.Kinds().Len(); got != 0 {
		t.Fatalf("Release left %d kinds", got)
	}
}

// devPointer is p as the unsafe.Pointer a C caller would pass; host code
// never dereferences it.
func devPointer(p cuda.DevicePtr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// TestRouterUnknownPointer: without a runtime that claims it, memory the
// host cannot read (as device memory of a runtime libnexar did not find
// is) is refused with an error naming the buffer, the pointer and what to
// set: before this the host read it and the process died ("unexpected
// fault address"). The same with a runtime found, for memory it does not
// know.
func TestRouterUnknownPointer(t *testing.T) {
	m, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	p := unsafe.Pointer(&m[0])
	check := func(r *Router, what string) {
		t.Helper()
		for _, stages := range []bool{true, false} {
			c, err := r.Begin(stages, false, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Buf("recvbuf", p, 4096, true, true)
			var ae *ArgError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), "recvbuf") ||
				!strings.Contains(err.Error(), fmt.Sprintf("%#x", uintptr(p))) || !strings.Contains(err.Error(), "NEXAR_CUDART") {
				t.Fatalf("%s: Buf(PROT_NONE memory) = %v, want an ArgError naming recvbuf, the pointer and NEXAR_CUDART", what, err)
			}
			c.Release()
		}
	}
	check(NewRouter(), "no runtime")
	rtPath, err := cudart.Cached()
	if err != nil {
		t.Fatal(err)
	}
	r := NewRouter()
	r.Probe(core.Config{CUDARuntime: rtPath})
	if r.Runtime() == nil {
		t.Fatalf("no runtime: %s", r.Reason())
	}
	check(r, "with the fake CUDA runtime")
}

// TestRouterAdapter: a second GPU runtime (the fake HIP) installed through
// its adapter carries a Go program's device allreduce, staged (the adapter
// brings no NCCL: NEXAR_NCCL_HIER=auto does not route it), and a second
// install is refused.
func TestRouterAdapter(t *testing.T) {
	path, err := hip.Cached()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_FAKE_HIP_DELAY_US", "200")
	rt, err := cuda.LoadAdapter(path, hip.Fill)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRouter()
	if err := r.Install(rt); err != nil {
		t.Fatal(err)
	}
	if err := r.Install(rt); !errors.As(err, new(*InstallError)) {
		t.Fatalf("second Install: %v, want an InstallError", err)
	}
	cfg := core.Config{Timeout: 20 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler), NCCLHier: "auto", Mesh: mesh.Builder{}}
	comms, err := core.NewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	r.Probe(comms[0].Config())
	if r.Runtime() != rt {
		t.Fatal("Probe replaced the installed adapter")
	}
	const n = 4099
	ctx := context.Background()
	send := make([]cuda.DevicePtr, 2)
	recv := make([]cuda.DevicePtr, 2)
	for i := range 2 {
		send[i] = cudatest.Upload(t, rt, bytes.Repeat([]byte{byte(i + 1)}, n))
		recv[i] = cudatest.Upload(t, rt, make([]byte, n))
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := Collective{Count: n, DType: collective.Uint8, Op: collective.Sum, Reduces: true, Bufs: []uintptr{uintptr(send[i]), uintptr(recv[i])}}
			if h, err := r.Route(ctx, c, c, x); h != nil || err != nil {
				errs[i] = errors.Join(errors.New("routed to NCCL with a HIP adapter and no NEXAR_NCCL"), err)
				return
			}
			call, err := r.Begin(true, false, 0)
			if err != nil {
				errs[i] = err
				return
			}
			s, err := call.Buf("sendbuf", devPointer(send[i]), n, true, false)
			if err != nil {
				errs[i] = err
				return
			}
			d, err := call.Buf("recvbuf", devPointer(recv[i]), n, true, true)
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = call.Run(func() error { return c.Allreduce(ctx, s, d, collective.Uint8, collective.Sum) })
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	for i := range 2 {
		if got := cudatest.Download(t, rt, 0, recv[i], n); !bytes.Equal(got, bytes.Repeat([]byte{3}, n)) {
			t.Fatalf("rank %d: %v", i, got[:8])
		}
	}
}
