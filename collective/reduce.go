package collective

import (
	"math"
	"unsafe"
)

// Reduction kernels.
//
// Buffers are raw bytes holding elements in the host's byte order, which is
// assumed to be little-endian (amd64, arm64, riscv64, ...); nexar's wire
// format is little-endian too, so the bytes are reinterpreted in place with
// unsafe.Slice instead of being decoded.
//
// Semantics, identical on every path (portable Go and assembly):
//   - integers wrap on overflow (two's complement);
//   - Avg reduces like Sum, FinishAvg divides once at the end;
//   - Min/Max propagate NaN: if dst is NaN the result is dst, else if src is
//     NaN the result is src; min(-0, +0) = -0 and max(-0, +0) = +0;
//   - Float16/BFloat16 are computed in float32 and rounded to nearest even.
//
// The kernels are pure functions of their arguments and safe to call
// concurrently on disjoint dst buffers.

// ReduceInto sets dst[i] = dst[i] op src[i] for every element. len(dst) must
// equal len(src) and be a multiple of dt.Size(), and (dt, op) must pass
// Check; anything else is a programming error and panics.
func ReduceInto(dst, src []byte, dt DType, op Op) {
	if len(dst) != len(src) {
		panic("collective: ReduceInto: length mismatch")
	}
	if err := Check(dt, op); err != nil {
		panic(err.Error())
	}
	size := dt.Size()
	if len(dst)%size != 0 {
		panic("collective: ReduceInto: length is not a multiple of the element size")
	}
	if len(dst) == 0 {
		return
	}
	if useAsm {
		n := reduceAsm(dst, src, dt, op)
		dst, src = dst[n:], src[n:]
		if len(dst) == 0 {
			return
		}
	}
	if !aligned(dst, size) || !aligned(src, size) {
		reduceUnaligned(dst, src, dt, op)
		return
	}
	reducePortable(dst, src, dt, op)
}

// FinishAvg divides every element of buf by n, rounding like ReduceInto.
// For integer types (which Check rejects for Avg) it truncates toward zero.
// n must be >= 1.
func FinishAvg(buf []byte, dt DType, n int) {
	size := dt.Size()
	if size == 0 || len(buf)%size != 0 || n < 1 {
		panic("collective: FinishAvg: invalid arguments")
	}
	if n == 1 || len(buf) == 0 {
		return
	}
	if !aligned(buf, size) {
		var tmp [bounceBytes / 8]uint64
		t := unsafe.Slice((*byte)(unsafe.Pointer(&tmp)), bounceBytes)
		for len(buf) > 0 {
			c := copy(t, buf)
			finishAvgAligned(t[:c], dt, n)
			copy(buf, t[:c])
			buf = buf[c:]
		}
		return
	}
	finishAvgAligned(buf, dt, n)
}

func finishAvgAligned(buf []byte, dt DType, n int) {
	switch dt {
	case Float32:
		div(as[float32](buf), float32(n))
	case Float64:
		div(as[float64](buf), float64(n))
	case Float16:
		h, f := as[uint16](buf), float32(n)
		for i, x := range h {
			h[i] = F32ToF16(F16ToF32(x) / f)
		}
	case BFloat16:
		h, f := as[uint16](buf), float32(n)
		for i, x := range h {
			h[i] = F32ToBF16(BF16ToF32(x) / f)
		}
	case Int8:
		divInt(as[int8](buf), int64(n))
	case Uint8:
		divInt(as[uint8](buf), int64(n))
	case Int32:
		divInt(as[int32](buf), int64(n))
	case Uint32:
		divInt(as[uint32](buf), int64(n))
	case Int64:
		divInt(as[int64](buf), int64(n))
	case Uint64:
		div(as[uint64](buf), uint64(n))
	}
}

// divInt divides in int64 so a divisor above T's range still truncates
// correctly (to 0).
func divInt[T ~int8 | ~uint8 | ~int32 | ~uint32 | ~int64](b []T, n int64) {
	for i := range b {
		b[i] = T(int64(b[i]) / n)
	}
}

func div[T integer | float](b []T, n T) {
	for i := range b {
		b[i] /= n
	}
}

// bounceBytes is the scratch size used to realign misaligned buffers; a
// multiple of every element size.
const bounceBytes = 2048

// reduceUnaligned copies misaligned buffers through aligned scratch so that
// the unsafe reinterpretation never builds a misaligned *T (which checkptr
// rejects and some architectures fault on).
func reduceUnaligned(dst, src []byte, dt DType, op Op) {
	var a, b [bounceBytes / 8]uint64
	ta := unsafe.Slice((*byte)(unsafe.Pointer(&a)), bounceBytes)
	tb := unsafe.Slice((*byte)(unsafe.Pointer(&b)), bounceBytes)
	for len(dst) > 0 {
		c := copy(ta, dst)
		copy(tb, src[:c])
		reducePortable(ta[:c], tb[:c], dt, op)
		copy(dst, ta[:c])
		dst, src = dst[c:], src[c:]
	}
}

func aligned(b []byte, size int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(size) == 0
}

// as reinterprets b as a slice of T; b must be aligned for T and its length
// a multiple of T's size.
func as[T any](b []byte) []T {
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

type integer interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64
}

type float interface{ ~float32 | ~float64 }

