package bulk

import (
	"strings"
	"testing"
	"time"
)

// TestKernelAlive: a bulk TCP channel tells that the peer's kernel answers
// while no data moves (keepalives), for longer than kernelFresh, and stops
// telling once the peer's sockets are closed, as its kernel does when its
// process dies (PeerAlive's rule for another host).
func TestKernelAlive(t *testing.T) {
	eps := meshWith(t, 2, Options{Mode: ModeTCP}, nil, nil, nil)
	defer eps[0].Close()
	if p := eps[0].Paths()[1]; !strings.HasPrefix(p, "tcp") {
		t.Fatalf("path to rank 1 is %q", p)
	}
	out := eps[0].out[1].Load()
	deadline := time.Now().Add(kernelFresh + 2*time.Second)
	for time.Now().Before(deadline) {
		if !kernelAlive(out) {
			var ages []string
			for _, l := range out.links {
				age, ok := kernelAnswered(l.(connLink).raw)
				ages = append(ages, age.String()+map[bool]string{true: "", false: " (not established)"}[ok])
			}
			t.Fatalf("an idle connection to a live peer does not count: last answers %v ago", ages)
		}
		time.Sleep(200 * time.Millisecond)
	}
	eps[1].Close() // its connections end, as a dead process's do
	deadline = time.Now().Add(5 * time.Second)
	for kernelAlive(out) {
		if time.Now().After(deadline) {
			t.Fatal("a channel whose peer closed its connections still counts as alive")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
