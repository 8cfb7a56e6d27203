//go:build cgo

package stage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
	"github.com/nexar-go/nexar/transport/mesh"
)

// fakePath is the fake libcudart built for this test binary, on first
// need (so that the real-hardware test runs where no C compiler is).
var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

func TestMain(m *testing.M) {
	child := os.Getenv("STAGE_TEST_FAKE") // a child of TestHostReadOfDeviceMemoryCrashes
	fakePath = child
	code := m.Run()
	if fakePath != "" && child == "" {
		os.RemoveAll(filepath.Dir(fakePath))
	}
	os.Exit(code)
}

// fakeLib returns the fake's path, building it once. Failing, not
// skipping: these tests are the only check of staging without a GPU.
func fakeLib(t testing.TB) string {
	t.Helper()
	fakeOnce.Do(func() {
		if fakePath != "" {
			return
		}
		// Not t.TempDir: the library stays loaded after this test.
		var dir string
		if dir, fakeErr = os.MkdirTemp("", "nexar-fakecudart"); fakeErr == nil {
			fakePath, fakeErr = cudart.Build(dir)
		}
	})
	if fakeErr != nil {
		t.Fatalf("cannot build the fake CUDA runtime: %v", fakeErr)
	}
	return fakePath
}

func fake(t testing.TB) *cuda.Runtime {
	t.Helper()
	rt, err := cuda.Open(fakeLib(t))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func testConfig() core.Config {
	return core.Config{Timeout: 20 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Mesh: mesh.Builder{}}
}

func local(t *testing.T, n int) []*core.Comm {
	t.Helper()
	comms, err := core.NewLocal(n, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Add(1)
			go func() { defer wg.Done(); c.Close() }()
		}
		wg.Wait()
	})
	return comms
}

func i64s(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// devBuf is device memory of the fake, filled through a stream-ordered copy
// (from pinned memory, so that the copy is really asynchronous).
type devBuf struct {
	ptr cuda.DevicePtr
	n   int
}

func newDev(t *testing.T, rt *cuda.Runtime, n int) devBuf {
	t.Helper()
	p, err := rt.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Free(p) })
	return devBuf{p, n}
}

// upload enqueues src into d on s; the pinned source stays alive until the
// test ends.
func upload(t *testing.T, rt *cuda.Runtime, d devBuf, src []byte, s cuda.Stream) {
	t.Helper()
	h, err := rt.MallocHost(len(src))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.StreamSynchronize(s); rt.FreeHost(h) })
	copy(h, src)
	if err := rt.MemcpyAsync(uintptr(d.ptr), uintptr(unsafe.Pointer(&h[0])), len(src), cuda.MemcpyHostToDevice, s); err != nil {
		t.Fatal(err)
	}
}

// download reads d after the work on s so far (stream-ordered, then a sync).
func download(t *testing.T, rt *cuda.Runtime, d devBuf, s cuda.Stream) []byte {
	t.Helper()
	h, err := rt.MallocHost(d.n)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.FreeHost(h)
	if err := rt.MemcpyAsync(uintptr(unsafe.Pointer(&h[0])), uintptr(d.ptr), d.n, cuda.MemcpyDeviceToHost, s); err != nil {
		t.Fatal(err)
	}
	if err := rt.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), h...)
}

func newStream(t *testing.T, rt *cuda.Runtime) cuda.Stream {
	t.Helper()
	s, err := rt.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.StreamDestroy(s) })
	return s
}

// stagedCall runs fn with device buffers bufs staged; hosts[i] stands for
// bufs[i].
func stagedCall(st *Stager, s cuda.Stream, blocking bool, bufs []Buf, fn func(hosts [][]byte) error) error {
	c := st.Begin()
	hosts := make([][]byte, len(bufs))
	for i, b := range bufs {
		isDev, dev, err := st.Device(b.Ptr)
		if err != nil {
			c.Release()
			return err
		}
		if !isDev {
			c.Release()
			return fmt.Errorf("%s is not device memory", b.Name)
		}
		if hosts[i], err = c.Add(b, dev); err != nil {
			c.Release()
			return err
		}
	}
	return c.Run(s, blocking, func() error { return fn(hosts) })
}

