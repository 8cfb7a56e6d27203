//go:build cgo

package device

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
	fakenccl "github.com/nexar-go/nexar/tests/fakes/nccl"
	"github.com/nexar-go/nexar/transport/mesh"
)

// The tests run as processes (this test binary again, one per rank, with
// the environment `nexar run` sets): device memory, NCCL and the host
// identity are per process, as on a real machine. DEVICE_TEST_RANK marks a
// rank; the test's body then runs as that rank.
const rankEnv = "DEVICE_TEST_RANK"

var (
	buildOnce      sync.Once
	fakeRT, fakeNC string
	buildErr       error
)

// fakes builds the fake CUDA runtime and NCCL once per test binary (a
// machine that cannot build them fails: these tests are the only check of
// this package without a GPU).
func fakes(t *testing.T) (string, string) {
	t.Helper()
	buildOnce.Do(func() {
		var dir string
		if dir, buildErr = os.MkdirTemp("", "nexar-device-"); buildErr != nil {
			return
		}
		if fakeRT, buildErr = cudart.Build(dir); buildErr == nil {
			fakeNC, buildErr = fakenccl.Build(dir)
		}
	})
	if buildErr != nil {
		t.Fatalf("the fakes failed to build: %v", buildErr)
	}
	return fakeRT, fakeNC
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// runRanks runs test as len(hosts) ranks, rank r on simulated host
// hosts[r], with env added, and fails unless every rank exits 0 having
// printed "device rank ok". It returns their outputs.
func runRanks(t *testing.T, test string, hosts []string, env ...string) []string {
	t.Helper()
	port := freePort(t)
	outs := make([]string, len(hosts))
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for r, h := range hosts {
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v", "-test.timeout=5m")
		cmd.Env = append(os.Environ(), rankEnv+"=1", "NEXAR_HIER_HOST_ID="+h, fmt.Sprintf("NEXAR_RANK=%d", r),
			fmt.Sprintf("NEXAR_WORLD_SIZE=%d", len(hosts)), fmt.Sprintf("NEXAR_SEED=127.0.0.1:%d", port),
			"NEXAR_TOKEN=device-test-token-0123456789abcdef")
		cmd.Env = append(cmd.Env, env...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
		}()
	}
	wg.Wait()
	for r := range outs {
		if errs[r] != nil || !strings.Contains(outs[r], "device rank ok") {
			t.Errorf("rank %d failed (%v):\n%s", r, errs[r], outs[r])
		}
	}
	return outs
}

// rank is one process's communicator and its device calls.
type rank struct {
	t    *testing.T
	c    *core.Comm
	d    *Comm
	rt   *cuda.Runtime
	s    cuda.Stream
	r, n int
}

func joinRank(t *testing.T) *rank {
	t.Helper()
	cfg, err := core.ConfigFromLookup(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Mesh = mesh.Builder{}
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := core.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := New(c, nil)
	rt := d.Router().Runtime()
	if rt == nil {
		t.Fatalf("no CUDA runtime: %s", d.Router().Reason())
	}
	s, err := rt.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); c.Close() })
	return &rank{t: t, c: c, d: d, rt: rt, s: s, r: c.Rank(), n: c.Size()}
}

func (k *rank) ck(what string, err error) {
	k.t.Helper()
	if err != nil {
		k.t.Fatalf("rank %d: %s: %v", k.r, what, err)
	}
}

// alloc is n bytes of device memory, filled with fill (by a blocking copy).
func (k *rank) alloc(n int, fill byte) cuda.DevicePtr {
	p, err := k.rt.Malloc(max(n, 1))
	k.ck("cudaMalloc", err)
	b := make([]byte, max(n, 1))
	for i := range b {
		b[i] = fill
	}
	k.ck("cudaMemcpy", k.rt.CopyToDevice(p, b))
	return p
}

