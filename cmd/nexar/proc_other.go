//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts a rank in its own process group, so that stopping it
// also stops what it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
