//go:build cgo

package hier

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/cudatest"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
	fakenccl "github.com/nexar-go/nexar/tests/fakes/nccl"
	"github.com/nexar-go/nexar/transport/mesh"
)

// These tests run jobs of several processes (this test binary again, one
// process per rank) on the fake CUDA runtime and the fake NCCL
// (tests/fakes): device memory that the host cannot read (a host read dies
// by SIGSEGV), streams that run on threads of their own after a delay, and
// an NCCL that hangs, as NCCL does, when a peer is missing. Two "hosts" are
// simulated on this machine by Options.HostID; nexar itself sees one host
// (its shared-memory path and same-host death detection).

var (
	buildOnce      sync.Once
	fakeRT, fakeNC string
	buildDir       string
	buildErr       error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func fakes(t *testing.T) (string, string) {
	t.Helper()
	if p := os.Getenv("HIER_TEST_RT"); p != "" {
		return p, os.Getenv("HIER_TEST_NC")
	}
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "nexar-hier-"); buildErr != nil {
			return
		}
		if fakeRT, buildErr = cudart.Build(buildDir); buildErr == nil {
			fakeNC, buildErr = fakenccl.Build(buildDir)
		}
	})
	if buildErr != nil {
		t.Fatalf("the fakes failed to build: %v", buildErr)
	}
	return fakeRT, fakeNC
}

// job is a run of one test as len(hosts) processes: rank r on host hosts[r].
type job struct {
	t     *testing.T
	cmds  []*exec.Cmd
	lines []chan string // each rank's output, line by line
	outs  []strings.Builder
	mu    sync.Mutex
	wg    sync.WaitGroup
}

// execSelf is this test binary running the tests that match run, with env
// added to this process's environment.
func execSelf(run string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startJob(t *testing.T, test string, hosts []string, env ...string) *job {
	t.Helper()
	return startJobEnv(t, test, hosts, func(int) []string { return env })
}

// startJobEnv is startJob with rank r's extra environment env(r).
func startJobEnv(t *testing.T, test string, hosts []string, env func(r int) []string) *job {
	t.Helper()
	rt, nc := fakes(t)
	j := &job{t: t, outs: make([]strings.Builder, len(hosts))}
	port := freePort(t)
	for r, host := range hosts {
		cmd := execSelf("^"+test+"$", "HIER_TEST_RT="+rt, "HIER_TEST_NC="+nc, "NEXAR_CUDART="+rt,
			"HIER_TEST_HOST="+host, fmt.Sprintf("NEXAR_RANK=%d", r), fmt.Sprintf("NEXAR_WORLD_SIZE=%d", len(hosts)),
			fmt.Sprintf("NEXAR_SEED=127.0.0.1:%d", port), "NEXAR_TOKEN=hier-test-token-0123456789abcdef",
			"NEXAR_FAKE_CUDA_DELAY_US=200")
		cmd.Env = append(cmd.Env, env(r)...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		j.cmds = append(j.cmds, cmd)
		j.lines = append(j.lines, lines)
		j.wg.Add(1)
		go func(r int) {
			defer j.wg.Done()
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				j.mu.Lock()
				j.outs[r].WriteString(sc.Text() + "\n")
				j.mu.Unlock()
				select {
				case lines <- sc.Text():
				default:
				}
			}
		}(r)
	}
	return j
}

// await waits for a line containing s from rank r.
func (j *job) await(r int, s string, limit time.Duration) {
	j.t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case l, ok := <-j.lines[r]:
			if !ok {
				j.t.Fatalf("rank %d ended before %q:\n%s", r, s, j.out(r))
			}
			if strings.Contains(l, s) {
				return
			}
		case <-deadline:
			j.t.Fatalf("rank %d: no %q within %v:\n%s", r, s, limit, j.out(r))
		}
	}
}

func (j *job) out(r int) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.outs[r].String()
}

