//go:build amd64 && !purego

package collective

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// asmAvailable reports whether the AVX2 kernels can run on this CPU.
var asmAvailable = cpu.X86.HasAVX2

// useAsm selects the AVX2 kernels; tests flip it to cover both paths.
var useAsm = asmAvailable

// asmBlock is the granule of every assembly kernel: four 32-byte vectors.
const asmBlock = 128

// An asmKernel reduces n bytes (n > 0, a multiple of asmBlock) of src into
// dst; the pointers need no alignment.
type asmKernel func(dst, src unsafe.Pointer, n int)

// asmKernels[dt][op] is nil where the portable code is used (int8 and
// int64 products, int64 min/max, half-precision min/max, and float16
// on the rare AVX2 CPU without F16C).
var asmKernels [numDTypes][numOps]asmKernel

func init() {
	bitwise := func(dt DType) {
		asmKernels[dt][Band] = andAVX2
		asmKernels[dt][Bor] = orAVX2
		asmKernels[dt][Bxor] = xorAVX2
	}
	for _, dt := range []DType{Int8, Uint8, Int32, Uint32, Int64, Uint64} {
		bitwise(dt)
	}
	asmKernels[Int8][Sum], asmKernels[Uint8][Sum] = addI8AVX2, addI8AVX2
	asmKernels[Int8][Min], asmKernels[Int8][Max] = minI8AVX2, maxI8AVX2
	asmKernels[Uint8][Min], asmKernels[Uint8][Max] = minU8AVX2, maxU8AVX2
	asmKernels[Int32][Sum], asmKernels[Uint32][Sum] = addI32AVX2, addI32AVX2
	asmKernels[Int32][Prod], asmKernels[Uint32][Prod] = mulI32AVX2, mulI32AVX2
	asmKernels[Int32][Min], asmKernels[Int32][Max] = minI32AVX2, maxI32AVX2
	asmKernels[Uint32][Min], asmKernels[Uint32][Max] = minU32AVX2, maxU32AVX2
	asmKernels[Int64][Sum], asmKernels[Uint64][Sum] = addI64AVX2, addI64AVX2
	asmKernels[Int64][Prod], asmKernels[Uint64][Prod] = mulI64AVX2, mulI64AVX2
	asmKernels[Int64][Min], asmKernels[Int64][Max] = minI64AVX2, maxI64AVX2
	asmKernels[Uint64][Min], asmKernels[Uint64][Max] = minU64AVX2, maxU64AVX2
	asmKernels[Int8][Prod], asmKernels[Uint8][Prod] = mulI8AVX2, mulI8AVX2
	asmKernels[Float32] = [numOps]asmKernel{Sum: addF32AVX2, Avg: addF32AVX2, Prod: mulF32AVX2, Min: minF32AVX2, Max: maxF32AVX2}
	asmKernels[BFloat16] = [numOps]asmKernel{Sum: addBF16AVX2, Avg: addBF16AVX2, Prod: mulBF16AVX2, Min: minBF16AVX2, Max: maxBF16AVX2}
	asmKernels[Float16] = [numOps]asmKernel{Min: minF16AVX2, Max: maxF16AVX2}
	if hasF16C() {
		asmKernels[Float16][Sum], asmKernels[Float16][Avg], asmKernels[Float16][Prod] = addF16F16C, addF16F16C, mulF16F16C
	}
	asmKernels[Float64] = [numOps]asmKernel{Sum: addF64AVX2, Avg: addF64AVX2, Prod: mulF64AVX2, Min: minF64AVX2, Max: maxF64AVX2}
}

// reduceAsm runs the AVX2 kernel for (dt, op) over the largest whole number
// of blocks and returns how many bytes it did; the caller finishes the rest.
func reduceAsm(dst, src []byte, dt DType, op Op) int {
	k := asmKernels[dt][op]
	n := len(dst) &^ (asmBlock - 1)
	if k == nil || n == 0 {
		return 0
	}
	k(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), n)
	return n
}

//go:noescape
func addF32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func mulF32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minF32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxF32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func addF64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func mulF64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minF64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxF64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func addI8AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minI8AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxI8AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minU8AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxU8AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func addI32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func mulI32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minI32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxI32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minU32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxU32AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func addI64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func andAVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func orAVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func xorAVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func addF16F16C(dst, src unsafe.Pointer, n int)

//go:noescape
func mulF16F16C(dst, src unsafe.Pointer, n int)

func hasF16C() bool

//go:noescape
func addBF16AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func mulBF16AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minI64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxI64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minU64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxU64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func mulI64AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func mulI8AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minF16AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxF16AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func minBF16AVX2(dst, src unsafe.Pointer, n int)

//go:noescape
func maxBF16AVX2(dst, src unsafe.Pointer, n int)
