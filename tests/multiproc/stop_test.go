package multiproc

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStoppedRankResumed SIGSTOPs one of 4 ranks that loop on allreduce,
// past the heartbeat timeout (3 s) and, in the long case, past QUIC's
// default idle timeout (5 s), then resumes it. The others fail naming it;
// the resumed rank must report that it was declared unreachable, naming
// itself, not that a healthy peer is unreachable. The data path is off
// (NEXAR_BULK=off), so no process of this host is watched: the ranks judge
// the stopped one by its silence alone, as they would a rank of another
// host (a watched one is stalled, never dead: TestStoppedLocalRankLives).
func TestStoppedRankResumed(t *testing.T) {
	for _, stopFor := range []time.Duration{4500 * time.Millisecond, 8 * time.Second} {
		t.Run(stopFor.String(), func(t *testing.T) { stopAndResume(t, stopFor) })
	}
}

func stopAndResume(t *testing.T, stopFor time.Duration) {
	const n, victim = 4, 2
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, errOut, lines := startRun(t, ctx, []string{"run", "-n", strconv.Itoa(n), "--grace", "30s", "--", testprogBin, "loop"}, "NEXAR_BULK=off")
	pids := map[int]int{}
	looping, survivors := 0, 0
	var stoppedAt, resumedAt time.Time
	resumed := make(chan time.Time, 1)
	var all []string
	var victimFault []string
	for line := range lines {
		all = append(all, line)
		if m := readyRE.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			pids[r], _ = strconv.Atoi(m[2])
		}
		if strings.Contains(line, "LOOPING") {
			looping++
			if looping == n {
				stoppedAt = time.Now()
				if err := syscall.Kill(pids[victim], syscall.SIGSTOP); err != nil {
					t.Fatalf("stop rank %d: %v", victim, err)
				}
				pid := pids[victim]
				time.AfterFunc(stopFor, func() {
					resumed <- time.Now()
					_ = syscall.Kill(pid, syscall.SIGCONT)
				})
			}
		}
		if m := faultRE.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			if r == victim {
				victimFault = m
				continue
			}
			survivors++
			if m[2] != strconv.Itoa(victim) {
				t.Errorf("rank %d blames rank %s, want %d: %s", r, m[2], victim, line)
			}
		}
	}
	_ = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("job did not end\nstdout:\n%s\nstderr:\n%s", strings.Join(all, "\n"), errOut.String())
	}
	if stoppedAt.IsZero() {
		t.Fatalf("ranks never all reached the loop\nstdout:\n%s\nstderr:\n%s", strings.Join(all, "\n"), errOut.String())
	}
	select {
	case resumedAt = <-resumed:
	default:
	}
	if survivors != n-1 {
		t.Errorf("%d survivors reported a failure, want %d\nstdout:\n%s", survivors, n-1, strings.Join(all, "\n"))
	}
	if victimFault == nil {
		t.Fatalf("the resumed rank reported no failure\nstdout:\n%s\nstderr:\n%s", strings.Join(all, "\n"), errOut.String())
	}
	ns, _ := strconv.ParseInt(victimFault[5], 10, 64)
	t.Logf("stopped %v; resumed rank failed %v after SIGCONT: %s", stopFor,
		time.Unix(0, ns).Sub(resumedAt).Round(time.Millisecond), victimFault[6])
	if victimFault[2] != strconv.Itoa(victim) || victimFault[3] != "peer down" ||
		!strings.Contains(victimFault[6], fmt.Sprintf("this rank (%d) was", victim)) {
		t.Errorf("resumed rank: dead=%s code=%q %s; want dead=%d, peer down, \"this rank (%d) was ...\"",
			victimFault[2], victimFault[3], victimFault[6], victim, victim)
	}
}
