package sched

import (
	"runtime"
	"syscall"
	"unsafe"
)

// cpuMask is a sched_setaffinity mask for up to 1024 CPUs.
type cpuMask [16]uint64

// MoveOff moves the calling thread off CPU cpu onto another CPU its
// affinity mask allows, and then restores the mask unchanged: the kernel
// migrates a running thread at once when its mask excludes its CPU, and
// leaves it where it is when the mask is widened again. It reports whether
// the thread moved; false where the mask allows no other CPU (the user's
// own binding is never widened) or a call failed. The goroutine is locked
// to its thread meanwhile, so that the restore reaches the thread that was
// narrowed. Safe for concurrent use; each call acts on its own thread.
//
// Why: two ranks that poll for each other and that the scheduler put on
// one CPU hand it back and forth at every message while another CPU may
// idle; the load balancer leaves such "cache-hot" threads alone for
// milliseconds (docs/performance.md, "Two ranks on one CPU").
func MoveOff(cpu int) bool {
	if cpu < 0 || cpu >= len(cpuMask{})*64 {
		return false
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var orig cpuMask
	// Raw calls: neither blocks, and a P handed off mid-call would move
	// this goroutine to another thread (see transport/bulk's raw calls).
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(orig), uintptr(unsafe.Pointer(&orig))); e != 0 {
		return false
	}
	narrow := orig
	narrow[cpu/64] &^= 1 << (cpu % 64)
	if narrow == (cpuMask{}) {
		return false
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(narrow), uintptr(unsafe.Pointer(&narrow))); e != 0 {
		return false
	}
	syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(orig), uintptr(unsafe.Pointer(&orig)))
	return true
}
