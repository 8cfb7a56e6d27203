// Package nccl builds the fake NCCL (src/fake_nccl.c), a stand-in for
// libnccl.so.2 that works with the fake CUDA runtime (tests/fakes/cudart):
// communicators across processes through shared memory, collectives run on
// the fake's streams, hangs where NCCL hangs, ncclCommAbort. Tests load it
// through NEXAR_NCCL or hw/nccl.Open; see src/fake_nccl.c for what it
// models and what not.
package nccl

import (
	"path/filepath"

	"github.com/nexar-go/nexar/tests/fakes/ccbuild"
)

// Source is the path of fake_nccl.c in this checkout.
func Source() (string, error) { return ccbuild.Source("fake_nccl.c") }

// Build compiles the fake into dir/libfakenccl.so and returns its path.
// Tests that need it fail when this fails, as for the fake CUDA runtime.
func Build(dir string) (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libfakenccl.so")
	return out, ccbuild.Shared(src, out, "-ldl", "-lrt")
}
