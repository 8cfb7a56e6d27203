//go:build !cgo

package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestInfoWithoutCgo: a build without cgo runs `nexar info`, and names each
// hardware backend unavailable because of the build, not missing hardware
// (make gotest runs this package with CGO_ENABLED=0).
func TestInfoWithoutCgo(t *testing.T) {
	var out bytes.Buffer
	if err := cmdInfo(nil, &out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rdma", "cuda", "nccl"} {
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == name {
				line = l
				break
			}
		}
		if !strings.Contains(line, "unavailable") || !strings.Contains(line, "built without cgo") {
			t.Errorf("%s: %q, want it unavailable, built without cgo; output:\n%s", name, line, out.String())
		}
	}
}
