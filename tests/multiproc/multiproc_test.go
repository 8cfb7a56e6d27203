// Package multiproc runs real nexar jobs: several processes of testprog
// started by the nexar launcher (or by hand, where a test needs control of
// each process's environment), over QUIC on loopback.
package multiproc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Paths of the binaries TestMain builds.
var nexarBin, testprogBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nexar-multiproc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "multiproc:", err)
		os.Exit(1)
	}
	nexarBin, testprogBin, err = Build(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "multiproc:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Build compiles cmd/nexar and testprog into dir and returns their paths.
func Build(dir string) (nexar, testprog string, err error) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			return "", "", errors.New("no go tool to build the test binaries")
		}
	}
	nexar, testprog = filepath.Join(dir, "nexar"), filepath.Join(dir, "testprog")
	for _, b := range []struct{ out, pkg string }{
		{nexar, "github.com/nexar-go/nexar/cmd/nexar"},
		{testprog, "github.com/nexar-go/nexar/tests/multiproc/testprog"},
	} {
		cmd := exec.Command(gobin, "build", "-o", b.out, b.pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nexar, testprog, nil
}

// cleanEnv is this process's environment without the variables that
// would tell a rank where it belongs, so each test states them itself.
// startRun starts `nexar run ARGS` with cleanEnv(env...) and returns the
// command, its stderr so far, and its stdout line by line (closed at EOF).
func startRun(t *testing.T, ctx context.Context, args []string, env ...string) (*exec.Cmd, *bytes.Buffer, <-chan string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, nexarBin, args...)
	cmd.Env = cleanEnv(env...)
	errOut := new(bytes.Buffer)
	cmd.Stderr = errOut
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, errOut, lines
}

func cleanEnv(extra ...string) []string {
	drop := regexp.MustCompile(`^(NEXAR_|RANK=|LOCAL_RANK=|WORLD_SIZE=|LOCAL_WORLD_SIZE=|MASTER_ADDR=|MASTER_PORT=|SLURM_|OMPI_COMM_WORLD_)`)
	var env []string
	for _, kv := range os.Environ() {
		if !drop.MatchString(kv) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// launch runs `nexar run args...` to completion (bounded by d) and returns
// its stdout, stderr and exit status.
func launch(t *testing.T, d time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, nexarBin, append([]string{"run"}, args...)...)
	cmd.Env = cleanEnv()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("nexar run %v did not finish in %v\nstdout:\n%s\nstderr:\n%s", args, d, o.String(), e.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("nexar run: %v", err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

func TestRunCheck(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			start := time.Now()
			out, errOut, code := launch(t, 2*time.Minute, "-n", strconv.Itoa(n), "--", testprogBin, "check")
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for r := range n {
				if !strings.Contains(out, fmt.Sprintf("[%d] CHECKED rank=%d size=%d\n", r, r, n)) {
					t.Errorf("rank %d did not report CHECKED:\n%s", r, out)
				}
			}
			t.Logf("%d ranks checked in %v", n, time.Since(start).Round(time.Millisecond))
		})
	}
}

func TestRunRankFails(t *testing.T) {
	start := time.Now()
	out, errOut, code := launch(t, time.Minute, "-n", "4", "--grace", "3s", "--", testprogBin, "fail", "1")
	if code == 0 {
		t.Fatalf("nexar run exited 0 although rank 1 failed\nstdout:\n%s", out)
	}
	if !strings.Contains(errOut, "rank 1 exited with status 1") {
		t.Errorf("stderr does not name rank 1:\n%s", errOut)
	}
	if !strings.Contains(out, "[1] failing on purpose") {
		t.Errorf("rank 1's output missing:\n%s", out)
	}
	t.Logf("nexar run stopped the job %v after start (exit %d)", time.Since(start).Round(time.Millisecond), code)
}

var (
	readyRE = regexp.MustCompile(`^\[(\d+)\] READY rank=\d+ size=\d+ pid=(\d+)$`)
	faultRE = regexp.MustCompile(`^\[(\d+)\] FAULT rank=\d+ dead=(-?\d+) code="([^"]*)" pending_ms=(\d+) at_unix_ns=(\d+) err=(.*)$`)
)

// TestKillRankDetected SIGKILLs one of 4 ranks that loop on allreduce; each
// survivor's pending allreduce must fail within 5 s, naming the dead rank.
func TestKillRankDetected(t *testing.T) {
	killLooping(t, 4, 2, syscall.SIGKILL, nil, nil, 5*time.Second, "")
}

// TestKillRankSeenThroughProcess SIGKILLs one of 3 or 4 ranks of one host
// with the heartbeat timeout at 30 s: the survivors watch their local
// peers' processes (transport/bulk, pidfds, identities exchanged when the
// data paths are negotiated), so each must fail naming the dead rank with
// a cause saying its process exited, which no other detector says (QUIC's
// idle timeout would take 5 s, the heartbeat 30 s). The bound is loose;
// the log says how long each survivor took.
func TestKillRankSeenThroughProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("processes are watched through pidfds, on Linux only")
	}
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			env := []string{"NEXAR_HEARTBEAT_INTERVAL=1s", "NEXAR_HEARTBEAT_TIMEOUT=30s"}
			killLooping(t, n, n/2, syscall.SIGKILL, env, nil, 10*time.Second, "on this host exited")
		})
	}
}

