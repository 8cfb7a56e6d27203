package core

import (
	"bytes"
	"testing"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/transport"
)

// FuzzDecodeHeader feeds a peer's 56 header bytes (and the 18 bytes of a
// signature exchange) to the decoders: they must not panic, a header they
// accept must encode back to the same bytes (the reserved four are not
// read, so they come back zero), and the signature a rank names in a
// mismatch error must render whatever the peer sent.
func FuzzDecodeHeader(f *testing.F) {
	seeds := []struct {
		h   header
		gen membership.Generation
	}{
		{header{kind: kindColl, comm: 7, seqOrTag: 3, step: 1, total: 4096,
			sig: signature{kind: collAllreduce, dt: collective.Float32, op: collective.Sum, root: -1, count: 1024, tuning: 0xbeef}}, 2},
		{header{kind: kindColl, comm: 1, seqOrTag: 9, total: 8,
			sig: signature{kind: collAllgatherv, dt: collective.BFloat16, root: -1, count: noCount}}, 0},
		{header{kind: kindColl, comm: 3, seqOrTag: 1 << 40, step: 7, total: 1 << 30,
			sig: signature{kind: collReduceScatter, dt: collective.Float64, op: collective.Max, root: -1, count: 1 << 27, tuning: 1}}, 1 << 31},
		{header{kind: kindColl, comm: 3, seqOrTag: 5, total: 64,
			sig: signature{kind: collReduce, dt: collective.Int32, op: collective.Bxor, root: 6, count: 16}}, 4},
		{header{kind: kindP2P, comm: 1, seqOrTag: 42, total: 1 << 20}, 1},
		{header{kind: kindControl, sub: ctlBye, comm: 5, seqOrTag: 12}, 3},
		{header{kind: kindControl, sub: ctlAgree, comm: 5, seqOrTag: 1, total: 64}, 3},
		{header{kind: kindHeartbeat}, 0},
		{header{kind: kindRPC, sub: 2, comm: 1, seqOrTag: 77, total: 100}, 1},
	}
	for _, s := range seeds {
		var b transport.Header
		s.h.encode(&b, s.gen)
		want := s.h
		want.gen = s.gen
		if got, err := decodeHeader(&b); err != nil || got != want {
			f.Fatalf("header %+v decodes as %+v (%v)", want, got, err)
		}
		f.Add(b[:])
	}
	var sig [sigBytes]byte
	signature{kind: collReduce, dt: collective.Int64, op: collective.Max, root: 3, count: 10}.put(sig[:])
	f.Add(sig[:])
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, transport.HeaderSize))

	f.Fuzz(func(t *testing.T, data []byte) {
		var src transport.Header
		copy(src[:], data)
		h, err := decodeHeader(&src)
		if err == nil {
			var back transport.Header
			h.encode(&back, h.gen)
			want := src
			clear(want[52:])
			if back != want {
				t.Fatalf("decode then encode changed the header:\n got %x\nwant %x", back, want)
			}
			a, b := describePair(h.sig, h.sig)
			if a != b || a == "" {
				t.Fatalf("signature renders as %q and %q", a, b)
			}
		}
		if len(data) >= sigBytes {
			s := getSignature(data)
			var back [sigBytes]byte
			s.put(back[:])
			if got := getSignature(back[:]); got != s {
				t.Fatalf("signature %+v came back as %+v", s, got)
			}
			_ = s.String()
		}
	})
}
