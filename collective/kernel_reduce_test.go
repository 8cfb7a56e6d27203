package collective

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// kernelPaths lists the implementations to check: the portable Go code
// always, and the assembly when this build and CPU have it.
func kernelPaths(t testing.TB) []string {
	if asmAvailable {
		return []string{"portable", "asm"}
	}
	return []string{"portable"}
}

// withPath runs f with the kernels forced to one path.
func withPath(t testing.TB, path string, f func()) {
	old := useAsm
	useAsm = path == "asm"
	defer func() { useAsm = old }()
	f()
}

var allDTypes = []DType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, BFloat16, Float32, Float64}
var allOps = []Op{Sum, Prod, Min, Max, Avg, Band, Bor, Bxor}

// load and store read elements with encoding/binary so the reference does
// not share the kernels' unsafe reinterpretation.
func load(b []byte, dt DType, i int) uint64 {
	switch dt.Size() {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return binary.LittleEndian.Uint64(b[8*i:])
}

func store(b []byte, dt DType, i int, v uint64) {
	switch dt.Size() {
	case 1:
		b[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
}

// refFloat is the scalar float64 rule; narrower types convert their
// result after, which is exact for min/max and rounds sum/prod once
// (float32 arithmetic on float32 inputs done in float64 and rounded to
// float32 is correctly rounded, since 53 >= 2*24+2).
func refFloat(a, b float64, op Op) float64 {
	switch op {
	case Sum, Avg:
		return a + b
	case Prod:
		return a * b
	case Min, Max:
		switch {
		case math.IsNaN(a):
			return a
		case math.IsNaN(b):
			return b
		case a == b && op == Min:
			if math.Signbit(b) {
				return b
			}
			return a
		case a == b:
			if math.Signbit(a) {
				return b
			}
			return a
		case (a < b) == (op == Min):
			return a
		}
		return b
	}
	panic("bad op")
}

func refInt[T int8 | uint8 | int32 | uint32 | int64 | uint64](a, b T, op Op) T {
	switch op {
	case Sum:
		return a + b
	case Prod:
		return a * b
	case Min:
		if b < a {
			return b
		}
		return a
	case Max:
		if b > a {
			return b
		}
		return a
	case Band:
		return a & b
	case Bor:
		return a | b
	case Bxor:
		return a ^ b
	}
	panic("bad op")
}

// refElem is the per-element reference for dst op src on raw bits.
func refElem(dt DType, op Op, a, b uint64) uint64 {
	switch dt {
	case Int8:
		return uint64(uint8(refInt(int8(a), int8(b), op)))
	case Uint8:
		return uint64(refInt(uint8(a), uint8(b), op))
	case Int32:
		return uint64(uint32(refInt(int32(a), int32(b), op)))
	case Uint32:
		return uint64(refInt(uint32(a), uint32(b), op))
	case Int64:
		return uint64(refInt(int64(a), int64(b), op))
	case Uint64:
		return refInt(a, b, op)
	case Float64:
		return math.Float64bits(refFloat(math.Float64frombits(a), math.Float64frombits(b), op))
	case Float32:
		r := refFloat(float64(math.Float32frombits(uint32(a))), float64(math.Float32frombits(uint32(b))), op)
		return uint64(math.Float32bits(float32(r)))
	case Float16:
		r := float32(refFloat(float64(F16ToF32(uint16(a))), float64(F16ToF32(uint16(b))), op))
		return uint64(F32ToF16(r))
	case BFloat16:
		r := float32(refFloat(float64(BF16ToF32(uint16(a))), float64(BF16ToF32(uint16(b))), op))
		return uint64(F32ToBF16(r))
	}
	panic("bad dtype")
}

func isNaNBits(dt DType, v uint64) bool {
	switch dt {
	case Float16:
		return v&0x7fff > 0x7c00
	case BFloat16:
		return v&0x7fff > 0x7f80
	case Float32:
		return v&0x7fffffff > 0x7f800000
	case Float64:
		return v&(1<<63-1) > 0x7ff0000000000000
	}
	return false
}

// sameBits compares results bit for bit, except that any NaN equals any
// NaN: which NaN payload an IEEE operation returns is not specified.
func sameBits(dt DType, a, b uint64) bool {
	return a == b || isNaNBits(dt, a) && isNaNBits(dt, b)
}

// edgeValues are bit patterns every dtype is tried with.
func edgeValues(dt DType) []uint64 {
	switch dt {
	case Int8, Uint8:
		return []uint64{0, 1, 0x7f, 0x80, 0xff, 0xfe, 2}
	case Int32, Uint32:
		return []uint64{0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 0xfffffffe, 2}
	case Int64, Uint64:
		return []uint64{0, 1, 1<<63 - 1, 1 << 63, 1<<64 - 1, 1<<64 - 2, 2}
	case Float16:
		// 0, -0, 1, -1, max, min normal, min subnormal, max subnormal, inf, -inf, qNaN, sNaN, -NaN, 65504-ish halves
		return []uint64{0, 0x8000, 0x3c00, 0xbc00, 0x7bff, 0x0400, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00, 0x3c01, 0x1400}
	case BFloat16:
		return []uint64{0, 0x8000, 0x3f80, 0xbf80, 0x7f7f, 0x0080, 0x0001, 0x007f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc0, 0x3f81}
	case Float32:
		return []uint64{0, 0x80000000, 0x3f800000, 0xbf800000, 0x7f7fffff, 0x00800000, 0x00000001, 0x007fffff,
			0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc00000, 0x3f800001, 0x33800000}
	case Float64:
		return []uint64{0, 1 << 63, 0x3ff0000000000000, 0xbff0000000000000, 0x7fefffffffffffff, 0x0010000000000000, 1,
			0x000fffffffffffff, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000, 0x7ff0000000000001,
			0xfff8000000000000, 0x3ff0000000000001, 0x3ca0000000000000}
	}
	return nil
}

// randElem mixes edge values, small "ordinary" numbers (so sums round in
// interesting ways) and raw random bits.
func randElem(r *rand.Rand, dt DType) uint64 {
	switch r.IntN(4) {
	case 0:
		e := edgeValues(dt)
		return e[r.IntN(len(e))]
	case 1:
		if dt.IsFloat() {
			f := (r.Float64() - 0.5) * 1000
			switch dt {
			case Float16:
				return uint64(F32ToF16(float32(f)))
			case BFloat16:
				return uint64(F32ToBF16(float32(f)))
			case Float32:
				return uint64(math.Float32bits(float32(f)))
			}
			return math.Float64bits(f)
		}
		return uint64(r.IntN(200) - 100)
	}
	return r.Uint64()
}

func fill(r *rand.Rand, b []byte, dt DType) {
	for i := 0; i < len(b)/dt.Size(); i++ {
		store(b, dt, i, randElem(r, dt))
	}
}

func testLengths() []int {
	var n []int
	for i := 0; i <= 67; i++ {
		n = append(n, i)
	}
	return append(n, 255, 4099)
}

func TestReduceIntoMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, path := range kernelPaths(t) {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				if Check(dt, op) != nil {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", path, dt, op), func(t *testing.T) {
					withPath(t, path, func() { checkReduce(t, r, dt, op) })
				})
			}
		}
	}
}