// TestKillRankDetectedLargeSend SIGKILLs a rank while every rank is in a
// 64 MiB allreduce, so that a survivor is blocked sending into the dead
// rank (its ring, TCP or QUIC stream full): that send must end when the
// detector declares the rank down, not when the transport gives up (QUIC's
// idle timeout). With a 2 s heartbeat timeout every survivor must fail
// within 4 s of the kill, naming the dead rank, on every data path. On one
// host the kernel resets a killed rank's TCP connections at once, so the
// TCP path is also run with SIGSTOP, whose sockets stay open and full: a
// stopped rank of this host is stalled, never declared dead by its silence
// (its process is alive), so there each survivor's call must end at its
// own deadline (30 s), naming the stopped rank: a timeout, or, for a
// survivor whose send the deadline cut mid-frame, the loss of that
// stream ("cancelled mid-frame: context deadline exceeded").
func TestKillRankDetectedLargeSend(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 64 MiB messages between real processes")
	}
	name := map[syscall.Signal]string{syscall.SIGKILL: "KILL", syscall.SIGSTOP: "STOP"}
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		for _, path := range []string{"auto", "off", "tcp"} {
			if sig == syscall.SIGSTOP && path != "tcp" {
				continue
			}
			for _, n := range []int{2, 4} {
				t.Run(fmt.Sprintf("%s/bulk=%s/n=%d", name[sig], path, n), func(t *testing.T) {
					env := []string{"NEXAR_BULK=" + path, "NEXAR_HEARTBEAT_INTERVAL=500ms", "NEXAR_HEARTBEAT_TIMEOUT=2s"}
					args, bound, want := []string{strconv.Itoa(64 << 20)}, 4*time.Second, ""
					if sig == syscall.SIGSTOP {
						args, bound, want = append(args, "30s"), 34*time.Second, "deadline exceeded"
					}
					killLooping(t, n, n-1, sig, env, args, bound, want)
				})
			}
		}
	}
}

// killLooping runs n ranks of `testprog loop loopArgs...` with env, sends
// sig (SIGKILL or SIGSTOP) to rank victim once every rank loops, and checks
// that each survivor's pending allreduce fails within bound of the signal,
// naming the victim (and, unless want is empty, saying want). A stopped
// victim is resumed once every survivor failed.
//
// A job that fails before every rank loops, a heartbeat having timed out,
// is started again, up to three times in all: with the short heartbeat
// timeouts of these tests (2 s in TestKillRankDetectedLargeSend), a rank
// stalled that long on a loaded machine is declared unreachable before the
// kill (seen with -race and a process spinning on one of two cores: "this
// process was stalled ... for=1.164s", then "no heartbeat for 2.1s" at its
// peer). That is the failure detector doing its job, not what these tests
// measure; each such attempt is logged.
func killLooping(t *testing.T, n, victim int, sig syscall.Signal, env, loopArgs []string, bound time.Duration, want string) {
	t.Helper()
	const attempts = 3
	for a := 1; !killLoopingOnce(t, n, victim, sig, env, loopArgs, bound, want, a == attempts); a++ {
		t.Logf("attempt %d of %d failed before the kill; starting the job again", a, attempts)
	}
}