// finish waits for every rank (killing all at the limit); skip names ranks
// that are expected to have been killed. Each other rank must pass.
func (j *job) finish(limit time.Duration, skip ...int) {
	j.t.Helper()
	done := make(chan struct{})
	go func() {
		// Output first: Wait closes the pipes, and reads after it are lost.
		j.wg.Wait()
		for _, c := range j.cmds {
			c.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		for _, c := range j.cmds {
			c.Process.Kill()
		}
		<-done
		j.t.Errorf("the job ran past %v", limit)
	}
	for r, c := range j.cmds {
		killed := false
		for _, s := range skip {
			killed = killed || s == r
		}
		if killed {
			continue
		}
		if !c.ProcessState.Success() || !strings.Contains(j.out(r), "\nPASS") {
			j.t.Errorf("rank %d failed (%v):\n%s", r, c.ProcessState, j.out(r))
		}
	}
}

// member is this process as a rank of a test job.
type member struct {
	t      *testing.T
	c      *core.Comm
	h      *Comm
	rt     *cuda.Runtime
	st     *stage.Stager
	r, n   int
	stream cuda.Stream
}

// join makes this process a rank, or returns nil in the test's parent.
func join(t *testing.T, mode Mode) *member {
	m, err := joinErr(t, mode)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// joinErr is join that returns New's error (HIER_TEST_UNUSABLE makes this
// rank one that cannot use NCCL).
func joinErr(t *testing.T, mode Mode) (*member, error) {
	host := os.Getenv("HIER_TEST_HOST")
	if host == "" {
		return nil, nil
	}
	rtPath, ncPath := fakes(t)
	ctx := context.Background()
	cfg, err := core.ConfigFromLookup(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{t: t}
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	if m.c, err = core.New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.c.Close() })
	if m.rt, err = cuda.Open(rtPath); err != nil {
		t.Fatal(err)
	}
	m.st = stage.New(m.rt, stage.Options{WaitTimeout: time.Minute})
	lib, err := nccl.Open(ncPath)
	if err != nil {
		t.Fatal(err)
	}
	deps := Deps{Runtime: m.rt, Stager: m.st, NCCL: lib}
	if why := os.Getenv("HIER_TEST_UNUSABLE"); why != "" {
		deps = Deps{Unusable: why}
	}
	m.r, m.n = m.c.Rank(), m.c.Size()
	if m.stream, err = m.rt.StreamCreate(); err != nil {
		t.Fatal(err)
	}
	if m.h, err = New(ctx, m.c, deps, Options{Mode: mode, HostID: host}); err != nil {
		return m, err
	}
	t.Cleanup(func() { m.h.Close() })
	return m, nil
}

// input is rank r's element i: small integers, exact in every type used,
// in sums of a few ranks, and (1 or 2) in products.
func input(op collective.Op, r, i int) float64 {
	if op == collective.Prod {
		return float64(1 + (i+r)%2)
	}
	return float64((i*7+r*3)%11 + 1)
}

var encode = cudatest.Encode

func reduceRef(op collective.Op, n int, f func(r int) float64) float64 {
	acc := f(0)
	for r := 1; r < n; r++ {
		switch x := f(r); op {
		case collective.Sum, collective.Avg:
			acc += x
		case collective.Prod:
			acc *= x
		case collective.Max:
			acc = math.Max(acc, x)
		case collective.Min:
			acc = math.Min(acc, x)
		}
	}
	if op == collective.Avg {
		acc = float64(float32(acc) / float32(n))
	}
	return acc
}

func (m *member) upload(b []byte) cuda.DevicePtr { return cudatest.Upload(m.t, m.rt, b) }

// download reads p after the work on the member's stream.
func (m *member) download(p cuda.DevicePtr, n int) []byte {
	return cudatest.Download(m.t, m.rt, m.stream, p, n)
}

func (m *member) expect(what string, got, want []byte, es int) {
	m.t.Helper()
	if len(got) != len(want) {
		m.t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := 0; i < len(got); i += es {
		if string(got[i:i+es]) != string(want[i:i+es]) {
			m.t.Fatalf("%s: element %d is %x, want %x", what, i/es, got[i:i+es], want[i:i+es])
		}
	}
}

// layouts are the jobs the collectives are checked on: two hosts of 3 and 1
// ranks, placed out of order; two of 2, alternating (NCCL's own
// reduce-scatter and allgather inside); one host (NCCL alone).
var layouts = []struct {
	name  string
	hosts []string
}{
	{"3+1", []string{"A", "B", "A", "A"}},
	{"2+2", []string{"A", "B", "A", "B"}},
	{"1host", []string{"A", "A", "A"}},
}

// TestCollectives checks every collective against a host-computed
// reference, element by element: 3 types, odd counts (one crossing the
// fake NCCL's chunk), blocking and stream-ordered.
func TestCollectives(t *testing.T) {
	if m := join(t, On); m != nil {
		m.collectives()
		return
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			j := startJob(t, "TestCollectives", l.hosts)
			j.finish(4 * time.Minute)
		})
	}
}

