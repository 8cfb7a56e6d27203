//go:build linux

// Package procwatchtest gives tests a process to watch: a child that
// sleeps until killed, and its procwatch.ID.
package procwatchtest

import (
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/nexar-go/nexar/internal/procwatch"
)

// Child starts a process that sleeps until killed and returns it with its
// identity and a reap that kills and waits for it (idempotent, also run
// at the end of the test). The test is skipped where no child can start.
func Child(t testing.TB) (cmd *exec.Cmd, id procwatch.ID, reap func()) {
	t.Helper()
	cmd = exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a child process: %v", err)
	}
	var once sync.Once
	reap = func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	t.Cleanup(reap)
	st, err := procwatch.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	return cmd, procwatch.ID{PID: cmd.Process.Pid, Start: st, PIDNS: ns}, reap
}
