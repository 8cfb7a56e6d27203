package sched

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// schedIdle is Linux's SCHED_IDLE policy.
const schedIdle = 5

// IdleSysmon gives the Go runtime's system monitor thread (sysmon) of this
// process the SCHED_IDLE policy and returns its thread id. It samples the
// process's threads until it has seen the same one sleeping in sysmon's
// sleep `need` (3) times, for at most about 30 s or until ctx ends: sysmon
// sleeps so only while some goroutine runs, so a process that is idle
// throughout is not changed. Safe for concurrent use; a second call finds
// the same thread and sets the same policy.
//
// Why: while any goroutine runs, sysmon wakes every 20 µs to 10 ms, and the
// kernel runs a woken thread at once, preempting whatever runs on its CPU.
// With a rank spinning on every core, each such preemption cost the rank
// 10–40 µs (docs/performance.md, "The tail of a small allreduce"). A thread
// of the idle policy never preempts one of the normal policy: it runs on an
// idle CPU, or in the small share the kernel leaves it (weight 3 against
// 1024), so its work (taking a P back from a goroutine blocked in a system
// call, preempting a goroutine that has run for 10 ms) is late by at most
// a few scheduler ticks while every CPU is busy.
//
// How the thread is known: the runtime's usleep is a raw nanosleep with a
// null second argument, and sysmon is the one runtime thread that sleeps in
// it (the others park on futexes). A thread counts only when
// /proc/self/task/T/syscall shows that call with a program counter inside
// the text of this Go module, so that no thread of a host program (Python's
// or C's, which sleep through the C library) is ever touched.
func IdleSysmon(ctx context.Context) (int, error) {
	lo, hi, err := ownText()
	if err != nil {
		return 0, err
	}
	seen := map[int]int{}
	every := 100 * time.Microsecond // found within a millisecond when busy
	for try := 0; try < 700; try++ {
		if try == 100 {
			every = 50 * time.Millisecond // then 30 s more, slowly
		}
		if tid := sampleSysmon(seen, lo, hi); tid > 0 {
			var p [1]int32 // struct sched_param: priority 0
			if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(tid), schedIdle, uintptr(unsafe.Pointer(&p[0]))); e != 0 {
				return 0, fmt.Errorf("sched: SCHED_IDLE for thread %d: %w", tid, e)
			}
			return tid, nil
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
	return 0, errors.New("sched: the runtime's monitor thread was not seen sleeping")
}

// need is how many samples must find the same thread in sysmon's sleep.
const need = 3

// sampleSysmon looks at every thread of the process once, counts in seen
// those in sysmon's sleep, and returns the first to reach need (0: none).
func sampleSysmon(seen map[int]int, lo, hi uintptr) int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/syscall")
		if err != nil || !sysmonSleep(string(b), syscall.SYS_NANOSLEEP, lo, hi) {
			continue
		}
		if seen[tid]++; seen[tid] >= need {
			return tid
		}
	}
	return 0
}

// sysmonSleep reports whether line, a /proc/PID/task/TID/syscall line
// ("nr arg1 … arg6 sp pc" while in a system call), shows system call nr
// with a null second argument, called from a program counter in [lo, hi).
func sysmonSleep(line string, nr int, lo, hi uintptr) bool {
	f := strings.Fields(line)
	if len(f) != 9 || f[0] != strconv.Itoa(nr) {
		return false
	}
	arg2, err := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
	if err != nil || arg2 != 0 {
		return false
	}
	pc, err := strconv.ParseUint(strings.TrimPrefix(f[8], "0x"), 16, 64)
	return err == nil && uintptr(pc) >= lo && uintptr(pc) < hi
}

// ownText returns the bounds of the executable mapping that holds this
// package's code: the text of the Go program, or of the shared library
// (libnexar.so) the Go runtime and this package were built into.
func ownText() (lo, hi uintptr, err error) {
	pc := reflect.ValueOf(IdleSysmon).Pointer()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, fmt.Errorf("sched: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if lo, hi, ok := mapsRange(s.Text()); ok && pc >= lo && pc < hi {
			return lo, hi, nil
		}
	}
	return 0, 0, errors.New("sched: this module's text is not in /proc/self/maps")
}

// mapsRange parses the address range of an executable /proc/PID/maps line
// ("lo-hi r-xp …").
func mapsRange(line string) (lo, hi uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 2 || len(f[1]) < 3 || f[1][2] != 'x' {
		return 0, 0, false
	}
	a, b, found := strings.Cut(f[0], "-")
	if !found {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(a, 16, 64)
	h, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || h <= l {
		return 0, 0, false
	}
	return uintptr(l), uintptr(h), true
}

// Policy returns the scheduling policy of thread tid (sched_getscheduler):
// 0 normal, 3 batch, 5 idle. Safe for concurrent use.
func Policy(tid int) (int, error) {
	r, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("sched: policy of thread %d: %w", tid, e)
	}
	return int(r), nil
}