// killLoopingOnce is one attempt of killLooping: false if the job failed
// on a heartbeat timeout before every rank looped and this is not the last
// attempt.
func killLoopingOnce(t *testing.T, n, victim int, sig syscall.Signal, env, loopArgs []string, bound time.Duration, want string, last bool) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// A long grace: the survivors ignore SIGTERM to measure their own detection.
	args := append([]string{"run", "-n", strconv.Itoa(n), "--grace", "20s", "--", testprogBin, "loop"}, loopArgs...)
	cmd, errOut, lines := startRun(t, ctx, args, env...)
	pids := map[int]int{}
	looping := 0
	var killedAt time.Time
	type fault struct {
		dead      int
		code      string
		pendingMS int64
		at        time.Time
		msg       string
	}
	faults := map[int]fault{}
	var all []string
	for line := range lines {
		all = append(all, line)
		if m := readyRE.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			pids[r], _ = strconv.Atoi(m[2])
		}
		if strings.Contains(line, "LOOPING") {
			looping++
			if looping == n {
				killedAt = time.Now()
				if err := syscall.Kill(pids[victim], sig); err != nil {
					t.Fatalf("kill rank %d (pid %d): %v", victim, pids[victim], err)
				}
			}
		}
		if m := faultRE.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			dead, _ := strconv.Atoi(m[2])
			pend, _ := strconv.ParseInt(m[4], 10, 64)
			ns, _ := strconv.ParseInt(m[5], 10, 64)
			faults[r] = fault{dead, m[3], pend, time.Unix(0, ns), m[6]}
			if _, ok := faults[victim]; sig == syscall.SIGSTOP && !ok && len(faults) == n-1 {
				syscall.Kill(pids[victim], syscall.SIGCONT)
			}
		}
	}
	err := cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("job did not end\nstdout:\n%s\nstderr:\n%s", strings.Join(all, "\n"), errOut.String())
	}
	if killedAt.IsZero() {
		report := fmt.Sprintf("ranks never all reached the loop (err %v)\nstdout:\n%s\nstderr:\n%s", err, strings.Join(all, "\n"), errOut.String())
		// Only a heartbeat timeout is retried: a crash or an error of the
		// warm-up calls fails at once.
		if !last && strings.Contains(strings.Join(all, "\n")+errOut.String(), "no heartbeat for") {
			t.Log(report)
			return false
		}
		t.Fatal(report)
	}
	if err == nil {
		t.Error("nexar run exited 0 after a rank was killed")
	}
	if sig == syscall.SIGKILL && !strings.Contains(errOut.String(), fmt.Sprintf("rank %d was killed by signal 9", victim)) {
		t.Errorf("nexar run does not name the killed rank:\n%s", errOut.String())
	}
	for r := range n {
		if r == victim {
			if f, ok := faults[r]; ok {
				t.Logf("rank %d, resumed, was told: %s", r, f.msg)
			}
			continue
		}
		f, ok := faults[r]
		if !ok {
			t.Errorf("rank %d reported no failure\nstdout:\n%s", r, strings.Join(all, "\n"))
			continue
		}
		took := f.at.Sub(killedAt)
		t.Logf("rank %d: detected the death of rank %d %v after the kill (op pending %d ms): %s",
			r, victim, took.Round(time.Millisecond), f.pendingMS, f.msg)
		if took > bound {
			t.Errorf("rank %d took %v to detect the kill, want < %v", r, took, bound)
		}
		if f.dead != victim || !strings.Contains(f.msg, fmt.Sprintf("rank %d", victim)) {
			t.Errorf("rank %d blames rank %d (%s), want rank %d", r, f.dead, f.msg, victim)
		}
		if want != "" && !strings.Contains(f.msg, want) {
			t.Errorf("rank %d: %q does not say %q", r, f.msg, want)
		}
		// A stopped rank of this host is stalled, never dead: the call
		// waiting on it ends at its own deadline, naming it; one whose
		// send that deadline cut mid-frame has lost the stream to it.
		wantCode := []string{"peer down"}
		if sig == syscall.SIGSTOP {
			wantCode = []string{"timeout"}
			if want == "deadline exceeded" {
				wantCode = append(wantCode, "peer down")
			}
		}
		if !slices.Contains(wantCode, f.code) {
			t.Errorf("rank %d: code %q, want one of %q", r, f.code, wantCode)
		}
	}
	return true
}

