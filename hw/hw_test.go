package hw

import (
	"strings"
	"testing"
)

func TestProbe(t *testing.T) {
	st := Probe(Libraries{})
	want := []string{"rdma", "cuda", "nccl"}
	if len(st) != len(want) {
		t.Fatalf("Probe returned %d statuses, want %d", len(st), len(want))
	}
	for i, s := range st {
		if s.Name != want[i] {
			t.Errorf("status %d is %q, want %q", i, s.Name, want[i])
		}
		if s.Detail == "" {
			t.Errorf("%s: empty detail", s.Name)
		}
		if !s.OK && !strings.Contains(s.Detail, "hw/") {
			t.Errorf("%s: reason %q does not name its package", s.Name, s.Detail)
		}
		t.Log(s)
	}
}
