// Package cudart builds the fake CUDA runtime (src/fake_cudart.c), a stand-in
// for libcudart.so whose device memory the host cannot touch, for tests
// that load it through NEXAR_CUDART or hw/cuda.Open. See src/fake_cudart.c for
// what it models and what it does not.
package cudart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Source is the path of fake_cudart.c in this checkout.
func Source() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("fakes/cudart: cannot locate the source directory")
	}
	return filepath.Join(filepath.Dir(file), "src", "fake_cudart.c"), nil
}

// Build compiles the fake into dir/libfakecudart.so with $CC (default cc)
// and returns its path. Tests that need the fake fail when this fails: a
// missing fake is a broken test setup, not a reason to skip.
func Build(dir string) (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libfakecudart.so")
	return out, CompileShared(src, out)
}

// CompileShared compiles the C file src into the shared library out with
// $CC (default cc), warnings as errors, linked with pthread and libs (the
// fakes of tests/fakes build this way).
func CompileShared(src, out string, libs ...string) error {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	args := append([]string{"-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
		"-o", out, src, "-lpthread"}, libs...)
	cmd := exec.Command(cc, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("fakes: %s: %v\n%s", cmd, err, b)
	}
	return nil
}
