package record

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAESRound(t *testing.T) {
	in, rk := [16]byte(unhex(t, "000102030405060708090a0b0c0d0e0f")), [16]byte(unhex(t, "101112131415161718191a1b1c1d1e1f"))
	if got := aesRound(&in, &rk); hex.EncodeToString(got[:]) != "7a7b4e5638782546a8c0477a3b813f43" {
		t.Fatalf("AESRound = %x", got)
	}
}

// TestAEGISUpdate: the draft's Update test vector, through the block
// function this build uses and through the reference.
func TestAEGISUpdate(t *testing.T) {
	before := []string{"9b7e60b24cc873ea894ecc07911049a3", "330be08f35300faa2ebf9a7b0d274658",
		"7bbd5bd2b049f7b9b515cf26fbe7756c", "c35a00f55ea86c3886ec5e928f87db18",
		"9ebccafce87cab446396c4334592c91f", "58d83e31f256371e60fc6bb257114601",
		"1639b56ea322c88568a176585bc915de", "640818ffb57dc0fbc2e72ae93457e39a"}
	after := []string{"596ab773e4433ca0127c73f60536769d", "790394041a3d26ab697bde865014652d",
		"38cf49e4b65248acd533041b64dd0611", "16d8e58748f437bfff1797f780337cee",
		"69761320f7dd738b281cc9f335ac2f5a", "a21746bb193a569e331e1aa985d0d729",
		"09d714e6fcf9177a8ed1cde7e3d259a6", "61279ba73167f0ab76f0a11bf203bdff"}
	var m [32]byte
	copy(m[:], unhex(t, "033e6975b94816879e42917650955aa0 033e6975b94816879e42917650955aa0"))
	for name, f := range map[string]func(*aegisState, *[32]byte){"build": update, "reference": refUpdate} {
		var s aegisState
		for i, h := range before {
			s[i] = [16]byte(unhex(t, h))
		}
		f(&s, &m)
		for i, h := range after {
			if got := hex.EncodeToString(s[i][:]); got != h {
				t.Errorf("%s: S%d = %s, want %s", name, i, got, h)
			}
		}
	}
}

// TestAEGISVectors: the draft's AEGIS-128L test vectors 1-6 (128-bit tags).
func TestAEGISVectors(t *testing.T) {
	vecs := []struct{ key, nonce, ad, msg, ct, tag string }{
		{"10010000000000000000000000000000", "10000200000000000000000000000000", "", "00000000000000000000000000000000",
			"c1c0e58bd913006feba00f4b3cc3594e", "abe0ece80c24868a226a35d16bdae37a"},
		{"10010000000000000000000000000000", "10000200000000000000000000000000", "", "", "", "c2b879a67def9d74e6c14f708bbcc9b4"},
		{"10010000000000000000000000000000", "10000200000000000000000000000000", "0001020304050607",
			"000102030405060708090a0b0c0d0e0f 101112131415161718191a1b1c1d1e1f",
			"79d94593d8c2119d7e8fd9b8fc77845c 5c077a05b2528b6ac54b563aed8efe84", "cc6f3372f6aa1bb82388d695c3962d9a"},
		{"10010000000000000000000000000000", "10000200000000000000000000000000", "0001020304050607",
			"000102030405060708090a0b0c0d", "79d94593d8c2119d7e8fd9b8fc77", "5c04b3dba849b2701effbe32c7f0fab7"},
		{"10010000000000000000000000000000", "10000200000000000000000000000000",
			"000102030405060708090a0b0c0d0e0f 101112131415161718191a1b1c1d1e1f 20212223242526272829",
			"101112131415161718191a1b1c1d1e1f 202122232425262728292a2b2c2d2e2f 3031323334353637",
			"b31052ad1cca4e291abcf2df3502e6bd b1bfd6db36798be3607b1f94d34478aa 7ede7f7a990fec10",
			"7542a745733014f9474417b337399507"},
	}
	for i, v := range vecs {
		a := newAEGIS128L(unhex(t, v.key))
		nonce, ad, msg := unhex(t, v.nonce), unhex(t, v.ad), unhex(t, v.msg)
		want := append(unhex(t, v.ct), unhex(t, v.tag)...)
		got := a.Seal(nil, nonce, msg, ad)
		if !bytes.Equal(got, want) {
			t.Errorf("vector %d: sealed %x, want %x", i+1, got, want)
		}
		pt, err := a.Open(nil, nonce, want, ad)
		if err != nil || !bytes.Equal(pt, msg) {
			t.Errorf("vector %d: opened %x, %v", i+1, pt, err)
		}
	}
	// Vector 6: key and nonce swapped; must fail.
	a := newAEGIS128L(unhex(t, "10000200000000000000000000000000"))
	ct := append(unhex(t, "79d94593d8c2119d7e8fd9b8fc77"), unhex(t, "5c04b3dba849b2701effbe32c7f0fab7")...)
	if pt, err := a.Open(nil, unhex(t, "10010000000000000000000000000000"), ct, unhex(t, "0001020304050607")); err == nil {
		t.Errorf("vector 6 opened: %x", pt)
	}
}

