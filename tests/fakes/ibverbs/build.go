// Package ibverbs builds the fake libibverbs (src/fake_ibverbs.c), a
// stand-in for libibverbs.so.1 with a fake RoCE and a fake InfiniBand
// device whose queue pairs talk over Unix sockets, in one process or
// between processes, for tests that load it through NEXAR_IBVERBS or
// hw/rdma.Open. See src/fake_ibverbs.c for what it models and what it does
// not.
package ibverbs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Source is the path of fake_ibverbs.c in this checkout.
func Source() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("fakes/ibverbs: cannot locate the source directory")
	}
	return filepath.Join(filepath.Dir(file), "src", "fake_ibverbs.c"), nil
}

// Build compiles the fake into dir/libfakeibverbs.so with $CC (default cc)
// and returns its path. It needs the libibverbs-dev headers (the fake has
// the real structure layouts). Tests that need the fake fail when this
// fails: a missing fake is a broken test setup, not a reason to skip.
func Build(dir string) (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out := filepath.Join(dir, "libfakeibverbs.so")
	cmd := exec.Command(cc, "-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
		"-o", out, src, "-lpthread", "-ldl")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fakes/ibverbs: %s: %v\n%s", cmd, err, b)
	}
	return out, nil
}
