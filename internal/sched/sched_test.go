package sched

import (
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

func TestParseRunnable(t *testing.T) {
	for _, c := range []struct {
		in string
		n  int
		ok bool
	}{
		{"0.50 0.40 0.30 3/512 12345\n", 3, true},
		{"12.00 8.10 4.02 117/2048 99", 117, true},
		{"0.50 0.40 0.30 /512 1", 0, false},
		{"0.50 0.40 0.30 3", 0, false},
		{"", 0, false},
	} {
		if n, ok := parseRunnable([]byte(c.in)); n != c.n || ok != c.ok {
			t.Errorf("parseRunnable(%q) = %d, %v; want %d, %v", c.in, n, ok, c.n, c.ok)
		}
	}
	if n, ok := Runnable(); runtime.GOOS == "linux" && (!ok || n < 1) {
		t.Errorf("Runnable() = %d, %v on Linux; want at least this thread", n, ok)
	}
}