// TestAEGISBlocksMatchReference: the block functions this build uses give
// the reference's output and state, for every block count up to 40, in
// place and not.
func TestAEGISBlocksMatchReference(t *testing.T) {
	if !aegisFast {
		t.Skip("no fast AEGIS block functions on this CPU: the build uses the reference")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n <= 40; n++ {
		var s0 aegisState
		for i := range s0 {
			for j := range s0[i] {
				s0[i][j] = byte(rng.Uint32())
			}
		}
		src := make([]byte, 32*n+1)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		for _, dec := range []bool{false, true} {
			s1, s2 := s0, s0
			want := make([]byte, 32*n)
			got := make([]byte, 32*n+1)
			inplace := bytes.Clone(src)
			if dec {
				refDec(&s1, want, src[:32*n])
				decBlocks(&s2, ptr(got), ptr(src), n)
			} else {
				refEnc(&s1, want, src[:32*n])
				encBlocks(&s2, ptr(got), ptr(src), n)
			}
			if !bytes.Equal(got[:32*n], want) || s1 != s2 {
				t.Fatalf("%d blocks (decrypt %v): output or state differ from the reference", n, dec)
			}
			s3 := s0
			if dec {
				decBlocks(&s3, ptr(inplace), ptr(inplace), n)
			} else {
				encBlocks(&s3, ptr(inplace), ptr(inplace), n)
			}
			if !bytes.Equal(inplace[:32*n], want) || s3 != s1 || inplace[32*n] != src[32*n] {
				t.Fatalf("%d blocks in place (decrypt %v): differ from the reference", n, dec)
			}
		}
	}
}

func ptr(b []byte) *byte { return unsafe.SliceData(b) }

// TestAEGISSealOpen: every length around the block size, in place and not,
// with a flipped bit anywhere failing and clearing the output.
func TestAEGISSealOpen(t *testing.T) {
	a := newAEGIS128L(make([]byte, 16))
	nonce := make([]byte, 16)
	for n := 0; n <= 100; n++ {
		msg := pattern(n, n)
		ad := pattern(1, n%7)
		ct := a.Seal(nil, nonce, msg, ad)
		buf := bytes.Clone(ct)
		pt, err := a.Open(buf[:0], nonce, buf, ad)
		if err != nil || !bytes.Equal(pt, msg) {
			t.Fatalf("length %d in place: %v", n, err)
		}
		for i := range ct {
			bad := bytes.Clone(ct)
			bad[i] ^= 1
			out := bytes.Repeat([]byte{0xaa}, n)
			if _, err := a.Open(out[:0], nonce, bad, ad); err == nil {
				t.Fatalf("length %d: byte %d flipped and opened", n, i)
			}
			if !bytes.Equal(out, make([]byte, n)) {
				t.Fatalf("length %d: output not cleared after a failed open", n)
			}
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	for _, s := range []Suite{AES128GCM, AEGIS128L} {
		b.Run(s.String(), func(b *testing.B) {
			k, err := newKeys(testSecret, s, RekeyEvery)
			if err != nil {
				b.Fatal(err)
			}
			sl := &Sealer{k}
			p := make([]byte, MaxPlain)
			out := make([]byte, 0, MaxPlain+Overhead)
			b.SetBytes(MaxPlain)
			for b.Loop() {
				if _, err := sl.Seal(out[:0], p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
