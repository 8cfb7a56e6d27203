package collective

import "math"

// Half-precision conversions, table-free. The exported functions keep the
// common case (normal numbers) small enough to inline into the reduction
// loops and move zeros, subnormals, Inf and NaN to out-of-line helpers.
// NaN payloads are preserved (truncated to the target width; a NaN whose
// kept payload would be zero gets the quiet bit), so F32ToF16(F16ToF32(h))
// == h for every h, and likewise for bfloat16.

// F16ToF32 converts an IEEE 754 binary16 value to float32 exactly.
func F16ToF32(h uint16) float32 {
	x := uint32(h)
	sign := x & 0x8000 << 16
	o := x & 0x7fff << 13
	switch {
	case o >= 0x0f800000: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | o)
	case o < 0x00800000: // zero or subnormal: man * 2^-24, exact; no
		// denormal operand, which would cost a microcode assist
		return math.Float32frombits(sign | math.Float32bits(float32(x&0x3ff)*0x1p-24))
	}
	return math.Float32frombits(sign | (o + 112<<23))
}

// F32ToF16 converts f to IEEE 754 binary16, rounding to nearest even;
// values beyond the half range become ±Inf, tiny ones subnormals or ±0.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	if h, ok := f32ToF16Normal(b); ok {
		return h
	}
	return f32ToF16Special(b)
}

// f32ToF16Normal is the inlinable common case of F32ToF16: ok is false
// unless b rounds to a normal half (or overflows to Inf by rounding).
func f32ToF16Normal(b uint32) (uint16, bool) {
	a := b & 0x7fffffff
	// Round to nearest even at bit 13; a carry into the exponent is right,
	// up to and including Inf.
	h := uint16(b>>16&0x8000 | ((a+0xfff+b>>13&1)>>13 - 112<<10))
	return h, a-113<<23 < 30<<23 // exponent 113..142
}

func f32ToF16Special(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff:
		if man == 0 {
			return sign | 0x7c00
		}
		m := uint16(man >> 13)
		if m == 0 {
			m = 0x200 // keep it a NaN
		}
		return sign | 0x7c00 | m
	case exp > 142:
		return sign | 0x7c00
	case exp < 102: // below half the smallest subnormal (or exactly it: ties to 0)
		return sign
	}
	// Subnormal half: value = M * 2^(exp-150) = (M >> (126-exp)) * 2^-24.
	m := man | 0x800000
	shift := uint32(126 - exp)
	r := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || rem == half && r&1 == 1 {
		r++ // may carry into the smallest normal, which is the right encoding
	}
	return sign | uint16(r)
}

// BF16ToF32 converts a bfloat16 value to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts f to bfloat16, rounding to nearest even.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return bf16NaN(b)
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func bf16NaN(b uint32) uint16 {
	h := uint16(b >> 16)
	if h&0x7f == 0 {
		h |= 0x40
	}
	return h
}

// halfKey maps a half/bfloat16 bit pattern to an unsigned key that orders
// like the value, with -0 just below +0 (sign-magnitude to offset binary).
func halfKey(x uint16) uint16 {
	if x&0x8000 != 0 {
		return ^x
	}
	return x | 0x8000
}

// halfMin and halfMax pick one of the inputs, so they need no conversion
// and are exact; inf is the exponent-all-ones pattern (0x7c00 or 0x7f80),
// above which a magnitude is NaN.
func halfMin(a, b, inf uint16) uint16 {
	switch {
	case a&0x7fff > inf:
		return a
	case b&0x7fff > inf:
		return b
	case halfKey(b) < halfKey(a):
		return b
	}
	return a
}

func halfMax(a, b, inf uint16) uint16 {
	switch {
	case a&0x7fff > inf:
		return a
	case b&0x7fff > inf:
		return b
	case halfKey(b) > halfKey(a):
		return b
	}
	return a
}