// put queues a copy of b into p on the rank's stream (the host returns at
// once; the fake runs it after its delay).
func (k *rank) put(p cuda.DevicePtr, b []byte) {
	pin, err := k.rt.MallocHost(len(b))
	k.ck("cudaMallocHost", err)
	copy(pin, b)
	k.ck("cudaMemcpyAsync", k.rt.MemcpyAsync(uintptr(p), uintptr(unsafe.Pointer(&pin[0])), len(b), cuda.MemcpyHostToDevice, k.s))
}

// get is n bytes at p after the work queued on the rank's stream so far.
func (k *rank) get(p cuda.DevicePtr, n int) []byte {
	pin, err := k.rt.MallocHost(n)
	k.ck("cudaMallocHost", err)
	defer k.rt.FreeHost(pin)
	k.ck("cudaMemcpyAsync", k.rt.MemcpyAsync(uintptr(unsafe.Pointer(&pin[0])), uintptr(p), n, cuda.MemcpyDeviceToHost, k.s))
	k.ck("cudaStreamSynchronize", k.rt.StreamSynchronize(k.s))
	return append([]byte(nil), pin...)
}

func i64s(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// expect compares got with want element by element (int64).
func (k *rank) expect(what string, got []byte, want []int64) {
	k.t.Helper()
	if len(got) != 8*len(want) {
		k.t.Fatalf("rank %d: %s: %d bytes, want %d", k.r, what, len(got), 8*len(want))
	}
	for i, w := range want {
		if g := int64(binary.LittleEndian.Uint64(got[8*i:])); g != w {
			k.t.Fatalf("rank %d: %s[%d] = %d (%#x), want %d", k.r, what, i, g, uint64(g), w)
		}
	}
}

// TestCollectives: every call of the package, blocking and on a stream,
// out of place and in place, checked element by element (int64), on the
// staged path (3 ranks, NEXAR_NCCL_HIER=off) and through the fake NCCL
// within a host and nexar between two simulated hosts (3 ranks as 2+1,
// NEXAR_NCCL_HIER=on: no silent fallback to staging).
func TestCollectives(t *testing.T) {
	if os.Getenv(rankEnv) != "" {
		rankCollectives(t)
		return
	}
	rt, nc := fakes(t)
	for _, tc := range []struct {
		name  string
		hosts []string
		env   []string
	}{
		{"staged", []string{"A", "A", "A"}, []string{"NEXAR_NCCL_HIER=off"}},
		{"nccl_hier", []string{"A", "B", "A"}, []string{"NEXAR_NCCL_HIER=on", "NEXAR_NCCL=" + nc}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runRanks(t, "TestCollectives", tc.hosts, append(tc.env, "NEXAR_CUDART="+rt, "NEXAR_FAKE_CUDA_DELAY_US=300")...)
		})
	}
}

