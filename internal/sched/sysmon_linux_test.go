package sched

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// policies returns the scheduling policy of every thread of the process.
func policies(t *testing.T) map[int]int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := Policy(id); err == nil { // else the thread has exited
			out[id] = p
		}
	}
	return out
}

// TestIdleSysmon: the thread found is in the runtime's sleep, called from
// this binary's text, and has the idle policy afterwards; no other thread
// of the process had its policy changed.
func TestIdleSysmon(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	go func() { // keeps a P busy, so that sysmon polls rather than sleeps deeply
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	before := policies(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tid, err := IdleSysmon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi, err := ownText()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for range 200 { // sysmon, woken, may be between sleeps at any one look
		b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/syscall")
		if err != nil {
			t.Fatal(err)
		}
		if sysmonSleep(string(b), syscall.SYS_NANOSLEEP, lo, hi) {
			found = true
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !found {
		t.Fatalf("thread %d was never seen in the runtime's sleep", tid)
	}
	after := policies(t)
	if after[tid] != schedIdle {
		t.Errorf("thread %d (sysmon): policy %d, want %d", tid, after[tid], schedIdle)
	}
	for id, p := range before {
		if q, ok := after[id]; ok && id != tid && q != p {
			t.Errorf("thread %d: policy %d, was %d (sysmon is %d)", id, q, p, tid)
		}
	}
}

// TestSysmonSleep: only a nanosleep with a null second argument from the
// given text counts.
func TestSysmonSleep(t *testing.T) {
	const lo, hi = 0x400000, 0x800000
	for _, c := range []struct {
		line string
		want bool
	}{
		{"35 0xc000123f00 0x0 0x0 0x0 0x0 0x0 0xc000123ee8 0x47a1c3\n", true},
		{"35 0xc000123f00 0x0 0x0 0x0 0x0 0x0 0xc000123ee8 0x7f00001000\n", false}, // the C library's
		{"35 0xc000123f00 0xc000123f10 0x0 0x0 0x0 0x0 0xc000123ee8 0x47a1c3\n", false},
		{"202 0xc000123f00 0x80 0x0 0x0 0x0 0x0 0xc000123ee8 0x47a1c3\n", false}, // a futex wait
		{"running\n", false},
		{"-1 0x7ffd0000 0x47a1c3\n", false},
		{"35 0xzz 0x0 0x0 0x0 0x0 0x0 0x1 0x47a1c3\n", true}, // only arg2 and pc are read
		{"35 0x1 0x0 0x0 0x0 0x0 0x0 0x1 0x800000\n", false}, // hi is outside
	} {
		if got := sysmonSleep(c.line, 35, lo, hi); got != c.want {
			t.Errorf("%q: %v, want %v", c.line, got, c.want)
		}
	}
	for _, c := range []struct {
		line   string
		lo, hi uintptr
		ok     bool
	}{
		{"00400000-00800000 r-xp 00000000 08:01 123 /bin/x", 0x400000, 0x800000, true},
		{"00800000-00900000 r--p 00400000 08:01 123 /bin/x", 0, 0, false},
		{"7f0000-7e0000 r-xp 0 0:0 0", 0, 0, false},
		{"garbage", 0, 0, false},
	} {
		lo, hi, ok := mapsRange(c.line)
		if ok != c.ok || lo != c.lo || hi != c.hi {
			t.Errorf("%q: %x-%x %v, want %x-%x %v", c.line, lo, hi, ok, c.lo, c.hi, c.ok)
		}
	}
}