func TestDeviceDetection(t *testing.T) {
	rt := fake(t)
	st := New(rt, Options{WaitTimeout: 10 * time.Second})
	t.Cleanup(func() { st.Close() })
	d := newDev(t, rt, 64)
	pin, err := rt.MallocHost(64)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.FreeHost(pin)
	heap := make([]byte, 64)
	for _, tc := range []struct {
		name string
		p    uintptr
		want bool
	}{
		{"device", uintptr(d.ptr), true},
		{"device+8", uintptr(d.ptr) + 8, true},
		{"pinned host", uintptr(unsafe.Pointer(&pin[0])), false},
		{"go heap", uintptr(unsafe.Pointer(&heap[0])), false},
		{"null", 0, false},
	} {
		got, _, err := st.Device(tc.p)
		if err != nil || got != tc.want {
			t.Errorf("Device(%s) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestCollectivesDevice runs allreduce, broadcast and allgather on device
// buffers of 3 ranks, each rank's input written by a delayed copy on its
// own stream, in both variants, and checks every rank's result read back
// in stream order.
func TestCollectivesDevice(t *testing.T) {
	rt := fake(t)
	const n, count = 3, 1000
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("blocking=%v", blocking), func(t *testing.T) {
			comms := local(t, n)
			st := New(rt, Options{WaitTimeout: 10 * time.Second})
			t.Cleanup(func() { st.Close() })
			ctx := context.Background()
			var wg sync.WaitGroup
			errs := make([]error, n)
			results := make([][][]byte, n)
			for r := 0; r < n; r++ {
				s := newStream(t, rt)
				ar := newDev(t, rt, 8*count)
				bc := newDev(t, rt, 8*count)
				agSend := newDev(t, rt, 8*count)
				agRecv := newDev(t, rt, 8*count*n)
				in := make([]int64, count)
				for i := range in {
					in[i] = int64(r*1000000 + i)
				}
				upload(t, rt, ar, i64s(in), s)
				upload(t, rt, agSend, i64s(in), s)
				if r == 1 {
					upload(t, rt, bc, i64s(in), s)
				}
				wg.Add(1)
				go func(r int, c *core.Comm) {
					defer wg.Done()
					err := stagedCall(st, s, blocking, []Buf{{Name: "recvbuf", Ptr: uintptr(ar.ptr), Len: ar.n, In: true, Out: true}},
						func(h [][]byte) error { return c.Allreduce(ctx, nil, h[0], collective.Int64, collective.Sum) })
					if err == nil {
						err = stagedCall(st, s, blocking, []Buf{{Name: "buf", Ptr: uintptr(bc.ptr), Len: bc.n, In: true, Out: true}},
							func(h [][]byte) error { return c.Broadcast(ctx, h[0], collective.Int64, 1) })
					}
					if err == nil {
						err = stagedCall(st, s, blocking, []Buf{
							{Name: "sendbuf", Ptr: uintptr(agSend.ptr), Len: agSend.n, In: true},
							{Name: "recvbuf", Ptr: uintptr(agRecv.ptr), Len: agRecv.n, Out: true}},
							func(h [][]byte) error { return c.Allgather(ctx, h[0], h[1], collective.Int64) })
					}
					if err != nil {
						errs[r] = err
						return
					}
					results[r] = [][]byte{download(t, rt, ar, s), download(t, rt, bc, s), download(t, rt, agRecv, s)}
				}(r, comms[r])
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			sum := make([]int64, count)
			bcast := make([]int64, count)
			var gather []int64
			for r := 0; r < n; r++ {
				for i := range sum {
					sum[i] += int64(r*1000000 + i)
					gather = append(gather, int64(r*1000000+i))
				}
			}
			for i := range bcast {
				bcast[i] = int64(1000000 + i)
			}
			for r := 0; r < n; r++ {
				for k, want := range [][]byte{i64s(sum), i64s(bcast), i64s(gather)} {
					if got := results[r][k]; string(got) != string(want) {
						t.Errorf("rank %d, %s: wrong result (first bytes %x, want %x)", r, []string{"allreduce", "broadcast", "allgather"}[k], got[:16], want[:16])
					}
				}
			}
		})
	}
}

// TestSendRecvDevice sends device memory from rank 0 to rank 1 (blocking
// variant on the legacy default stream).
func TestSendRecvDevice(t *testing.T) {
	rt := fake(t)
	comms := local(t, 2)
	st := New(rt, Options{WaitTimeout: 10 * time.Second})
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	src := newDev(t, rt, 4096)
	dst := newDev(t, rt, 4096)
	payload := make([]byte, 4096)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	if err := rt.CopyToDevice(src.ptr, payload); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var sendErr, recvErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		sendErr = stagedCall(st, 0, true, []Buf{{Name: "buf", Ptr: uintptr(src.ptr), Len: src.n, In: true}},
			func(h [][]byte) error { return comms[0].Send(ctx, h[0], 1, 5) })
	}()
	go func() {
		defer wg.Done()
		recvErr = stagedCall(st, 0, true, []Buf{{Name: "buf", Ptr: uintptr(dst.ptr), Len: dst.n, Out: true}},
			func(h [][]byte) error { _, err := comms[1].Recv(ctx, h[0], 0, 5); return err })
	}()
	wg.Wait()
	if sendErr != nil || recvErr != nil {
		t.Fatalf("send: %v, recv: %v", sendErr, recvErr)
	}
	got := make([]byte, 4096)
	if err := rt.CopyFromDevice(got, dst.ptr); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(payload) {
		t.Fatalf("received %x..., want %x...", got[:8], payload[:8])
	}
}

// TestWaitsForCallersStream: the input is written by a copy held behind a
// closed gate on the caller's stream; staging must wait for it (reading
// early would see the fake's 0xDE garbage).
func TestWaitsForCallersStream(t *testing.T) {
	rt := fake(t)
	st := New(rt, Options{WaitTimeout: 10 * time.Second})
	t.Cleanup(func() { st.Close() })
	s := newStream(t, rt)
	d := newDev(t, rt, 64)
	g, err := cudart.NewGate(fakeLib(t), uintptr(s))
	if err != nil {
		t.Fatal(err)
	}
	want := i64s([]int64{1, 2, 3, 4, 5, 6, 7, 8})
	upload(t, rt, d, want, s)
	t.Cleanup(g.Open) // before the cleanups that drain the stream
	got := make(chan []byte, 1)
	go func() {
		var seen []byte
		err := stagedCall(st, s, true, []Buf{{Name: "buf", Ptr: uintptr(d.ptr), Len: d.n, In: true}},
			func(h [][]byte) error { seen = append([]byte(nil), h[0]...); return nil })
		if err != nil {
			t.Error(err)
		}
		got <- seen
	}()
	select {
	case <-got:
		t.Fatal("the staged call ran while the caller's stream was held before its input")
	case <-time.After(50 * time.Millisecond):
	}
	g.Open()
	if b := <-got; string(b) != string(want) {
		t.Fatalf("staged input %x, want %x", b, want)
	}
}

// TestCompletionChainedToCallersStream: with the library stream held (a
// gate enqueued on it from inside the host call, so before the copy back),
// the stream-ordered call returns, yet the device buffer still holds its
// old contents and work on the caller's stream does not run; opening the
// gate lets both through, in order.
func TestCompletionChainedToCallersStream(t *testing.T) {
	rt := fake(t)
	st := New(rt, Options{WaitTimeout: 10 * time.Second})
	t.Cleanup(func() { st.Close() })
	s := newStream(t, rt)
	other := newStream(t, rt)
	d := newDev(t, rt, 64)
	old := i64s([]int64{1, 1, 1, 1, 1, 1, 1, 1})
	upload(t, rt, d, old, s)
	var g *cudart.Gate
	err := stagedCall(st, s, false, []Buf{{Name: "buf", Ptr: uintptr(d.ptr), Len: d.n, In: true, Out: true}},
		func(h [][]byte) error {
			for i := range h[0] {
				h[0][i] *= 3
			}
			var err error
			st.mu.Lock()
			lib := st.streams[0]
			st.mu.Unlock()
			g, err = cudart.NewGate(fakeLib(t), uintptr(lib))
			if err == nil {
				t.Cleanup(g.Open)
			}
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	// The caller's stream is behind the completion: an event recorded on
	// it now stays incomplete while the gate is closed.
	ev, err := rt.EventCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer rt.EventDestroy(ev)
	if err := rt.EventRecord(ev, s); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if done, err := rt.EventQuery(ev); err != nil || done {
		t.Fatalf("caller's stream passed the completion before the copy back: done=%v err=%v", done, err)
	}
	// Not ordered after the completion: still the old contents.
	if b := download(t, rt, d, other); string(b) != string(old) {
		t.Fatalf("device buffer changed before the copy back was released: %x", b)
	}
	g.Open()
	want := i64s([]int64{3, 3, 3, 3, 3, 3, 3, 3})
	if b := download(t, rt, d, s); string(b) != string(want) {
		t.Fatalf("after completion: %x, want %x", b, want)
	}
}

// TestErrorLeavesDeviceBuffer: a failing host call copies nothing back and
// returns its buffers to the pool.
func TestErrorLeavesDeviceBuffer(t *testing.T) {
	rt := fake(t)
	st := New(rt, Options{WaitTimeout: 10 * time.Second})
	t.Cleanup(func() { st.Close() })
	d := newDev(t, rt, 64)
	old := i64s([]int64{9, 9, 9, 9, 9, 9, 9, 9})
	if err := rt.CopyToDevice(d.ptr, old); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := stagedCall(st, 0, true, []Buf{{Name: "buf", Ptr: uintptr(d.ptr), Len: d.n, In: true, Out: true}},
		func(h [][]byte) error { h[0][0] = 0; return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	got := make([]byte, 64)
	if err := rt.CopyFromDevice(got, d.ptr); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(old) {
		t.Fatalf("device buffer changed by a failed call: %x", got)
	}
	if s := st.Stats(); s.LentBytes != 0 {
		t.Fatalf("after the call, %d bytes still lent", s.LentBytes)
	}
}

// TestPoolBounded: sequential calls reuse pinned buffers, and the pool
// stays within its bound.
func TestPoolBounded(t *testing.T) {
	rt := fake(t)
	st := New(rt, Options{PoolBytes: 64 << 10})
	t.Cleanup(func() { st.Close() })
	for _, n := range []int{1000, 5000, 40000, 1000, 60000, 40000} {
		d := newDev(t, rt, n)
		if err := stagedCall(st, 0, true, []Buf{{Name: "buf", Ptr: uintptr(d.ptr), Len: n, In: true, Out: true}},
			func([][]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if s := st.Stats(); s.PinnedBytes > 64<<10 || s.LentBytes != 0 {
			t.Fatalf("after a %d-byte call: %+v (bound 64 KiB, nothing lent)", n, s)
		}
	}
}

// TestHostReadOfDeviceMemoryCrashes proves the fake faithful: a host read
// of its device memory kills the process with SIGSEGV, as on a GPU.
func TestHostReadOfDeviceMemoryCrashes(t *testing.T) {
	if os.Getenv("STAGE_TEST_CRASH") == "1" {
		rt := fake(t)
		p, err := rt.Malloc(64)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("device pointer %#x\n", uintptr(p))
		b := *(*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(p))) // the point of the test
		fmt.Println("read", b, "from device memory: the fake is not faithful")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostReadOfDeviceMemoryCrashes$", "-test.count=1")
	cmd.Env = append(os.Environ(), "STAGE_TEST_CRASH=1", "STAGE_TEST_FAKE="+fakeLib(t))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the child read device memory and exited cleanly (err %v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "SIGSEGV") || !strings.Contains(string(out), "device pointer") {
		t.Fatalf("child did not die of SIGSEGV on the device pointer (%v):\n%s", err, out)
	}
	t.Logf("child died as expected: %v", err)
}