func rankCollectives(t *testing.T) {
	k := joinRank(t)
	ctx := context.Background()
	r, n := k.r, k.n
	const count = 1001
	nb := 8 * count
	in := make([]int64, count)
	sum := make([]int64, count)
	for i := range in {
		in[i] = int64(r*1000000 + i)
		sum[i] = int64(n*i + 1000000*n*(n-1)/2)
	}
	for _, form := range []struct {
		name string
		s    Stream
	}{{"blocking", Stream{}}, {"stream", On(k.s)}} {
		f := form.name
		// Inputs are queued on the stream (the blocking form waits for
		// the legacy default stream only: synchronize first).
		put := func(p cuda.DevicePtr, b []byte) {
			k.put(p, b)
			if !form.s.on {
				k.ck("sync", k.rt.StreamSynchronize(k.s))
			}
		}

		send, recv := k.alloc(nb, 0xDE), k.alloc(nb, 0xDE)
		put(send, i64s(in))
		k.ck(f+" allreduce", k.d.Allreduce(ctx, send, recv, count, collective.Int64, collective.Sum, form.s))
		k.expect(f+" allreduce", k.get(recv, nb), sum)
		k.expect(f+" allreduce send untouched", k.get(send, nb), in)
		k.ck(f+" allreduce in place", k.d.Allreduce(ctx, send, send, count, collective.Int64, collective.Max, form.s))
		maxv := make([]int64, count)
		for i := range maxv {
			maxv[i] = int64((n-1)*1000000 + i)
		}
		k.expect(f+" allreduce in place (max)", k.get(send, nb), maxv)

		root := n - 1
		b := k.alloc(nb, 0xDE)
		if r == root {
			put(b, i64s(in))
		}
		k.ck(f+" broadcast", k.d.Broadcast(ctx, b, count, collective.Int64, root, form.s))
		rootIn := make([]int64, count)
		for i := range rootIn {
			rootIn[i] = int64(root*1000000 + i)
		}
		k.expect(f+" broadcast", k.get(b, nb), rootIn)

		all := make([]int64, n*count)
		for q := range n {
			for i := range count {
				all[q*count+i] = int64(q*1000000 + i)
			}
		}
		g := k.alloc(n*nb, 0xDE)
		put(send, i64s(in)) // send held the max above
		k.ck(f+" allgather", k.d.Allgather(ctx, send, g, count, collective.Int64, form.s))
		k.expect(f+" allgather", k.get(g, n*nb), all)
		gi := k.alloc(n*nb, 0xDE)
		mine := make([]int64, n*count) // only this rank's block is meaningful
		copy(mine[r*count:], in)
		put(gi, i64s(mine))
		k.ck(f+" allgather in place", k.d.Allgather(ctx, gi, gi, count, collective.Int64, form.s))
		k.expect(f+" allgather in place", k.get(gi, n*nb), all)

		// reduce-scatter: rank q's block j holds q + 100*j + i.
		rsIn := make([]int64, n*count)
		for j := range n {
			for i := range count {
				rsIn[j*count+i] = int64(r + 100*j + i)
			}
		}
		rsWant := make([]int64, count)
		for i := range rsWant {
			rsWant[i] = int64(n*(n-1)/2 + n*(100*r+i))
		}
		rs, rr := k.alloc(n*nb, 0xDE), k.alloc(nb, 0xDE)
		put(rs, i64s(rsIn))
		k.ck(f+" reduce_scatter", k.d.ReduceScatter(ctx, rs, rr, count, collective.Int64, collective.Sum, form.s))
		k.expect(f+" reduce_scatter", k.get(rr, nb), rsWant)
		k.ck(f+" reduce_scatter in place", k.d.ReduceScatter(ctx, rs, rs, count, collective.Int64, collective.Sum, form.s))
		k.expect(f+" reduce_scatter in place", k.get(rs, n*nb)[:nb], rsWant)

		// send/recv around a ring; the receive is larger than the message.
		next, prev := (r+1)%n, (r+n-1)%n
		pr := k.alloc(nb+16, 0x11)
		sendRecv := []func() error{
			func() error { return k.d.Send(ctx, send, count, collective.Int64, next, 7, form.s) },
			func() error {
				st, err := k.d.Recv(ctx, pr, count+2, collective.Int64, prev, 7, form.s)
				if err == nil && (st.Source != prev || st.Count != nb) {
					err = fmt.Errorf("status %+v, want source %d and %d bytes", st, prev, nb)
				}
				return err
			},
		}
		if r%2 == 1 {
			sendRecv[0], sendRecv[1] = sendRecv[1], sendRecv[0]
		}
		for _, call := range sendRecv {
			k.ck(f+" send/recv", call())
		}
		prevIn := make([]int64, count)
		for i := range prevIn {
			prevIn[i] = int64(prev*1000000 + i)
		}
		got := k.get(pr, nb+16)
		k.expect(f+" recv", got[:nb], prevIn)
		for i, x := range got[nb:] {
			if x != 0x11 {
				k.t.Fatalf("rank %d: %s recv wrote past the message: byte %d is %#x", r, f, nb+i, x)
			}
		}
	}
	fmt.Printf("rank %d: device rank ok\n", r)
}

