package collective

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// benchFill writes ordinary values (normal floats in [-scale, scale], small
// integers), like real gradients, so the benchmark runs the common path.
func benchFill(b []byte, dt DType, scale float64) {
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < len(b)/dt.Size(); i++ {
		f := (r.Float64()*2 - 1) * scale
		var v uint64
		switch dt {
		case Float16:
			v = uint64(F32ToF16(float32(f)))
		case BFloat16:
			v = uint64(F32ToBF16(float32(f)))
		case Float32:
			v = uint64(math.Float32bits(float32(f)))
		case Float64:
			v = math.Float64bits(f)
		default:
			v = uint64(r.IntN(100))
		}
		store(b, dt, i, v)
	}
}

var benchSizes = []int{64 << 10, 8 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchmarkReduceInto reports len(dst) bytes per op, the same unit as
// BenchmarkMemcpy, so the two ratios compare directly. Sum at every size;
// the other arithmetic ops at the in-cache size.
func BenchmarkReduceInto(b *testing.B) {
	for _, path := range kernelPaths(b) {
		for _, dt := range allDTypes {
			for _, op := range []Op{Sum, Prod, Min, Max} {
				for _, n := range benchSizes {
					if op != Sum && n != benchSizes[0] {
						continue
					}
					b.Run(fmt.Sprintf("%s/%s/%s/%s", path, dt, op, sizeName(n)), func(b *testing.B) {
						dst, src := make([]byte, n), make([]byte, n)
						benchFill(dst, dt, 1)
						benchFill(src, dt, 0.01) // small, so b.N sums stay finite
						b.SetBytes(int64(n))
						withPath(b, path, func() {
							for b.Loop() {
								ReduceInto(dst, src, dt, op)
							}
						})
					})
				}
			}
		}
	}
}

func BenchmarkMemcpy(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			dst, src := make([]byte, n), make([]byte, n)
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