func checkReduce(t *testing.T, r *rand.Rand, dt DType, op Op) {
	size := dt.Size()
	for _, n := range testLengths() {
		// off 0: aligned; off 1: misaligned dst and src (bounce path).
		for _, off := range []int{0, 1} {
			if off == 1 && n > 67 {
				continue
			}
			db := make([]byte, n*size+off)[off:]
			sb := make([]byte, n*size+off)[off:]
			fill(r, db, dt)
			fill(r, sb, dt)
			want := make([]uint64, n)
			for i := range want {
				want[i] = refElem(dt, op, load(db, dt, i), load(sb, dt, i))
			}
			srcCopy := append([]byte(nil), sb...)
			ReduceInto(db, sb, dt, op)
			for i := range want {
				if got := load(db, dt, i); !sameBits(dt, got, want[i]) {
					t.Fatalf("n=%d off=%d elem %d: %#x %s %#x = %#x, want %#x", n, off, i,
						load(srcCopy, dt, i), op, load(sb, dt, i), got, want[i])
				}
			}
			if string(srcCopy) != string(sb) {
				t.Fatalf("n=%d: src modified", n)
			}
		}
	}
}

// TestReduceIntoEdgePairs tries every pair of edge values in every lane.
func TestReduceIntoEdgePairs(t *testing.T) {
	for _, path := range kernelPaths(t) {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				if Check(dt, op) != nil {
					continue
				}
				e := edgeValues(dt)
				n := len(e) * len(e)
				n += 128 - n%128 // whole asm blocks plus a tail
				db, sb := make([]byte, n*dt.Size()), make([]byte, n*dt.Size())
				for i := 0; i < n; i++ {
					store(db, dt, i, e[(i/len(e))%len(e)])
					store(sb, dt, i, e[i%len(e)])
				}
				want := make([]uint64, n)
				for i := range want {
					want[i] = refElem(dt, op, load(db, dt, i), load(sb, dt, i))
				}
				withPath(t, path, func() { ReduceInto(db, sb, dt, op) })
				for i := range want {
					if got := load(db, dt, i); !sameBits(dt, got, want[i]) {
						t.Errorf("%s %s %s: %#x op %#x = %#x, want %#x", path, dt, op,
							e[(i/len(e))%len(e)], e[i%len(e)], got, want[i])
					}
				}
			}
		}
	}
}