// TestStreamOrder: a call on a stream waits for the work queued there
// before it, here a copy held on the stream by a gate: the call must not
// return while the gate is shut, and its result read back on the stream
// must be the reduction of what the held copy wrote. Staged and through
// NCCL, 2 ranks.
func TestStreamOrder(t *testing.T) {
	if os.Getenv(rankEnv) != "" {
		rankStreamOrder(t)
		return
	}
	rt, nc := fakes(t)
	t.Run("staged", func(t *testing.T) {
		runRanks(t, "TestStreamOrder", []string{"A", "A"}, "NEXAR_NCCL_HIER=off", "NEXAR_CUDART="+rt)
	})
	t.Run("nccl_hier", func(t *testing.T) {
		runRanks(t, "TestStreamOrder", []string{"A", "B"}, "NEXAR_NCCL_HIER=on", "NEXAR_NCCL="+nc, "NEXAR_CUDART="+rt)
	})
}

func rankStreamOrder(t *testing.T) {
	k := joinRank(t)
	const count = 1000
	nb := 8 * count
	in := make([]int64, count)
	want := make([]int64, count)
	for i := range in {
		in[i] = int64(k.r*10 + i)
		want[i] = int64(k.n*i + 10*k.n*(k.n-1)/2)
	}
	buf := k.alloc(nb, 0xDE)
	g, err := cudart.NewGate(os.Getenv("NEXAR_CUDART"), uintptr(k.s))
	k.ck("gate", err)
	k.put(buf, i64s(in))
	done := make(chan error, 1)
	go func() {
		done <- k.d.Allreduce(context.Background(), buf, buf, count, collective.Int64, collective.Sum, On(k.s))
	}()
	select {
	case err := <-done:
		t.Fatalf("rank %d: allreduce returned (%v) while its input was held on the stream", k.r, err)
	case <-time.After(300 * time.Millisecond):
	}
	g.Open()
	k.ck("allreduce", <-done)
	k.expect("allreduce after the held copy", k.get(buf, nb), want)
	fmt.Printf("rank %d: device rank ok\n", k.r)
}

// TestArguments: bad arguments fail naming the call and the argument,
// before anything is sent; a stream where no CUDA runtime was found is
// refused, saying why (one process, host memory, no runtime loaded).
func TestArguments(t *testing.T) {
	cfg := core.Config{Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler), Mesh: mesh.Builder{}}
	comms, err := core.NewLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer comms[0].Close()
	d := New(comms[0], nil)
	defer d.Close()
	ctx := context.Background()
	host := make([]byte, 64)
	p := cuda.DevicePtr(uintptr(unsafe.Pointer(&host[0])))
	for _, tc := range []struct {
		err  error
		want string
	}{
		{d.Allreduce(ctx, p, p, -1, collective.Int64, collective.Sum, Stream{}), "allreduce: count -1 is negative"},
		{d.Broadcast(ctx, p, 1, collective.DType(99), 0, Stream{}), "broadcast: data type 99"},
		{d.Send(ctx, p, 1, collective.Int64, 3, 0, Stream{}), "send: peer 3 is not a rank"},
		{func() error { _, err := d.Recv(ctx, p, 1, collective.Int64, -2, 0, Stream{}); return err }(), "recv: peer -2"},
		{d.Allreduce(ctx, 0, 0, 4, collective.Int64, collective.Sum, Stream{}), "allreduce: recv is NULL"},
		{d.Allreduce(ctx, p, p, 1, collective.Int64, collective.Sum, On(0x1234)), "stream 0x1234 given but CUDA is not usable"},
	} {
		var ae *hier.ArgError
		if !errors.As(tc.err, &ae) || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("got %v, want an ArgError saying %q", tc.err, tc.want)
		}
	}
	// Host memory behind the pointer is taken as it is, blocking and with
	// the legacy default stream.
	binary.LittleEndian.PutUint64(host, 21)
	if err := d.Allreduce(ctx, p, p, 1, collective.Int64, collective.Sum, Stream{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Allreduce(ctx, p, p, 1, collective.Int64, collective.Sum, On(0)); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(host); got != 21 {
		t.Fatalf("1-rank allreduce of host memory: %d, want 21", got)
	}
}
