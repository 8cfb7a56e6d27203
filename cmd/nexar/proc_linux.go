package main

import "syscall"

// sysProcAttr puts a rank in its own process group, so that stopping it
// also stops what it started, and kills it if the launcher dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
