package netns

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStoppedRemoteRank: a rank on the other host stopped (SIGSTOP) for 6 s
// while the job soaks on allreduce, twice the heartbeat timeout with
// heartbeats as regular as they come, is stalled, not dead: its kernel
// still answers on the bulk TCP connections (keepalives), which a dead
// process's kernel would have closed (docs/fault-tolerance.md, "Failure
// detection"). Both ranks finish, and rank 0 reported rank 1 stalled.
// Killed instead, it is seen at once, by its closed connections, not after
// the heartbeat timeout.
func TestStoppedRemoteRank(t *testing.T) {
	a, b := twoHosts(t)
	_, testprog := build(t)
	for i, kill := range []bool{false, true} {
		name := map[bool]string{false: "stopped 6s", true: "killed"}[kill]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			procs := onePerHost(t, ctx, []host{a, b}, 29700+i, nil, testprog, "soak", "14s")
			deadline := time.Now().Add(60 * time.Second)
			for strings.Count(procs[0].output()+procs[1].output(), "READY") < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("the job never formed:\n%s\n%s", procs[0].output(), procs[1].output())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if p := dataPaths(procs[0].output())[[2]int{0, 1}]; !strings.HasPrefix(p, "tcp") {
				t.Fatalf("rank 0's data path to rank 1 is %q, want tcp", p)
			}
			time.Sleep(time.Second) // soaking
			victim := procs[1].cmd.Process.Pid
			if kill {
				killed := time.Now()
				if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				err := procs[0].cmd.Wait()
				seen := time.Since(killed)
				out := procs[0].output()
				if err == nil || !strings.Contains(out, "rank 1") {
					t.Fatalf("rank 0 after rank 1 was killed: %v\n%s", err, out)
				}
				t.Logf("rank 0 ended %v after the kill: %s", seen.Round(time.Millisecond), lastLine(out))
				if seen > 2500*time.Millisecond {
					t.Errorf("the kill was seen after %v, want well within the heartbeat timeout (3 s): by the closed connections", seen)
				}
				_ = procs[1].cmd.Wait()
				return
			}
			if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(6 * time.Second)
			_ = syscall.Kill(victim, syscall.SIGCONT)
			for _, p := range procs {
				if err := p.cmd.Wait(); err != nil {
					t.Errorf("%s: %v\n%s", p.name, err, p.output())
				}
			}
			out := procs[0].output()
			for r, p := range procs {
				if !strings.Contains(p.output(), fmt.Sprintf("OK rank=%d", r)) {
					t.Errorf("rank %d did not finish:\n%s", r, p.output())
				}
			}
			if !strings.Contains(out, "peers stalled") {
				t.Errorf("rank 0 never reported rank 1 stalled: the stop did not outlast the heartbeat timeout\n%s", out)
			}
			for _, bad := range []string{"unreachable", "no heartbeat"} {
				if strings.Contains(out+procs[1].output(), bad) {
					t.Errorf("a rank logged %q:\n%s\n%s", bad, out, procs[1].output())
				}
			}
		})
	}
}

// lastLine is out's last non-empty line.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
