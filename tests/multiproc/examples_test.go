package multiproc

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestRPCExample builds examples/go/rpc and runs it as 3 ranks: rank 0
// gets every rank's answer and the error of a bad request.
func TestRPCExample(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	bin := filepath.Join(t.TempDir(), "rpc")
	if out, err := exec.Command(gobin, "build", "-o", bin, "github.com/nexar-go/nexar/examples/go/rpc").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, errOut, code := launch(t, 2*time.Minute, "-n", "3", "--", bin)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"[0] rank 0: 2 squared is 4", "[0] rank 1: 3 squared is 9", "[0] rank 2: 4 squared is 16",
		"[0] a bad request fails at the caller: ", "want an 8-byte int64, got 1 bytes"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
