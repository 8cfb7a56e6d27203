// Package cudart builds the fake CUDA runtime (src/fake_cudart.c), a stand-in
// for libcudart.so whose device memory the host cannot touch, for tests
// that load it through NEXAR_CUDART or hw/cuda.Open. See src/fake_cudart.c for
// what it models and what it does not.
package cudart

import (
	"path/filepath"

	"github.com/nexar-go/nexar/tests/fakes/ccbuild"
)

// Source is the path of fake_cudart.c in this checkout.
func Source() (string, error) { return ccbuild.Source("fake_cudart.c") }

// Build compiles the fake into dir/libfakecudart.so with $CC (default cc)
// and returns its path. Tests that need the fake fail when this fails: a
// missing fake is a broken test setup, not a reason to skip.
func Build(dir string) (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libfakecudart.so")
	return out, ccbuild.Shared(src, out, "-lpthread")
}

// Cached returns the fake compiled once for every test binary of this
// source (ccbuild.Cached): a library a process loaded is never rewritten.
func Cached() (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	return ccbuild.Cached(src, "libfakecudart", "-lpthread")
}
