package core

import "syscall"

// osYield gives the CPU to another runnable thread of the system, if any
// (sched_yield). Waiters call it between polls when this host runs more
// ranks than it has cores: the peer they wait for may need this core.
//
// Syscall, not RawSyscall: a yield that keeps this thread off its CPU past
// sysmon's 20 µs then hands this goroutine's P to another thread, which a
// rank of this process (a goroutine waiting for a P, not for a CPU) needs
// to run at all.
func osYield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
