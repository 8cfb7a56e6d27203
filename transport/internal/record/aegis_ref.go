package record

// The reference AEGIS-128L block functions: the specification's steps in
// plain Go over a table AES round. They are what non-amd64 builds run (where
// the suite is never offered: table lookups are not constant-time) and what
// the tests check the assembly against.

// sbox is the AES S-box, computed once from its definition (FIPS-197 §5.1.1:
// the multiplicative inverse in GF(2^8), then the affine map); never written
// after.
var sbox = makeSbox()

func gmul(a, b byte) byte {
	var p byte
	for range 8 {
		if b&1 != 0 {
			p ^= a
		}
		hi := a & 0x80
		a <<= 1
		if hi != 0 {
			a ^= 0x1b
		}
		b >>= 1
	}
	return p
}

func makeSbox() (s [256]byte) {
	for x := range 256 {
		inv := byte(0)
		for y := 1; y < 256 && x != 0; y++ {
			if gmul(byte(x), byte(y)) == 1 {
				inv = byte(y)
				break
			}
		}
		b := inv
		r := b
		for range 4 {
			b = b<<1 | b>>7
			r ^= b
		}
		s[x] = r ^ 0x63
	}
	return s
}

// aesRound is AESRound(in, rk): SubBytes, ShiftRows, MixColumns,
// AddRoundKey, on the column-major state of FIPS-197.
func aesRound(in, rk *[16]byte) (out [16]byte) {
	var t [16]byte
	for c := range 4 {
		for r := range 4 {
			t[r+4*c] = sbox[in[r+4*((c+r)%4)]]
		}
	}
	for c := range 4 {
		a0, a1, a2, a3 := t[4*c], t[4*c+1], t[4*c+2], t[4*c+3]
		out[4*c] = gmul(a0, 2) ^ gmul(a1, 3) ^ a2 ^ a3 ^ rk[4*c]
		out[4*c+1] = a0 ^ gmul(a1, 2) ^ gmul(a2, 3) ^ a3 ^ rk[4*c+1]
		out[4*c+2] = a0 ^ a1 ^ gmul(a2, 2) ^ gmul(a3, 3) ^ rk[4*c+2]
		out[4*c+3] = gmul(a0, 3) ^ a1 ^ a2 ^ gmul(a3, 2) ^ rk[4*c+3]
	}
	return out
}

// refUpdate is Update(M0, M1) with m = M0 || M1.
func refUpdate(s *aegisState, m *[32]byte) {
	var m0, m1 [16]byte
	copy(m0[:], m[:16])
	copy(m1[:], m[16:])
	k0, k4 := xor16(&s[0], &m0), xor16(&s[4], &m1)
	var n aegisState
	n[0] = aesRound(&s[7], &k0)
	n[1] = aesRound(&s[0], &s[1])
	n[2] = aesRound(&s[1], &s[2])
	n[3] = aesRound(&s[2], &s[3])
	n[4] = aesRound(&s[3], &k4)
	n[5] = aesRound(&s[4], &s[5])
	n[6] = aesRound(&s[5], &s[6])
	n[7] = aesRound(&s[6], &s[7])
	*s = n
}

// refEnc encrypts whole 32-byte blocks: Enc(xi) for each.
func refEnc(s *aegisState, dst, src []byte) {
	for len(src) >= 32 {
		var m [32]byte
		copy(m[:], src[:32])
		z := s.keystream()
		refUpdate(s, &m)
		for i := range 32 {
			dst[i] = m[i] ^ z[i]
		}
		dst, src = dst[32:], src[32:]
	}
}

// refDec decrypts whole 32-byte blocks: Dec(ci) for each.
func refDec(s *aegisState, dst, src []byte) {
	for len(src) >= 32 {
		z := s.keystream()
		var m [32]byte
		for i := range 32 {
			m[i] = src[i] ^ z[i]
		}
		refUpdate(s, &m)
		copy(dst, m[:])
		dst, src = dst[32:], src[32:]
	}
}
