package main

import (
	"os/exec"
	"testing"
	"time"
)

// TestExitedNow: the probe sees a child that has exited without reaping
// it (its Wait still gets the status), and does not see a live one.
func TestExitedNow(t *testing.T) {
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	defer func() { _ = live.Process.Kill(); _ = live.Wait() }()
	if exitedNow(live.Process.Pid) {
		t.Errorf("exitedNow(live child) = true")
	}

	gone := exec.Command("sh", "-c", "exit 3")
	if err := gone.Start(); err != nil {
		t.Skipf("no sh: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !exitedNow(gone.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("exitedNow never saw the child that exits at once")
		}
		time.Sleep(time.Millisecond)
	}
	err := gone.Wait()
	if code := gone.ProcessState.ExitCode(); code != 3 {
		t.Errorf("Wait after the probe: %v, exit code %d, want 3 (the probe must not reap)", err, code)
	}
	// Reaped: the pid is no child any more, which counts as gone.
	if !exitedNow(gone.Process.Pid) {
		t.Errorf("exitedNow(reaped child) = false")
	}
}