func (m *member) collectives() {
	t, ctx, r, n := m.t, context.Background(), m.r, m.n
	if !m.h.Active() {
		t.Fatalf("not active: %s", m.h.Reason())
	}
	for _, dt := range []collective.DType{collective.Float32, collective.Int64, collective.BFloat16} {
		es := dt.Size()
		for _, count := range []int{1, 7, 1001, 70001} {
			for _, blocking := range []bool{true, false} {
				what := fmt.Sprintf("%v count %d blocking %v", dt, count, blocking)
				ops := []collective.Op{collective.Sum}
				if count == 7 {
					ops = append(ops, collective.Max, collective.Prod)
					if dt == collective.Float32 {
						ops = append(ops, collective.Avg)
					}
				}
				for _, op := range ops {
					in := make([]float64, count)
					want := make([]float64, count)
					for i := range in {
						in[i] = input(op, r, i)
						want[i] = reduceRef(op, n, func(q int) float64 { return input(op, q, i) })
					}
					send := m.upload(encode(dt, in))
					recv := m.upload(make([]byte, count*es))
					if err := m.h.Allreduce(ctx, send, recv, count, dt, op, m.stream, blocking); err != nil {
						t.Fatalf("allreduce %v %s: %v", op, what, err)
					}
					m.expect(fmt.Sprintf("allreduce %v %s", op, what), m.download(recv, count*es), encode(dt, want), es)
					m.expect("allreduce sendbuf (untouched)", m.download(send, count*es), encode(dt, in), es)
					// In place.
					if err := m.h.Allreduce(ctx, send, send, count, dt, op, m.stream, blocking); err != nil {
						t.Fatalf("allreduce in place %v %s: %v", op, what, err)
					}
					m.expect(fmt.Sprintf("allreduce in place %v %s", op, what), m.download(send, count*es), encode(dt, want), es)
					m.rt.Free(send)
					m.rt.Free(recv)
				}

				// Broadcast from the last rank, then from rank 1.
				for _, root := range []int{n - 1, 1} {
					in := make([]float64, count)
					for i := range in {
						in[i] = input(collective.Sum, r, i)
					}
					buf := m.upload(encode(dt, in))
					if err := m.h.Broadcast(ctx, buf, count, dt, root, m.stream, blocking); err != nil {
						t.Fatalf("broadcast root %d %s: %v", root, what, err)
					}
					for i := range in {
						in[i] = input(collective.Sum, root, i)
					}
					m.expect(fmt.Sprintf("broadcast root %d %s", root, what), m.download(buf, count*es), encode(dt, in), es)
					m.rt.Free(buf)
				}

				// Allgather, out of place and in place.
				mine := make([]float64, count)
				all := make([]float64, count*n)
				for q := 0; q < n; q++ {
					for i := 0; i < count; i++ {
						all[q*count+i] = input(collective.Sum, q, i)
					}
				}
				copy(mine, all[r*count:])
				send := m.upload(encode(dt, mine))
				recv := m.upload(make([]byte, count*n*es))
				if err := m.h.Allgather(ctx, send, recv, count, dt, m.stream, blocking); err != nil {
					t.Fatalf("allgather %s: %v", what, err)
				}
				m.expect("allgather "+what, m.download(recv, count*n*es), encode(dt, all), es)
				inplace := make([]float64, count*n)
				copy(inplace[r*count:], mine)
				ip := m.upload(encode(dt, inplace))
				if err := m.h.Allgather(ctx, ip, ip, count, dt, m.stream, blocking); err != nil {
					t.Fatalf("allgather in place %s: %v", what, err)
				}
				m.expect("allgather in place "+what, m.download(ip, count*n*es), encode(dt, all), es)

				// Reduce-scatter, out of place and in place (result at the start).
				rs := make([]float64, count*n)
				for i := range rs {
					rs[i] = input(collective.Sum, r, i)
				}
				want := make([]float64, count)
				for i := range want {
					want[i] = reduceRef(collective.Sum, n, func(q int) float64 { return input(collective.Sum, q, r*count+i) })
				}
				rsd := m.upload(encode(dt, rs))
				if err := m.h.ReduceScatter(ctx, rsd, send, count, dt, collective.Sum, m.stream, blocking); err != nil {
					t.Fatalf("reduce-scatter %s: %v", what, err)
				}
				m.expect("reduce-scatter "+what, m.download(send, count*es), encode(dt, want), es)
				if err := m.h.ReduceScatter(ctx, rsd, rsd, count, dt, collective.Sum, m.stream, blocking); err != nil {
					t.Fatalf("reduce-scatter in place %s: %v", what, err)
				}
				m.expect("reduce-scatter in place "+what, m.download(rsd, count*es), encode(dt, want), es)
				for _, p := range []cuda.DevicePtr{send, recv, ip, rsd} {
					m.rt.Free(p)
				}
			}
		}
	}
	if err := m.c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
}

