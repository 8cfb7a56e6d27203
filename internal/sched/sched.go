// Package sched is what the spinning waiters need from the OS scheduler:
// which CPU the calling thread runs on, for waiters that choose between
// spinning and yielding by whether the rank they wait for shares their CPU
// (transport/bulk publishes it, core compares); moving a thread off a CPU
// (MoveOff); and keeping the Go runtime's monitor thread from preempting
// them (IdleSysmon).
package sched

// CPU returns the CPU the calling thread runs on now, or -1 where that
// costs more than a few nanoseconds to learn (no RDPID instruction). The
// thread may move at any time: the answer is a hint. Safe for concurrent
// use.
func CPU() int { return cpu() }

// parseRunnable reads the running count of a /proc/loadavg line
// ("0.50 0.40 0.30 3/512 12345").
func parseRunnable(b []byte) (int, bool) {
	field := 0
	for i := 0; i < len(b); i++ {
		if b[i] == ' ' {
			field++
			continue
		}
		if field != 3 {
			continue
		}
		n, digits := 0, 0
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			n = n*10 + int(b[i]-'0')
			digits++
		}
		if digits == 0 || i == len(b) || b[i] != '/' {
			return 0, false
		}
		return n, true
	}
	return 0, false
}
