//go:build cgo

package nccl

import (
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/internal/dtype"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
	fakenccl "github.com/nexar-go/nexar/tests/fakes/nccl"
)

// These tests run the binding against the fake NCCL and the fake CUDA
// runtime (tests/fakes): communicators of several processes (this test
// binary again, one process per rank), device memory the host cannot read.

var (
	buildOnce      sync.Once
	fakeRT, fakeNC string
	buildErr       error
	buildDir       string
)

// fakes returns the paths of the fake runtime and NCCL, built once (or
// named by the parent process in a rank).
func fakes(t *testing.T) (rt, nc string) {
	t.Helper()
	if p := os.Getenv("FAKE_NCCL_TEST_RT"); p != "" {
		return p, os.Getenv("FAKE_NCCL_TEST_NC")
	}
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "nexar-fakenccl-"); buildErr != nil {
			return
		}
		if fakeRT, buildErr = cudart.Build(buildDir); buildErr != nil {
			return
		}
		fakeNC, buildErr = fakenccl.Build(buildDir)
	})
	if buildErr != nil {
		t.Fatalf("the fakes failed to build: %v", buildErr)
	}
	return fakeRT, fakeNC
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// runRanks runs test as n processes sharing a fresh unique id and returns
// their outputs, failing the test if any fails or runs past limit.
func runRanks(t *testing.T, test string, n int, limit time.Duration) []string {
	t.Helper()
	rt, nc := fakes(t)
	l, err := Open(nc)
	if err != nil {
		t.Fatal(err)
	}
	id, err := l.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // for the ranks' own hand-offs (files)
	outs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "FAKE_NCCL_TEST_RT="+rt, "FAKE_NCCL_TEST_NC="+nc, "NEXAR_CUDART="+rt,
			"FAKE_NCCL_TEST_ID="+hex.EncodeToString(id[:]), fmt.Sprintf("FAKE_NCCL_TEST_RANK=%d", r),
			fmt.Sprintf("FAKE_NCCL_TEST_N=%d", n), "NEXAR_FAKE_CUDA_DELAY_US=200", "FAKE_NCCL_TEST_DIR="+dir)
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			timer := time.AfterFunc(limit, func() { cmd.Process.Kill() })
			defer timer.Stop()
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
		}(r)
	}
	wg.Wait()
	for r := range outs {
		if errs[r] != nil || !strings.Contains(outs[r], "\nPASS") {
			t.Errorf("rank %d: %v\n%s", r, errs[r], outs[r])
		}
	}
	return outs
}

// rank is one process of a multi-process test: its comm, stream and the
// fake runtime.
type rank struct {
	t      *testing.T
	r, n   int
	rt     *cuda.Runtime
	lib    *Library
	c      *Comm
	stream cuda.Stream
}

// asRank reports whether this process is a rank, and then joins.
func asRank(t *testing.T) *rank {
	rs := os.Getenv("FAKE_NCCL_TEST_RANK")
	if rs == "" {
		return nil
	}
	rtPath, ncPath := fakes(t)
	k := &rank{t: t}
	k.r, _ = strconv.Atoi(rs)
	k.n, _ = strconv.Atoi(os.Getenv("FAKE_NCCL_TEST_N"))
	var err error
	if k.rt, err = cuda.Open(rtPath); err != nil {
		t.Fatal(err)
	}
	if k.lib, err = Open(ncPath); err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(os.Getenv("FAKE_NCCL_TEST_ID"))
	if err != nil || len(b) != len(UniqueID{}) {
		t.Fatalf("bad FAKE_NCCL_TEST_ID: %v", err)
	}
	var id UniqueID
	copy(id[:], b)
	if k.c, err = k.lib.NewComm(id, k.n, k.r); err != nil {
		t.Fatal(err)
	}
	if k.stream, err = k.rt.StreamCreate(); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *rank) dev(b []byte) cuda.DevicePtr { return cudatest.Upload(k.t, k.rt, b) }

// read waits for the stream, then copies n bytes of p to the host.
func (k *rank) read(p cuda.DevicePtr, n int) []byte {
	return cudatest.Download(k.t, k.rt, k.stream, p, n)
}

