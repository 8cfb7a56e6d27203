// Package sched is what the spinning waiters need from the OS scheduler:
// which CPU the calling thread runs on, for waiters that choose between
// spinning and yielding by whether the rank they wait for shares their CPU
// (transport/bulk publishes it, core compares); the CPUs this process may
// run on (Allowed: transport/bulk counts the ranks that share them); moving
// a thread off a CPU (MoveOff); and keeping the Go runtime's monitor thread
// from preempting them (IdleSysmon).
package sched

// CPU returns the CPU the calling thread runs on now, or -1 where that
// costs more than a few nanoseconds to learn (no RDPID instruction). The
// thread may move at any time: the answer is a hint. Safe for concurrent
// use.
func CPU() int { return cpu() }
