package multiproc

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStoppedLocalRankLives SIGSTOPs one of 4 ranks of one host while they
// soak on allreduce, past the heartbeat timeout (3 s) and, in the long
// case, past QUIC's default idle timeout (5 s), then resumes it: its
// process is alive (the others watch it through a pidfd), so it is stalled,
// not dead. Every rank must finish the soak and its final barrier, and the
// others must have reported it stalled (the stop was long enough to count).
func TestStoppedLocalRankLives(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("processes are watched through pidfds, on Linux only")
	}
	for _, stopFor := range []time.Duration{4500 * time.Millisecond, 8 * time.Second} {
		t.Run(stopFor.String(), func(t *testing.T) { stopLocalRank(t, stopFor) })
	}
}

func stopLocalRank(t *testing.T, stopFor time.Duration) {
	const n, victim = 4, 2
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	soak := stopFor + 10*time.Second // rank 0 stops the soak this long after its start
	cmd, errOut, lines := startRun(t, ctx, []string{"run", "-n", strconv.Itoa(n), "--", testprogBin, "soak", soak.String()})
	pids := map[int]int{}
	var all []string
	soaked, ok := 0, 0
	for line := range lines {
		all = append(all, line)
		if m := readyRE.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			pids[r], _ = strconv.Atoi(m[2])
			if len(pids) == n {
				pid := pids[victim]
				// Once the soak runs (a second in), stop the victim for stopFor.
				time.AfterFunc(time.Second, func() {
					if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
						t.Errorf("stop rank %d: %v", victim, err)
						return
					}
					time.AfterFunc(stopFor, func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
				})
			}
		}
		if strings.Contains(line, "SOAKED") {
			soaked++
		}
		if strings.Contains(line, "] OK rank=") {
			ok++
		}
	}
	err := cmd.Wait()
	report := fmt.Sprintf("stdout:\n%s\nstderr:\n%s", strings.Join(all, "\n"), errOut.String())
	if ctx.Err() != nil {
		t.Fatalf("job did not end\n%s", report)
	}
	if err != nil || soaked != n || ok != n {
		t.Fatalf("job failed (%v): %d ranks soaked, %d finished, want %d\n%s", err, soaked, ok, n, report)
	}
	stalled := strings.Count(errOut.String(), "peers stalled")
	if stalled == 0 {
		t.Fatalf("no rank reported rank %d stalled: the stop did not outlast the heartbeat timeout\n%s", victim, report)
	}
	for _, bad := range []string{"peer unreachable", "declared unreachable"} {
		if strings.Contains(errOut.String()+strings.Join(all, "\n"), bad) {
			t.Errorf("a rank logged %q\n%s", bad, report)
		}
	}
	t.Logf("stopped %v: %d stall reports, every rank finished", stopFor, stalled)
}

// TestStoppedLocalRankTimesOut keeps one of 4 ranks of one host stopped:
// it is never declared dead (its process is alive), so each survivor's
// pending allreduce must end at its own deadline (5 s) with a timeout
// that names the stopped rank as stalled, never hang.
func TestStoppedLocalRankTimesOut(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("processes are watched through pidfds, on Linux only")
	}
	killLooping(t, 4, 2, syscall.SIGSTOP, nil, []string{"4096", "5s"}, 9*time.Second, "stalled")
}
