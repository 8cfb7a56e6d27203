package hugepage

import (
	"runtime"
	"testing"
)

func TestMapIsZeroedWritableAndUnmaps(t *testing.T) {
	const n = 4 << 20
	b := Map(n)
	if b == nil {
		if runtime.GOOS == "linux" {
			t.Fatal("Map returned nil on Linux")
		}
		t.Skip("no huge-page mappings off Linux")
	}
	if len(b) != n {
		t.Fatalf("len %d, want %d", len(b), n)
	}
	for i := 0; i < n; i += 4096 {
		if b[i] != 0 {
			t.Fatalf("byte %d is %d, want 0", i, b[i])
		}
		b[i] = byte(i >> 12 & 0xff)
	}
	if want := byte((n - 4096) >> 12 & 0xff); b[n-4096] != want {
		t.Fatal("write did not stick")
	}
	Unmap(b)
}