// proc is a rank or seed started by hand.
type proc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // stdout and stderr
	err  error
	done chan struct{}
}

func start(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits up to d for p to exit and returns its error.
func (p *proc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("%s did not exit within %v; output:\n%s", p.cmd.Path, d, p.out.String())
		return nil
	}
}

// TestWrongTokenRefused starts a stand-alone seed, has a process with the
// wrong token try to join (it must get an authentication error), then forms
// the job with the right token through the same seed.
func TestWrongTokenRefused(t *testing.T) {
	token := newToken(t)
	seedAddr := "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
	seed := start(t, cleanEnv("NEXAR_TOKEN="+token), nexarBin, "seed", "--listen", seedAddr, "--world-size", "2")

	base := []string{"NEXAR_WORLD_SIZE=2", "NEXAR_SEED=" + seedAddr, "NEXAR_BIND_ADDR=127.0.0.1:0"}
	intruder := start(t, cleanEnv(append(base, "NEXAR_RANK=1", "NEXAR_TOKEN="+newToken(t))...), testprogBin, "auth")
	if err := intruder.wait(t, time.Minute); err != nil {
		t.Fatalf("wrong-token process: %v\n%s", err, intruder.out.String())
	}
	if !strings.Contains(intruder.out.String(), "AUTH-REFUSED") {
		t.Fatalf("wrong-token process was not refused:\n%s", intruder.out.String())
	}
	t.Logf("refused: %s", strings.TrimSpace(intruder.out.String()))

	// The seed assigns ranks in join order (NEXAR_RANK=-1) since a rank 0
	// on the seed's host would embed a seed of its own.
	var ranks []*proc
	for range 2 {
		ranks = append(ranks, start(t, cleanEnv(append(base, "NEXAR_RANK=-1", "NEXAR_TOKEN="+token)...), testprogBin, "check"))
	}
	for i, p := range ranks {
		if err := p.wait(t, 2*time.Minute); err != nil {
			t.Errorf("rank process %d: %v\n%s", i, err, p.out.String())
		}
	}
	if err := seed.wait(t, 30*time.Second); err != nil {
		t.Errorf("nexar seed: %v\n%s", err, seed.out.String())
	}
	if !strings.Contains(seed.out.String(), "refused") {
		t.Errorf("the seed did not log the refusal:\n%s", seed.out.String())
	}
}

