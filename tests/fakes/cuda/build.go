// Package cuda builds the fake CUDA driver (src/fake_cuda.c), a stand-in
// for libcuda.so.1 whose cuPointerGetAttribute classifies the fake CUDA
// runtime's device memory (tests/fakes/cudart) and its own page-locked and
// managed memory, and loads it for tests. See src/fake_cuda.c for what it
// models and what it does not.
package cuda

import "github.com/nexar-go/nexar/tests/fakes/ccbuild"

// Soname is the name the fake is built with: the process finds it as the
// CUDA driver once loaded, whatever its file is called.
const Soname = "libcuda.so.1"

// Cached returns the fake compiled once for every test binary of this
// source (ccbuild.Cached). Tests that need it fail when this fails.
func Cached() (string, error) {
	src, err := ccbuild.Source("fake_cuda.c")
	if err != nil {
		return "", err
	}
	return ccbuild.Cached(src, "libfakecuda", "-lpthread", "-Wl,-soname,"+Soname)
}
