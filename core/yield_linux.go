package core

import "syscall"

// osYield gives the CPU to another runnable thread of the system, if any
// (sched_yield). Waiters call it between polls when this host runs more
// ranks than it has cores: the peer they wait for may need this core.
func osYield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
