package record

import (
	"crypto/subtle"
	"encoding/binary"
	"errors"
)

// AEGIS-128L (draft-irtf-cfrg-aegis-aead, the CFRG's specification of the
// CAESAR high-performance finalist) with a 128-bit tag, as a cipher.AEAD.
// Its state update is eight AES rounds per 32 bytes, where AES-128-GCM
// spends ten rounds per 16 bytes plus the GHASH multiplication: on the
// test host it seals about twice as fast per core (docs/performance.md).
// The block functions (update, encBlocks, decBlocks) are AES-NI assembly on
// amd64 (aegis_amd64.s) and the reference code of aegis_ref.go elsewhere;
// aegisFast says whether the fast ones are there, and only then is the
// suite offered (tcp.go).

// aegisState is S0..S7.
type aegisState [8][16]byte

var errAEGISOpen = errors.New("record: aegis-128l: message authentication failed")

// aegis128L is AEGIS-128L under one key. Safe for concurrent use: every
// call keeps its state on its own stack.
type aegis128L struct{ key [16]byte }

func newAEGIS128L(key []byte) *aegis128L {
	a := &aegis128L{}
	copy(a.key[:], key)
	return a
}

func (a *aegis128L) NonceSize() int { return 16 }
func (a *aegis128L) Overhead() int  { return TagSize }

var aegisC0 = [16]byte{0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d, 0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62}
var aegisC1 = [16]byte{0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1, 0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd}

func xor16(a, b *[16]byte) (r [16]byte) {
	for i := range r {
		r[i] = a[i] ^ b[i]
	}
	return r
}

// init is the specification's Init(key, nonce).
func (s *aegisState) init(key *[16]byte, nonce []byte) {
	var n [16]byte
	copy(n[:], nonce)
	kn := xor16(key, &n)
	s[0], s[1], s[2], s[3] = kn, aegisC1, aegisC0, aegisC1
	s[4], s[5], s[6], s[7] = kn, xor16(key, &aegisC0), xor16(key, &aegisC1), xor16(key, &aegisC0)
	var m [32]byte
	copy(m[:16], n[:])
	copy(m[16:], key[:])
	for range 10 {
		update(s, &m)
	}
}

// absorb absorbs ad, zero-padded to whole 32-byte blocks.
func (s *aegisState) absorb(ad []byte) {
	var m [32]byte
	for len(ad) >= 32 {
		copy(m[:], ad[:32])
		update(s, &m)
		ad = ad[32:]
	}
	if len(ad) > 0 {
		m = [32]byte{}
		copy(m[:], ad)
		update(s, &m)
	}
}

// keystream returns z0 || z1 for the current state.
func (s *aegisState) keystream() (z [32]byte) {
	for i := range 16 {
		z[i] = s[6][i] ^ s[1][i] ^ (s[2][i] & s[3][i])
		z[16+i] = s[2][i] ^ s[5][i] ^ (s[6][i] & s[7][i])
	}
	return z
}

// finalize is Finalize with a 128-bit tag.
func (s *aegisState) finalize(adLen, msgLen int) (tag [16]byte) {
	var t [32]byte
	binary.LittleEndian.PutUint64(t[0:], uint64(adLen)*8)
	binary.LittleEndian.PutUint64(t[8:], uint64(msgLen)*8)
	for i := range 16 {
		t[i] ^= s[2][i]
	}
	copy(t[16:], t[:16])
	for range 7 {
		update(s, &t)
	}
	for i := range tag {
		tag[i] = s[0][i] ^ s[1][i] ^ s[2][i] ^ s[3][i] ^ s[4][i] ^ s[5][i] ^ s[6][i]
	}
	return tag
}

// Seal follows cipher.AEAD: dst and plaintext may overlap exactly or not at
// all.
func (a *aegis128L) Seal(dst, nonce, plaintext, ad []byte) []byte {
	if len(nonce) != 16 {
		panic("record: aegis-128l: nonce is not 16 bytes")
	}
	ret, out := sliceForAppend(dst, len(plaintext)+TagSize)
	var s aegisState
	s.init(&a.key, nonce)
	s.absorb(ad)
	full := len(plaintext) &^ 31
	if full > 0 {
		encBlocks(&s, &out[0], &plaintext[0], full/32)
	}
	if tail := plaintext[full:]; len(tail) > 0 {
		var m [32]byte
		copy(m[:], tail)
		z := s.keystream()
		update(&s, &m)
		for i := range tail {
			out[full+i] = m[i] ^ z[i]
		}
	}
	tag := s.finalize(len(ad), len(plaintext))
	copy(out[len(plaintext):], tag[:])
	return ret
}

// Open follows cipher.AEAD; on failure the plaintext written is cleared.
func (a *aegis128L) Open(dst, nonce, ciphertext, ad []byte) ([]byte, error) {
	if len(nonce) != 16 {
		panic("record: aegis-128l: nonce is not 16 bytes")
	}
	if len(ciphertext) < TagSize {
		return nil, errAEGISOpen
	}
	n := len(ciphertext) - TagSize
	tag := ciphertext[n:]
	ret, out := sliceForAppend(dst, n)
	var s aegisState
	s.init(&a.key, nonce)
	s.absorb(ad)
	full := n &^ 31
	// The tag is read before out, which may start at ciphertext, is
	// written; out never reaches it (out is n bytes).
	var want [16]byte
	copy(want[:], tag)
	if full > 0 {
		decBlocks(&s, &out[0], &ciphertext[0], full/32)
	}
	if tail := ciphertext[full:n]; len(tail) > 0 {
		z := s.keystream()
		var m [32]byte
		for i := range tail {
			m[i] = tail[i] ^ z[i]
		}
		update(&s, &m)
		copy(out[full:], m[:len(tail)])
	}
	got := s.finalize(len(ad), n)
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		clear(out)
		return nil, errAEGISOpen
	}
	return ret, nil
}

// sliceForAppend extends in by n bytes: head is the whole, tail the new
// part (as crypto/cipher does).
func sliceForAppend(in []byte, n int) (head, tail []byte) {
	if total := len(in) + n; cap(in) >= total {
		head = in[:total]
	} else {
		head = make([]byte, total)
		copy(head, in)
	}
	tail = head[len(in):]
	return head, tail
}
