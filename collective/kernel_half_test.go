package collective

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

// f16Value is an independent decoding of a binary16 pattern.
func f16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10&0x1f), float64(h&0x3ff)
	switch e {
	case 0:
		return sign * math.Ldexp(m, -24)
	case 31:
		if m == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1+m/1024, e-15)
}

func TestF16ToF32Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got := F16ToF32(h)
		want := f16Value(h)
		if math.IsNaN(want) {
			b := math.Float32bits(got)
			if !math.IsNaN(float64(got)) || b>>31 != uint32(h>>15) || b>>13&0x3ff != uint32(h&0x3ff) {
				t.Fatalf("F16ToF32(%#04x) = %#08x, want NaN with the same sign and payload", h, b)
			}
		} else if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := F32ToF16(got); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
		if x := float16.Frombits(h).Float32(); !math.IsNaN(float64(x)) && x != got {
			t.Fatalf("F16ToF32(%#04x) = %v, x448/float16 says %v", h, got, x)
		}
	}
}

func TestBF16Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got := BF16ToF32(h)
		if math.Float32bits(got) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(got))
		}
		if back := F32ToBF16(got); back != h {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

// checkRounding tries, for every pair of adjacent finite non-negative
// patterns lo, lo+1 (both signs), the exact midpoint (ties to even) and the
// float32 neighbours on either side of it.
func checkRounding(t *testing.T, name string, toF32 func(uint16) float32, fromF32 func(float32) uint16, maxFinite uint16) {
	for lo := uint16(0); lo <= maxFinite; lo++ {
		a, b := float64(toF32(lo)), float64(toF32(lo+1)) // lo+1 may be +Inf
		var mid float32
		if lo == maxFinite {
			mid = float32(a + (a-float64(toF32(lo-1)))/2)
		} else {
			mid = float32((a + b) / 2)
		}
		even := lo
		if lo&1 == 1 {
			even = lo + 1
		}
		for _, sign := range []uint16{0, 0x8000} {
			m := mid
			if sign != 0 {
				m = -mid
			}
			below := math.Nextafter32(mid, 0)
			above := math.Nextafter32(mid, float32(math.Inf(1)))
			if sign != 0 {
				below, above = -below, -above
			}
			if got := fromF32(m); got != even|sign {
				t.Fatalf("%s(%v) = %#04x, want tie to even %#04x", name, m, got, even|sign)
			}
			if got := fromF32(below); got != lo|sign {
				t.Fatalf("%s(%v) = %#04x, want %#04x", name, below, got, lo|sign)
			}
			if got := fromF32(above); got != (lo+1)|sign {
				t.Fatalf("%s(%v) = %#04x, want %#04x", name, above, got, (lo+1)|sign)
			}
		}
	}
}

func TestF32ToF16Rounding(t *testing.T) {
	checkRounding(t, "F32ToF16", F16ToF32, F32ToF16, 0x7bff)
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0}, {float32(math.Copysign(0, -1)), 0x8000}, {1, 0x3c00}, {65504, 0x7bff}, {65520, 0x7c00},
		{1e10, 0x7c00}, {-1e10, 0xfc00}, {float32(math.Inf(1)), 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{0x1p-24, 0x0001}, {0x1p-25, 0}, {0x1.000002p-25, 0x0001}, {0x1.8p-24, 0x0002}, {0x1p-14, 0x0400},
		{0x1p-149, 0}, {-0x1p-149, 0x8000}, {math.MaxFloat32, 0x7c00},
	}
	for _, c := range cases {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	for _, nan := range []uint32{0x7fc00000, 0x7f800001, 0xffc00000, 0x7f802000} {
		got := F32ToF16(math.Float32frombits(nan))
		if got&0x7fff <= 0x7c00 || got>>15 != uint16(nan>>31) {
			t.Errorf("F32ToF16(NaN %#08x) = %#04x, want a NaN of the same sign", nan, got)
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 200000; i++ {
		f := math.Float32frombits(r.Uint32())
		if math.IsNaN(float64(f)) {
			continue
		}
		if got, want := F32ToF16(f), float16.Fromfloat32(f).Bits(); got != want {
			t.Fatalf("F32ToF16(%v) = %#04x, x448/float16 says %#04x", f, got, want)
		}
	}
}

func TestF32ToBF16Rounding(t *testing.T) {
	checkRounding(t, "F32ToBF16", BF16ToF32, F32ToBF16, 0x7f7f)
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80}, {math.Float32frombits(0x3f808000), 0x3f80}, {math.Float32frombits(0x3f818000), 0x3f82},
		{math.Float32frombits(0x3f808001), 0x3f81}, {math.MaxFloat32, 0x7f80}, {0x1p-149, 0},
		{math.Float32frombits(0x00018000), 0x0002}, {float32(math.Inf(-1)), 0xff80},
	}
	for _, c := range cases {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	for _, nan := range []uint32{0x7fc00000, 0x7f800001, 0xffc00000, 0x7fff0000} {
		got := F32ToBF16(math.Float32frombits(nan))
		if got&0x7fff <= 0x7f80 || got>>15 != uint16(nan>>31) {
			t.Errorf("F32ToBF16(NaN %#08x) = %#04x, want a NaN of the same sign", nan, got)
		}
	}
}
