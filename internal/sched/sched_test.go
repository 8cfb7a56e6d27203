package sched

import (
	"math/bits"
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestCPU: the answer is a CPU of this machine, or -1 where the processor
// cannot tell cheaply; on a Linux amd64 host whose /proc/cpuinfo lists
// rdpid it must tell.
func TestCPU(t *testing.T) {
	c := CPU()
	if c < -1 || c >= 4096 {
		t.Fatalf("CPU() = %d", c)
	}
	if runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
		info, err := os.ReadFile("/proc/cpuinfo")
		if err == nil && strings.Contains(string(info), " rdpid") && c < 0 {
			t.Fatal("CPU() = -1 on a processor with RDPID")
		}
	}
	if c >= runtime.NumCPU()*64 {
		t.Fatalf("CPU() = %d with %d CPUs", c, runtime.NumCPU())
	}
}

func BenchmarkCPU(b *testing.B) {
	for range b.N {
		CPU()
	}
}

func TestAllowed(t *testing.T) {
	set := Allowed()
	if runtime.GOOS != "linux" {
		if set != nil {
			t.Errorf("Allowed() = %v off Linux", set)
		}
		return
	}
	n := 0
	for _, w := range set {
		n += bits.OnesCount64(w)
	}
	// runtime.NumCPU is the same affinity count, read at start-up.
	if n != runtime.NumCPU() {
		t.Errorf("Allowed() has %d CPUs, runtime.NumCPU() = %d", n, runtime.NumCPU())
	}
	if len(set) > 0 && set[len(set)-1] == 0 {
		t.Errorf("Allowed() = %v: trailing zero words", set)
	}
}