// sequence returns 0, 1, ..., n-1 as dt.
func sequence(dt collective.DType, n, r int) []byte {
	v := make([]float64, n)
	for i := range v {
		v[i] = input(collective.Sum, r, i)
	}
	return encode(dt, v)
}

// TestStreamOrder: a stream-ordered call waits for the work queued on its
// stream before it (the input's copy, held behind a gate), and returns
// before its own work is complete: the result is there once the stream has
// passed it.
func TestStreamOrder(t *testing.T) {
	m := join(t, On)
	if m == nil {
		startJob(t, "TestStreamOrder", []string{"A", "B", "A", "A"}, "NEXAR_FAKE_CUDA_DELAY_US=30000").finish(2 * time.Minute)
		return
	}
	rtPath, _ := fakes(t)
	const count = 1001
	dt := collective.Float32
	nb := count * dt.Size()
	pin, err := m.rt.MallocHost(nb)
	if err != nil {
		t.Fatal(err)
	}
	copy(pin, sequence(dt, count, m.r))
	buf := m.upload(make([]byte, nb))
	g, err := cudart.NewGate(rtPath, uintptr(m.stream))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.rt.MemcpyAsync(uintptr(buf), uintptr(unsafePointer(pin)), nb, cuda.MemcpyHostToDevice, m.stream); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- m.h.Allreduce(context.Background(), buf, buf, count, dt, collective.Sum, m.stream, false)
	}()
	select {
	case err := <-done:
		t.Fatalf("allreduce returned (%v) while its input was still held on the stream", err)
	case <-time.After(300 * time.Millisecond):
	}
	g.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ev, _ := m.rt.EventCreate()
	m.rt.EventRecord(ev, m.stream)
	if ok, _ := m.rt.EventQuery(ev); ok {
		t.Fatal("the stream had passed the allreduce when it returned: its last phase was not left to the stream")
	}
	want := make([]float64, count)
	for i := range want {
		want[i] = reduceRef(collective.Sum, m.n, func(q int) float64 { return input(collective.Sum, q, i) })
	}
	if err := m.rt.MemcpyAsync(uintptr(unsafePointer(pin)), uintptr(buf), nb, cuda.MemcpyDeviceToHost, m.stream); err != nil {
		t.Fatal(err)
	}
	if err := m.rt.StreamSynchronize(m.stream); err != nil {
		t.Fatal(err)
	}
	m.expect("allreduce read back on the stream", pin, encode(dt, want), dt.Size())
}