func reduceF16(d, s []uint16, op Op) {
	s = s[:len(d)]
	switch op {
	case Sum, Avg:
		i := 0
		for ; i+4 <= len(d); i += 4 {
			a, b := d[i:i+4:i+4], s[i:i+4:i+4]
			a[0] = f16Sum(a[0], b[0])
			a[1] = f16Sum(a[1], b[1])
			a[2] = f16Sum(a[2], b[2])
			a[3] = f16Sum(a[3], b[3])
		}
		for ; i < len(d); i++ {
			d[i] = f16Sum(d[i], s[i])
		}
	case Prod:
		i := 0
		for ; i+4 <= len(d); i += 4 {
			a, b := d[i:i+4:i+4], s[i:i+4:i+4]
			a[0] = f16Mul(a[0], b[0])
			a[1] = f16Mul(a[1], b[1])
			a[2] = f16Mul(a[2], b[2])
			a[3] = f16Mul(a[3], b[3])
		}
		for ; i < len(d); i++ {
			d[i] = f16Mul(d[i], s[i])
		}
	case Min:
		for i := range d {
			d[i] = halfMin(d[i], s[i], 0x7c00)
		}
	case Max:
		for i := range d {
			d[i] = halfMax(d[i], s[i], 0x7c00)
		}
	}
}

func reduceBF16(d, s []uint16, op Op) {
	s = s[:len(d)]
	switch op {
	case Sum, Avg:
		i := 0
		for ; i+8 <= len(d); i += 8 {
			a, b := d[i:i+8:i+8], s[i:i+8:i+8]
			a[0] = F32ToBF16(BF16ToF32(a[0]) + BF16ToF32(b[0]))
			a[1] = F32ToBF16(BF16ToF32(a[1]) + BF16ToF32(b[1]))
			a[2] = F32ToBF16(BF16ToF32(a[2]) + BF16ToF32(b[2]))
			a[3] = F32ToBF16(BF16ToF32(a[3]) + BF16ToF32(b[3]))
			a[4] = F32ToBF16(BF16ToF32(a[4]) + BF16ToF32(b[4]))
			a[5] = F32ToBF16(BF16ToF32(a[5]) + BF16ToF32(b[5]))
			a[6] = F32ToBF16(BF16ToF32(a[6]) + BF16ToF32(b[6]))
			a[7] = F32ToBF16(BF16ToF32(a[7]) + BF16ToF32(b[7]))
		}
		for ; i < len(d); i++ {
			d[i] = F32ToBF16(BF16ToF32(d[i]) + BF16ToF32(s[i]))
		}
	case Prod:
		i := 0
		for ; i+8 <= len(d); i += 8 {
			a, b := d[i:i+8:i+8], s[i:i+8:i+8]
			a[0] = F32ToBF16(BF16ToF32(a[0]) * BF16ToF32(b[0]))
			a[1] = F32ToBF16(BF16ToF32(a[1]) * BF16ToF32(b[1]))
			a[2] = F32ToBF16(BF16ToF32(a[2]) * BF16ToF32(b[2]))
			a[3] = F32ToBF16(BF16ToF32(a[3]) * BF16ToF32(b[3]))
			a[4] = F32ToBF16(BF16ToF32(a[4]) * BF16ToF32(b[4]))
			a[5] = F32ToBF16(BF16ToF32(a[5]) * BF16ToF32(b[5]))
			a[6] = F32ToBF16(BF16ToF32(a[6]) * BF16ToF32(b[6]))
			a[7] = F32ToBF16(BF16ToF32(a[7]) * BF16ToF32(b[7]))
		}
		for ; i < len(d); i++ {
			d[i] = F32ToBF16(BF16ToF32(d[i]) * BF16ToF32(s[i]))
		}
	case Min:
		for i := range d {
			d[i] = halfMin(d[i], s[i], 0x7f80)
		}
	case Max:
		for i := range d {
			d[i] = halfMax(d[i], s[i], 0x7f80)
		}
	}
}

func f16Sum(a, b uint16) uint16 {
	x := math.Float32bits(F16ToF32(a) + F16ToF32(b))
	if h, ok := f32ToF16Normal(x); ok {
		return h
	}
	return f32ToF16Special(x)
}

func f16Mul(a, b uint16) uint16 {
	x := math.Float32bits(F16ToF32(a) * F16ToF32(b))
	if h, ok := f32ToF16Normal(x); ok {
		return h
	}
	return f32ToF16Special(x)
}