func TestFinishAvg(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, path := range kernelPaths(t) {
		for _, dt := range allDTypes {
			for _, n := range []int{1, 2, 3, 7, 300} {
				for _, cnt := range []int{0, 1, 5, 67, 1001} {
					for _, off := range []int{0, 1} {
						b := make([]byte, cnt*dt.Size()+off)[off:]
						fill(r, b, dt)
						want := make([]uint64, cnt)
						for i := range want {
							want[i] = refDiv(dt, load(b, dt, i), n)
						}
						withPath(t, path, func() { FinishAvg(b, dt, n) })
						for i := range want {
							if got := load(b, dt, i); !sameBits(dt, got, want[i]) {
								t.Fatalf("%s %s /%d: elem %d = %#x, want %#x", path, dt, n, i, got, want[i])
							}
						}
					}
				}
			}
		}
	}
}

func refDiv(dt DType, v uint64, n int) uint64 {
	switch dt {
	case Int8:
		return uint64(uint8(int64(int8(v)) / int64(n)))
	case Uint8:
		return uint64(uint8(v)) / uint64(n)
	case Int32:
		return uint64(uint32(int64(int32(v)) / int64(n)))
	case Uint32:
		return uint64(uint32(v)) / uint64(n)
	case Int64:
		return uint64(int64(v) / int64(n))
	case Uint64:
		return v / uint64(n)
	case Float16:
		return uint64(F32ToF16(F16ToF32(uint16(v)) / float32(n)))
	case BFloat16:
		return uint64(F32ToBF16(BF16ToF32(uint16(v)) / float32(n)))
	case Float32:
		return uint64(math.Float32bits(math.Float32frombits(uint32(v)) / float32(n)))
	}
	return math.Float64bits(math.Float64frombits(v) / float64(n))
}

func TestReduceIntoPanics(t *testing.T) {
	cases := []struct {
		name     string
		dst, src []byte
		dt       DType
		op       Op
	}{
		{"length mismatch", make([]byte, 8), make([]byte, 4), Float32, Sum},
		{"partial element", make([]byte, 6), make([]byte, 6), Float32, Sum},
		{"bitwise on float", make([]byte, 8), make([]byte, 8), Float32, Bxor},
		{"invalid dtype", make([]byte, 8), make([]byte, 8), numDTypes, Sum},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			ReduceInto(c.dst, c.src, c.dt, c.op)
		})
	}
}