// TestMismatch: ranks that make different calls all fail, as mismatched,
// and none hangs: on one host the call never reaches NCCL; between hosts
// nexar's signatures tell.
func TestMismatch(t *testing.T) {
	if m := join(t, On); m != nil {
		ctx := context.Background()
		buf := m.upload(make([]byte, 64))
		var err error
		start := time.Now()
		switch os.Getenv("HIER_TEST_CASE") {
		case "count": // rank 2 differs from the other ranks of host A
			err = m.h.Allreduce(ctx, buf, buf, 7+boolInt(m.r == 2), collective.Int64, collective.Sum, m.stream, true)
		case "kind": // host B broadcasts while host A reduces
			if m.r == 1 {
				err = m.h.Broadcast(ctx, buf, 7, collective.Int64, 0, m.stream, true)
			} else {
				err = m.h.Allreduce(ctx, buf, buf, 7, collective.Int64, collective.Sum, m.stream, true)
			}
		}
		if core.CodeOf(err) != core.CodeMismatch {
			t.Fatalf("rank %d: %v (code %v), want a mismatch", m.r, err, core.CodeOf(err))
		}
		fmt.Printf("rank %d failed after %v: %v\n", m.r, time.Since(start), err)
		if err := m.h.Allreduce(ctx, buf, buf, 1, collective.Int64, collective.Sum, m.stream, true); core.CodeOf(err) != core.CodeMismatch {
			t.Fatalf("a later call: %v, want the sticky mismatch", err)
		}
		return
	}
	for _, c := range []string{"count", "kind"} {
		t.Run(c, func(t *testing.T) {
			startJob(t, "TestMismatch", []string{"A", "B", "A", "A"}, "HIER_TEST_CASE="+c).finish(time.Minute)
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestKill: a rank killed (SIGKILL) while every rank is inside a
// collective: the others' calls fail within the detection time, naming it,
// NCCL aborted so that nothing hangs. The victim is held inside its own
// call (its stream gated, so it never reaches NCCL).
func TestKill(t *testing.T) {
	if m := join(t, On); m != nil {
		m.killed()
		return
	}
	for _, tc := range []struct {
		name   string
		hosts  []string
		victim int
	}{
		{"local", []string{"A", "B", "A", "A"}, 2},  // a rank of host A: its peers wait in NCCL
		{"remote", []string{"A", "B", "A", "A"}, 1}, // host B's only rank: host A waits between hosts
		{"onehost", []string{"A", "A", "A"}, 1},     // NCCL alone: the work is left on the stream
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := startJob(t, "TestKill", tc.hosts, fmt.Sprintf("HIER_TEST_VICTIM=%d", tc.victim))
			for r := range tc.hosts {
				j.await(r, "in the call", time.Minute)
			}
			time.Sleep(300 * time.Millisecond)
			j.cmds[tc.victim].Process.Signal(syscall.SIGKILL)
			j.finish(time.Minute, tc.victim)
			for r := range tc.hosts {
				if r != tc.victim {
					t.Logf("rank %d: %s", r, lineWith(j.out(r), "failed after"))
				}
			}
		})
	}
}

func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func (m *member) killed() {
	t, ctx := m.t, context.Background()
	victim, _ := strconv.Atoi(os.Getenv("HIER_TEST_VICTIM"))
	const count = 4099
	dt := collective.Float32
	buf := m.upload(sequence(dt, count, m.r))
	// One call that completes first: NCCL and the groups are set up.
	if err := m.h.Allreduce(ctx, buf, buf, count, dt, collective.Sum, m.stream, true); err != nil {
		t.Fatal(err)
	}
	if m.r == victim {
		rtPath, _ := fakes(t)
		if _, err := cudart.NewGate(rtPath, uintptr(m.stream)); err != nil {
			t.Fatal(err)
		}
		fmt.Println("in the call")
		m.h.Allreduce(ctx, buf, buf, count, dt, collective.Sum, m.stream, true)
		t.Fatal("the victim's call returned")
	}
	fmt.Println("in the call")
	start := time.Now()
	blocking := m.r%2 == 0
	err := m.h.Allreduce(ctx, buf, buf, count, dt, collective.Sum, m.stream, blocking)
	if err == nil && !blocking {
		// The work was left on the stream: NCCL, aborted, lets it end.
		sync := make(chan error, 1)
		go func() { sync <- m.rt.StreamSynchronize(m.stream) }()
		select {
		case <-sync:
		case <-time.After(30 * time.Second):
			t.Fatal("the stream still holds the call's NCCL work 30 s after the kill")
		}
		err = m.h.Allreduce(ctx, buf, buf, count, dt, collective.Sum, m.stream, true)
	}
	took := time.Since(start)
	var e *core.Error
	if !errors.As(err, &e) || e.Code != core.CodePeerDown || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", victim)) {
		t.Fatalf("rank %d: %v, want CodePeerDown naming rank %d", m.r, err, victim)
	}
	if took > 20*time.Second {
		t.Fatalf("the failure took %v", took)
	}
	fmt.Printf("rank %d failed after %v: %v\n", m.r, took, err)
	if err := m.h.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestModes: every rank takes the same decision. Auto without a host of
// several ranks, or with a rank that cannot use NCCL, is inactive; On with
// such a rank fails, naming it.
func TestModes(t *testing.T) {
	if os.Getenv("HIER_TEST_HOST") != "" {
		mode, _ := ParseMode(os.Getenv("HIER_TEST_MODE"))
		m, err := joinErr(t, mode)
		want := os.Getenv("HIER_TEST_WANT")
		switch {
		case want == "error":
			if core.CodeOf(err) != core.CodeUnavailable || !strings.Contains(err.Error(), "[1]") {
				t.Fatalf("New: %v, want CodeUnavailable naming rank 1", err)
			}
		case err != nil:
			t.Fatal(err)
		case m.h.Active() != (want == "active") || !strings.Contains(m.h.Reason(), os.Getenv("HIER_TEST_REASON")):
			t.Fatalf("active %v (%s), want %s", m.h.Active(), m.h.Reason(), want)
		}
		if err := m.c.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, tc := range []struct {
		name  string
		hosts []string
		env   []string
	}{
		{"auto/one-rank-hosts", []string{"A", "B"}, []string{"HIER_TEST_MODE=auto", "HIER_TEST_WANT=inactive", "HIER_TEST_REASON=one rank"}},
		{"on/one-rank-hosts", []string{"A", "B"}, []string{"HIER_TEST_MODE=on", "HIER_TEST_WANT=active"}},
		{"auto/unusable", []string{"A", "B", "A"}, []string{"HIER_TEST_MODE=auto", "HIER_TEST_WANT=inactive", "HIER_TEST_REASON=[1] cannot use NCCL"}},
		{"on/unusable", []string{"A", "B", "A"}, []string{"HIER_TEST_MODE=on", "HIER_TEST_WANT=error"}},
		{"off", []string{"A", "A"}, []string{"HIER_TEST_MODE=off", "HIER_TEST_WANT=inactive", "HIER_TEST_REASON=off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env
			j := &job{}
			if strings.Contains(tc.name, "unusable") {
				// Rank 1 cannot use NCCL: its own environment says so.
				j = startJobEnv(t, "TestModes", tc.hosts, func(r int) []string {
					if r == 1 {
						return append(env, "HIER_TEST_UNUSABLE=no NCCL on this rank")
					}
					return env
				})
			} else {
				j = startJob(t, "TestModes", tc.hosts, env...)
			}
			j.finish(time.Minute)
		})
	}
}

// TestP2P: device send and receive within a host through NCCL (ncclSend,
// ncclRecv of the fake), on two hosts of 2 and 1 ranks: blocking and on a
// stream, a message of several of the fake's slots, a shorter message than
// the buffer; a receive whose tag is not the pair's next message, and one
// too small for it, fail (mismatch; truncated with the bytes that fit) and
// leave the pair usable; the rank on the other host is not reachable this
// way; an allreduce afterwards is unaffected.
func TestP2P(t *testing.T) {
	m := join(t, On)
	if m == nil {
		startJob(t, "TestP2P", []string{"A", "A", "B"}, "NEXAR_FAKE_CUDA_DELAY_US=500").finish(2 * time.Minute)
		return
	}
	ctx := context.Background()
	if m.r == 2 {
		if m.h.P2P(0) || m.h.Send(ctx, 0, 8, 0, 1, m.stream, true) == nil {
			t.Fatal("rank 0, on the other host, reachable through NCCL")
		}
	} else {
		peer := 1 - m.r
		if !m.h.P2P(peer) {
			t.Fatalf("rank %d not reachable through NCCL", peer)
		}
		big := sequence(collective.Float32, 70001, 7) // about 274 KiB: 5 of the fake's slots
		short := []byte("a message shorter than its buffer")
		if m.r == 0 {
			src := m.upload(big)
			if err := m.h.Send(ctx, src, len(big), 1, 5, m.stream, true); err != nil {
				t.Fatal(err)
			}
			if err := m.h.Send(ctx, src, len(big), 1, 6, m.stream, false); err != nil {
				t.Fatal(err)
			}
			s := m.upload(short)
			for _, tag := range []uint64{7, 9, 10} {
				if err := m.h.Send(ctx, s, len(short), 1, tag, m.stream, false); err != nil {
					t.Fatal(err)
				}
			}
			m.download(s, 1) // the stream passed every send
		} else {
			dst := m.upload(make([]byte, len(big)))
			if got, err := m.h.Recv(ctx, dst, len(big), 0, 5, m.stream, true); err != nil || got != len(big) {
				t.Fatalf("blocking recv: %d bytes, %v", got, err)
			}
			m.expect("blocking recv", m.download(dst, len(big)), big, 4)
			dst2 := m.upload(make([]byte, len(big)))
			if _, err := m.h.Recv(ctx, dst2, len(big), 0, 6, m.stream, false); err != nil {
				t.Fatal(err)
			}
			m.expect("recv on the stream", m.download(dst2, len(big)), big, 4)
			room := m.upload(make([]byte, 100))
			if got, err := m.h.Recv(ctx, room, 100, 0, 7, m.stream, true); err != nil || got != len(short) {
				t.Fatalf("recv of a shorter message: %d bytes, %v", got, err)
			}
			m.expect("shorter message", m.download(room, len(short)), short, 1)
			var ce *core.Error
			if _, err := m.h.Recv(ctx, room, 100, 0, 8, m.stream, true); !errors.As(err, &ce) || ce.Code != core.CodeMismatch || !strings.Contains(err.Error(), "tag 9") {
				t.Fatalf("recv of tag 8 when tag 9 is next: %v, want a mismatch naming tag 9", err)
			}
			small := m.upload(make([]byte, 10))
			if got, err := m.h.Recv(ctx, small, 10, 0, 10, m.stream, true); !errors.As(err, &ce) || ce.Code != core.CodeTruncated || got != 10 {
				t.Fatalf("recv into a buffer too small: %d bytes, %v; want truncated", got, err)
			}
			m.expect("truncated", m.download(small, 10), short[:10], 1)
		}
	}
	buf := m.upload(encode(collective.Int64, []float64{float64(m.r + 1)}))
	if err := m.h.Allreduce(ctx, buf, buf, 1, collective.Int64, collective.Sum, m.stream, true); err != nil {
		t.Fatal(err)
	}
	m.expect("allreduce after point-to-point", m.download(buf, 8), encode(collective.Int64, []float64{6}), 8)
}
