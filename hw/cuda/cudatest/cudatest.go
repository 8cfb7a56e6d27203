// Package cudatest holds helpers for tests of device memory over a CUDA
// runtime (the fake one of tests/fakes/cudart, or a real one): buffers
// copied in and out of device memory, and test values encoded as nexar
// element types. Only tests import it. Its functions are safe for
// concurrent use.
package cudatest

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/internal/dtype"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
)

// Upload allocates device memory holding b (at least one byte).
func Upload(t testing.TB, rt *cuda.Runtime, b []byte) cuda.DevicePtr {
	t.Helper()
	p, err := rt.Malloc(max(len(b), 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.CopyToDevice(p, b); err != nil {
		t.Fatal(err)
	}
	return p
}

// Download copies n bytes at p to the host once the work enqueued on
// stream so far has completed.
func Download(t testing.TB, rt *cuda.Runtime, stream cuda.Stream, p cuda.DevicePtr, n int) []byte {
	t.Helper()
	if err := rt.StreamSynchronize(stream); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	if err := rt.CopyFromDevice(b, p); err != nil {
		t.Fatal(err)
	}
	return b
}

// Encode writes v as elements of dt: Float32, Int64 or BFloat16 (the
// latter truncated, exact for the small integers tests use).
func Encode(dt dtype.DType, v []float64) []byte {
	es := dt.Size()
	b := make([]byte, len(v)*es)
	for i, x := range v {
		switch dt {
		case dtype.Float32:
			binary.LittleEndian.PutUint32(b[i*es:], math.Float32bits(float32(x)))
		case dtype.Int64:
			binary.LittleEndian.PutUint64(b[i*es:], uint64(int64(x)))
		case dtype.BFloat16:
			binary.LittleEndian.PutUint16(b[i*es:], uint16(math.Float32bits(float32(x))>>16))
		default:
			panic("cudatest: Encode: unsupported type " + dt.String())
		}
	}
	return b
}

// Fake loads the fake CUDA runtime of tests/fakes/cudart (device memory
// that faults on any host access), with no delay on its copies, and names
// it in NEXAR_CUDART for the test, where the fake libibverbs finds its
// dma-buf and peer-memory hooks. A fake that cannot be built fails the test.
func Fake(t *testing.T) *cuda.Runtime {
	t.Helper()
	path, err := cudart.Cached()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_CUDART", path)
	t.Setenv("NEXAR_FAKE_CUDA_DELAY_US", "0")
	rt, err := cuda.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// Bytes is a []byte over n bytes of device memory at p, for code that
// takes device buffers as slices; host code must never touch it.
func Bytes(p cuda.DevicePtr, n int) []byte {
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), n)
}