var vals = cudatest.Encode

// input is rank r's element i of a test vector: small integers, exact in
// every type used and in their sums and products.
func input(r, i int) float64 { return float64((i+r)%5 + 1) }

func TestFakeCollectives(t *testing.T) {
	k := asRank(t)
	if k == nil {
		runRanks(t, "TestFakeCollectives", 3, 2*time.Minute)
		return
	}
	r, n := k.r, k.n
	// 70001 float32 elements span two of the fake's 256 KiB chunks.
	for _, tc := range []struct {
		dt    dtype.DType
		op    dtype.Op
		count int
	}{{dtype.Float32, dtype.Sum, 70001}, {dtype.Int64, dtype.Max, 1001}, {dtype.BFloat16, dtype.Prod, 33}} {
		in := make([]float64, tc.count)
		want := make([]float64, tc.count)
		for i := range in {
			in[i] = input(r, i)
			for q := 0; q < n; q++ {
				x := input(q, i)
				switch {
				case q == 0:
					want[i] = x
				case tc.op == dtype.Sum:
					want[i] += x
				case tc.op == dtype.Max:
					want[i] = math.Max(want[i], x)
				case tc.op == dtype.Prod:
					want[i] *= x
				}
			}
		}
		send := k.dev(vals(tc.dt, in))
		recv, _ := k.rt.Malloc(tc.count * tc.dt.Size())
		if err := k.c.AllReduce(send, recv, tc.count, tc.dt, tc.op, k.stream); err != nil {
			t.Fatal(err)
		}
		if got, w := k.read(recv, tc.count*tc.dt.Size()), vals(tc.dt, want); string(got) != string(w) {
			t.Fatalf("allreduce %v %v: wrong result", tc.dt, tc.op)
		}
	}

	// Reduce to 1, broadcast from 2 in place, allgather, reduce-scatter, and
	// a group of reduces to every root (what hier issues for uneven pieces).
	const cnt = 501
	dt := dtype.Int64
	es := dt.Size()
	in := make([]float64, cnt*n)
	for i := range in {
		in[i] = input(r, i)
	}
	sum := func(i int) float64 {
		s := 0.0
		for q := 0; q < n; q++ {
			s += input(q, i)
		}
		return s
	}
	send := k.dev(vals(dt, in))
	out, _ := k.rt.Malloc(cnt * n * es)
	if err := k.c.Reduce(send, out, cnt, dt, dtype.Sum, 1, k.stream); err != nil {
		t.Fatal(err)
	}
	if r == 1 {
		want := make([]float64, cnt)
		for i := range want {
			want[i] = sum(i)
		}
		if string(k.read(out, cnt*es)) != string(vals(dt, want)) {
			t.Fatal("reduce: wrong result at the root")
		}
	}
	bc := k.dev(vals(dt, in[:cnt]))
	if err := k.c.Broadcast(bc, bc, cnt, dt, 2, k.stream); err != nil {
		t.Fatal(err)
	}
	want2 := make([]float64, cnt)
	for i := range want2 {
		want2[i] = input(2, i)
	}
	if string(k.read(bc, cnt*es)) != string(vals(dt, want2)) {
		t.Fatal("broadcast: wrong result")
	}
	if err := k.c.AllGather(send, out, cnt, dt, k.stream); err != nil {
		t.Fatal(err)
	}
	wantAG := make([]float64, cnt*n)
	for q := 0; q < n; q++ {
		for i := 0; i < cnt; i++ {
			wantAG[q*cnt+i] = input(q, i)
		}
	}
	if string(k.read(out, cnt*n*es)) != string(vals(dt, wantAG)) {
		t.Fatal("allgather: wrong result")
	}
	if err := k.c.ReduceScatter(send, out, cnt, dt, dtype.Sum, k.stream); err != nil {
		t.Fatal(err)
	}
	wantRS := make([]float64, cnt)
	for i := range wantRS {
		wantRS[i] = sum(r*cnt + i)
	}
	if string(k.read(out, cnt*es)) != string(vals(dt, wantRS)) {
		t.Fatal("reduce-scatter: wrong result")
	}
	err := k.lib.Group(func() error {
		for root := 0; root < n; root++ {
			off := cuda.DevicePtr(root * cnt * es)
			if err := k.c.Reduce(send+off, out+off, cnt, dt, dtype.Sum, root, k.stream); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(k.read(out+cuda.DevicePtr(r*cnt*es), cnt*es)) != string(vals(dt, wantRS)) {
		t.Fatal("grouped reduces: wrong result")
	}

	// A host buffer is not device memory: refused at the call, naming it.
	host := make([]byte, 64)
	err = k.c.AllReduce(cuda.DevicePtr(uintptrOf(host)), out, 8, dt, dtype.Sum, k.stream)
	if err == nil || !strings.Contains(err.Error(), "sendbuff") || !strings.Contains(err.Error(), "not device memory") {
		t.Fatalf("allreduce of host memory: %v", err)
	}
	if err := k.c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFakeHangsUntilAborted: ranks that make different calls wait for ever,
// as NCCL's kernels do; ncclCommAbort ends the wait, and the peer of an
// aborted rank reports ncclRemoteError.
func TestFakeHangsUntilAborted(t *testing.T) {
	k := asRank(t)
	if k == nil {
		runRanks(t, "TestFakeHangsUntilAborted", 2, time.Minute)
		return
	}
	buf, _ := k.rt.Malloc(64)
	if err := k.c.AllReduce(buf, buf, 4+k.r, dtype.Int64, dtype.Sum, k.stream); err != nil {
		t.Fatal(err)
	}
	ev, _ := k.rt.EventCreate()
	k.rt.EventRecord(ev, k.stream)
	time.Sleep(300 * time.Millisecond)
	if done, _ := k.rt.EventQuery(ev); done {
		t.Fatal("a mismatched allreduce completed")
	}
	if err := k.c.AsyncError(); err != nil {
		t.Fatalf("async error before any abort: %v", err)
	}
	// Rank 0 aborts only once rank 1 has looked: a rank started late
	// (a loaded host) would otherwise see the abort before its check.
	checked := filepath.Join(os.Getenv("FAKE_NCCL_TEST_DIR"), "rank1-checked")
	if k.r == 1 {
		if err := os.WriteFile(checked, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	} else {
		deadline := time.Now().Add(20 * time.Second)
		for _, err := os.Stat(checked); err != nil; _, err = os.Stat(checked) {
			if time.Now().After(deadline) {
				t.Fatal("rank 1 never checked its async error")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if k.r == 1 {
		// Rank 0 aborts: this rank learns of it from the async error.
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := k.c.AsyncError()
			if e := (*Error)(nil); err != nil {
				if !asError(err, &e) || e.Code != 6 {
					t.Fatalf("async error %v, want ncclRemoteError", err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("rank 0's abort was never reported")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := k.c.Abort(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for done, _ := k.rt.EventQuery(ev); !done; done, _ = k.rt.EventQuery(ev) {
		if time.Now().After(deadline) {
			t.Fatal("the aborted allreduce still holds the stream")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFakeDeadPeer: a rank that dies leaves its peer's collective waiting,
// with no async error (NCCL within a host does not notice); abort ends it.
func TestFakeDeadPeer(t *testing.T) {
	k := asRank(t)
	if k == nil {
		runRanks(t, "TestFakeDeadPeer", 2, time.Minute)
		return
	}
	if k.r == 1 {
		return // dies without making the call
	}
	buf, _ := k.rt.Malloc(64)
	if err := k.c.AllReduce(buf, buf, 8, dtype.Int64, dtype.Sum, k.stream); err != nil {
		t.Fatal(err)
	}
	ev, _ := k.rt.EventCreate()
	k.rt.EventRecord(ev, k.stream)
	time.Sleep(500 * time.Millisecond)
	if done, _ := k.rt.EventQuery(ev); done {
		t.Fatal("an allreduce with a dead peer completed")
	}
	if err := k.c.AsyncError(); err != nil {
		t.Fatalf("async error %v: a dead peer within a host is not reported", err)
	}
	if err := k.c.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := k.rt.StreamSynchronize(k.stream); err != nil {
		t.Fatal(err)
	}
}
