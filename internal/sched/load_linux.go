package sched

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Runnable is the number of threads the kernel holds runnable at this
// moment on the whole machine, the caller among them (the fourth field of
// /proc/loadavg, "running/total"); ok is false where it cannot be read.
// A few system calls and no allocation.
func Runnable() (n int, ok bool) {
	fd, err := syscall.Open("/proc/loadavg", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	var b [128]byte
	k, err := syscall.Read(fd, b[:])
	syscall.Close(fd)
	if err != nil || k <= 0 {
		return 0, false
	}
	return parseRunnable(b[:k])
}

// Allowed returns the CPUs this process may run on (sched_getaffinity of
// the calling thread, which Go's threads share unless a caller changed
// one), as a bit set: bit i of word i/64 is CPU i. Nil where it cannot be
// read.
func Allowed() []uint64 {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return nil
	}
	out := make([]uint64, 0, len(set))
	for _, w := range set {
		out = append(out, uint64(w))
	}
	for len(out) > 0 && out[len(out)-1] == 0 {
		out = out[:len(out)-1]
	}
	return out
}
