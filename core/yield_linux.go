package core

import "syscall"

// osYield gives the CPU to another runnable thread of the system, if any
// (sched_yield). Waiters call it between polls when this host runs more
// ranks than it has cores: the peer they wait for may need this core.
//
// RawSyscall, not Syscall: sched_yield never blocks, and through Syscall
// a yield that lets the peer run past sysmon's 20 µs loses this
// goroutine's P, which then resumes on another thread after a wake-up.
func osYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
