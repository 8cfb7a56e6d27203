package sched

import (
	"runtime"
	"syscall"
	"testing"
	"unsafe"
)

func affinity(t *testing.T) cpuMask {
	t.Helper()
	var m cpuMask
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m))); e != 0 {
		t.Fatal(e)
	}
	return m
}

func setAffinity(t *testing.T, m cpuMask) {
	t.Helper()
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m))); e != 0 {
		t.Fatal(e)
	}
}

// TestMoveOff: the thread leaves the CPU it names and keeps its affinity
// mask; with one CPU allowed it stays and says so.
func TestMoveOff(t *testing.T) {
	runtime.LockOSThread() // the thread the masks below belong to
	defer runtime.UnlockOSThread()
	orig := affinity(t)
	defer setAffinity(t, orig)
	cpu := CPU()
	if cpu < 0 {
		t.Skip("this processor cannot tell the current CPU cheaply (no RDPID)")
	}
	allowed := 0
	for _, w := range orig {
		for ; w != 0; w &= w - 1 {
			allowed++
		}
	}
	if allowed >= 2 {
		if !MoveOff(cpu) {
			t.Fatalf("MoveOff(%d) = false with %d CPUs allowed", cpu, allowed)
		}
		if now := CPU(); now == cpu {
			t.Fatalf("still on CPU %d after MoveOff", cpu)
		}
		if got := affinity(t); got != orig {
			t.Fatalf("affinity changed: %x, was %x", got, orig)
		}
	}
	// Bound to the one CPU it runs on: nowhere to go.
	var one cpuMask
	cpu = CPU()
	one[cpu/64] = 1 << (cpu % 64)
	setAffinity(t, one)
	if MoveOff(cpu) {
		t.Fatal("MoveOff moved a thread bound to one CPU")
	}
	if got := affinity(t); got != one {
		t.Fatalf("affinity changed: %x, was %x", got, one)
	}
	if MoveOff(-1) || MoveOff(1<<20) {
		t.Fatal("MoveOff accepted a CPU out of range")
	}
}