// reducePortable is the pure-Go kernel; buffers must be aligned.
func reducePortable(dst, src []byte, dt DType, op Op) {
	switch dt {
	case Int8:
		reduceInt(as[int8](dst), as[int8](src), op)
	case Uint8:
		reduceInt(as[uint8](dst), as[uint8](src), op)
	case Int32:
		reduceInt(as[int32](dst), as[int32](src), op)
	case Uint32:
		reduceInt(as[uint32](dst), as[uint32](src), op)
	case Int64:
		reduceInt(as[int64](dst), as[int64](src), op)
	case Uint64:
		reduceInt(as[uint64](dst), as[uint64](src), op)
	case Float32:
		reduceFloat(as[float32](dst), as[float32](src), op)
	case Float64:
		reduceFloat(as[float64](dst), as[float64](src), op)
	case Float16:
		reduceF16(as[uint16](dst), as[uint16](src), op)
	case BFloat16:
		reduceBF16(as[uint16](dst), as[uint16](src), op)
	}
}

func reduceInt[T integer](d, s []T, op Op) {
	switch op {
	case Sum:
		sumN(d, s)
	case Prod:
		prodN(d, s)
	case Min:
		minInt(d, s)
	case Max:
		maxInt(d, s)
	case Band:
		andN(d, s)
	case Bor:
		orN(d, s)
	case Bxor:
		xorN(d, s)
	}
}

func reduceFloat[T float](d, s []T, op Op) {
	switch op {
	case Sum, Avg:
		sumN(d, s)
	case Prod:
		prodN(d, s)
	case Min:
		minFloat(d, s)
	case Max:
		maxFloat(d, s)
	}
}

// The loops below are unrolled 8 ways over full-slice-expression windows so
// the compiler drops the bounds checks inside the block.

func sumN[T integer | float](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] += b[0]
		a[1] += b[1]
		a[2] += b[2]
		a[3] += b[3]
		a[4] += b[4]
		a[5] += b[5]
		a[6] += b[6]
		a[7] += b[7]
	}
	for ; i < len(d); i++ {
		d[i] += s[i]
	}
}

func prodN[T integer | float](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] *= b[0]
		a[1] *= b[1]
		a[2] *= b[2]
		a[3] *= b[3]
		a[4] *= b[4]
		a[5] *= b[5]
		a[6] *= b[6]
		a[7] *= b[7]
	}
	for ; i < len(d); i++ {
		d[i] *= s[i]
	}
}

func andN[T integer](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] &= b[0]
		a[1] &= b[1]
		a[2] &= b[2]
		a[3] &= b[3]
		a[4] &= b[4]
		a[5] &= b[5]
		a[6] &= b[6]
		a[7] &= b[7]
	}
	for ; i < len(d); i++ {
		d[i] &= s[i]
	}
}

func orN[T integer](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] |= b[0]
		a[1] |= b[1]
		a[2] |= b[2]
		a[3] |= b[3]
		a[4] |= b[4]
		a[5] |= b[5]
		a[6] |= b[6]
		a[7] |= b[7]
	}
	for ; i < len(d); i++ {
		d[i] |= s[i]
	}
}

func xorN[T integer](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] ^= b[0]
		a[1] ^= b[1]
		a[2] ^= b[2]
		a[3] ^= b[3]
		a[4] ^= b[4]
		a[5] ^= b[5]
		a[6] ^= b[6]
		a[7] ^= b[7]
	}
	for ; i < len(d); i++ {
		d[i] ^= s[i]
	}
}

func minInt[T integer](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] = min(a[0], b[0])
		a[1] = min(a[1], b[1])
		a[2] = min(a[2], b[2])
		a[3] = min(a[3], b[3])
		a[4] = min(a[4], b[4])
		a[5] = min(a[5], b[5])
		a[6] = min(a[6], b[6])
		a[7] = min(a[7], b[7])
	}
	for ; i < len(d); i++ {
		d[i] = min(d[i], s[i])
	}
}

func maxInt[T integer](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] = max(a[0], b[0])
		a[1] = max(a[1], b[1])
		a[2] = max(a[2], b[2])
		a[3] = max(a[3], b[3])
		a[4] = max(a[4], b[4])
		a[5] = max(a[5], b[5])
		a[6] = max(a[6], b[6])
		a[7] = max(a[7], b[7])
	}
	for ; i < len(d); i++ {
		d[i] = max(d[i], s[i])
	}
}

// fmin and fmax fix the NaN and signed-zero choices that the builtin min
// and max leave open, so that every path returns the same bits.
func fmin[T float](a, b T) T {
	switch {
	case a < b:
		return a
	case b < a:
		return b
	case a != a:
		return a
	case b != b:
		return b
	case math.Signbit(float64(b)):
		return b // a == b; prefer -0
	}
	return a
}

func fmax[T float](a, b T) T {
	switch {
	case a > b:
		return a
	case b > a:
		return b
	case a != a:
		return a
	case b != b:
		return b
	case math.Signbit(float64(a)):
		return b // a == b; prefer +0
	}
	return a
}

func minFloat[T float](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] = fmin(a[0], b[0])
		a[1] = fmin(a[1], b[1])
		a[2] = fmin(a[2], b[2])
		a[3] = fmin(a[3], b[3])
		a[4] = fmin(a[4], b[4])
		a[5] = fmin(a[5], b[5])
		a[6] = fmin(a[6], b[6])
		a[7] = fmin(a[7], b[7])
	}
	for ; i < len(d); i++ {
		d[i] = fmin(d[i], s[i])
	}
}

func maxFloat[T float](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		a, b := d[i:i+8:i+8], s[i:i+8:i+8]
		a[0] = fmax(a[0], b[0])
		a[1] = fmax(a[1], b[1])
		a[2] = fmax(a[2], b[2])
		a[3] = fmax(a[3], b[3])
		a[4] = fmax(a[4], b[4])
		a[5] = fmax(a[5], b[5])
		a[6] = fmax(a[6], b[6])
		a[7] = fmax(a[7], b[7])
	}
	for ; i < len(d); i++ {
		d[i] = fmax(d[i], s[i])
	}
}
