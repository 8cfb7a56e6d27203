// Package hip builds the fake HIP runtime (src/fake_hip.c), a second GPU
// runtime beside the fake CUDA one, whose device memory the host cannot
// touch, with the adapter that hands it to libnexar
// (nexar_fake_hip_adapter fills a nexar_device_adapter_t). Tests load it
// with hw/cuda.LoadAdapter or link it (tests/c/test_adapter.c).
package hip

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	"github.com/nexar-go/nexar/tests/fakes/ccbuild"
)

// Fill is the name of the fake's adapter function.
const Fill = "nexar_fake_hip_adapter"

// Cached returns the fake compiled once for every test binary of this
// source and of the header it includes (ccbuild.Cached hashes the source
// only: the header's hash goes in as a flag).
func Cached() (string, error) {
	src, err := ccbuild.Source("fake_hip.c")
	if err != nil {
		return "", err
	}
	hdr, err := os.ReadFile(filepath.Join(filepath.Dir(src), "../../../../include/nexar.h"))
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(hdr)
	return ccbuild.Cached(src, "libfakehip", "-lpthread", "-DNEXAR_H_SHA="+hex.EncodeToString(h[:8]))
}
