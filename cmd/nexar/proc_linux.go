package main

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts a rank in its own process group, so that stopping it
// also stops what it started, and kills it if the launcher dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// exitedNow reports whether the rank's process has already exited (a zombie
// its Wait goroutine has not reaped yet, or reaped a moment ago), without
// reaping it: WNOWAIT leaves it to that goroutine.
func exitedNow(pid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if errors.Is(err, unix.ECHILD) {
		return true
	}
	return err == nil && info.Signo != 0
}
