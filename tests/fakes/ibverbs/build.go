// Package ibverbs builds the fake libibverbs (src/fake_ibverbs.c), a
// stand-in for libibverbs.so.1 with a fake RoCE and a fake InfiniBand
// device whose queue pairs talk over Unix sockets, in one process or
// between processes, for tests that load it through NEXAR_IBVERBS or
// hw/rdma.Open. See src/fake_ibverbs.c for what it models and what it does
// not. It needs the libibverbs-dev headers (the fake has the real structure
// layouts). Tests that need the fake fail when it cannot be built: a
// missing fake is a broken test setup, not a reason to skip.
package ibverbs

import (
	"path/filepath"

	"github.com/nexar-go/nexar/tests/fakes/ccbuild"
)

var libs = []string{"-lpthread", "-ldl"}

// Source is the path of fake_ibverbs.c in this checkout.
func Source() (string, error) { return ccbuild.Source("fake_ibverbs.c") }

// Build compiles the fake into dir/libfakeibverbs.so and returns its path.
func Build(dir string) (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libfakeibverbs.so")
	return out, ccbuild.Shared(src, out, libs...)
}

// Cached returns the fake compiled once for every test binary of this
// source (ccbuild.Cached).
func Cached() (string, error) {
	src, err := Source()
	if err != nil {
		return "", err
	}
	return ccbuild.Cached(src, "libfakeibverbs", libs...)
}