// TestRandomBytes sprays random datagrams, some shaped like QUIC long-header
// packets, at every member's port and at the seed's while a job forms and
// runs; the job must still complete with correct results.
func TestRandomBytes(t *testing.T) {
	const n = 4
	token := newToken(t)
	// The sprayer's socket first: bound later, it could take one of the
	// ports just picked (and released) for the job.
	junk, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	seedPort := freeUDPPort(t)
	seedAddr := "127.0.0.1:" + strconv.Itoa(seedPort)
	targets := []string{seedAddr}
	var env [][]string
	for r := range n {
		addr := "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
		targets = append(targets, addr)
		env = append(env, cleanEnv("NEXAR_RANK="+strconv.Itoa(r), "NEXAR_WORLD_SIZE="+strconv.Itoa(n),
			"NEXAR_SEED="+seedAddr, "NEXAR_TOKEN="+token, "NEXAR_BIND_ADDR="+addr))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent = spray(junk, targets, stop)
	}()
	var ranks []*proc
	for r := range n {
		ranks = append(ranks, start(t, env[r], testprogBin, "soak", "3s"))
		if r == 0 {
			time.Sleep(300 * time.Millisecond) // let the seed take some garbage alone first
		}
	}
	for r, p := range ranks {
		if err := p.wait(t, 2*time.Minute); err != nil {
			t.Errorf("rank %d: %v\n%s", r, err, p.out.String())
		} else if !strings.Contains(p.out.String(), "SOAKED") {
			t.Errorf("rank %d did not finish its soak:\n%s", r, p.out.String())
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("sent %d junk datagrams to %d ports", sent, len(targets))
	if sent == 0 {
		t.Error("no junk was sent")
	}
}

// spray sends junk from c to every target until stop closes; it returns
// how many datagrams went out.
func spray(c net.PacketConn, targets []string, stop <-chan struct{}) int64 {
	var addrs []net.Addr
	for _, t := range targets {
		a, err := net.ResolveUDPAddr("udp", t)
		if err == nil {
			addrs = append(addrs, a)
		}
	}
	var count int64
	buf := make([]byte, 1500)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return count
		case <-tick.C:
		}
		size := 1 + int(buf[0])*5%1400
		rand.Read(buf[:size])
		switch i % 3 {
		case 0: // QUIC v1 long header (Initial), random rest
			buf[0] = 0xc0 | buf[0]&0x0f
			copy(buf[1:5], []byte{0, 0, 0, 1})
			if size < 1200 {
				size = 1200
			}
		case 1: // short header
			buf[0] = 0x40 | buf[0]&0x3f
		}
		for _, a := range addrs {
			if _, err := c.WriteTo(buf[:size], a); err == nil {
				count++
			}
		}
	}
}

var formationRE = regexp.MustCompile(`FORMATION rank=0 formed=(true|false) new_ms=(\d+) first_call_ms=(\d+) dead=(-?\d+) code="([^"]*)"`)

// TestPeerLeavesRightAfterNew: rank 1 leaves as soon as its New returns
// (destroying its communicator, or exiting without that). Rank 0 must learn
// it within seconds, naming rank 1: in New if it was still forming, else
// in its first call; never after the whole connect timeout.
func TestPeerLeavesRightAfterNew(t *testing.T) {
	const connectTimeout = 30 * time.Second
	for _, how := range []string{"close", "exit"} {
		t.Run(how, func(t *testing.T) {
			for run := range 3 {
				seed := "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
				base := []string{"NEXAR_WORLD_SIZE=2", "NEXAR_SEED=" + seed, "NEXAR_TOKEN=" + newToken(t),
					"NEXAR_CONNECT_TIMEOUT=" + connectTimeout.String()}
				var ps []*proc
				for r := range 2 {
					ps = append(ps, start(t, cleanEnv(append(base, "NEXAR_RANK="+strconv.Itoa(r))...), testprogBin, "leave", "1", how))
				}
				for r, p := range ps {
					if err := p.wait(t, 2*connectTimeout); err != nil {
						t.Fatalf("rank %d: %v\n%s", r, err, p.out.String())
					}
				}
				out := ps[0].out.String()
				m := formationRE.FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("rank 0 printed no FORMATION line:\n%s", out)
				}
				newMS, _ := strconv.Atoi(m[2])
				firstMS, _ := strconv.Atoi(m[3])
				t.Logf("run %d: rank 0 formed=%s, New %d ms, first call %d ms, dead=%s code=%s", run, m[1], newMS, firstMS, m[4], m[5])
				if m[4] != "1" || m[5] != "peer down" {
					t.Errorf("rank 0 got dead=%s code=%s, want rank 1 and code \"peer down\":\n%s", m[4], m[5], out)
				}
				// "exit" is seen through QUIC's idle timeout (5 s).
				if d := time.Duration(newMS+firstMS) * time.Millisecond; d > 15*time.Second {
					t.Errorf("rank 0 took %v to learn that rank 1 left (connect timeout %v)", d, connectTimeout)
				}
			}
		})
	}
}
