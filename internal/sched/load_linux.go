package sched

import "syscall"

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
