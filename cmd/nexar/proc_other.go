//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts a rank in its own process group, so that stopping it
// also stops what it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// exitedNow is false where no non-reaping wait is at hand: nexar run then
// names only the first rank whose exit it saw.
func exitedNow(pid int) bool { return false }
