package bulk

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// FuzzDecodeCtl feeds a peer's negotiation payload to the decoder the
// control lane uses: it must not panic, must refuse what exceeds ctlMax
// and what is no known message (version, type, kind), and a message it
// accepts must encode to bytes that decode to the same message (the
// encoding is a fixed point after one round).
func FuzzDecodeCtl(f *testing.F) {
	for _, m := range []message{
		helloMsg{Proc: procClaim{Host: "mid/boot/host/net:[4026531840]", PID: 4242, Start: 123456, PIDNS: "pid:[4026531836]"}, SHM: true, TCP: true, RDMA: true},
		offerMsg{Kind: pathSHM, Ring: ringSpec{Path: "/dev/shm/nexar-1-2-abc", Cookie: bytes.Repeat([]byte{7}, 16), Size: 1 << 22}},
		offerMsg{Kind: pathTCP, Dial: dialSpec{Addr: "10.0.0.2:40123", Nonce: bytes.Repeat([]byte{9}, 32), Conns: 4, TLS: true}},
		offerMsg{Kind: pathRDMA, QP: cbor.RawMessage{0xa2, 0x63, 'q', 'p', 'n', 0x18, 0x2a, 0x63, 'p', 's', 'n', 0x01}},
		offerMsg{Kind: pathSHMLazy},
		resultMsg{Kind: pathSHM, OK: true, Probe: probe{PID: 99, Addr: 0xdeadbeef, Data: make([]byte, 16)}},
		resultMsg{Kind: pathSHM, Err: "open: permission denied", TCP: true},
		wantMsg{TCP: true, Size: 1 << 20},
		rpcWantMsg{Host: "h", SHM: true},
		offerMsg{RPC: true, Kind: pathQUIC},
		offerMsg{RPC: true, Kind: pathSHM, Ring: ringSpec{Path: "/dev/shm/r", Cookie: []byte{1}, Size: 1 << 16, Bell: "/dev/shm/r.bell"}},
		resultMsg{RPC: true, Kind: pathSHM, OK: true},
		byeMsg{},
		byeAckMsg{},
		helloMsg{Proc: procClaim{Host: strings.Repeat("h", ctlMax)}}, // over the limit
	} {
		b, err := encodeCtl(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, w := range []wireMsg{
		{V: 1, T: "offer", Kind: "ring"},    // unknown kind
		{V: 1, T: "rpcoffer", Kind: "rdma"}, // kind not of that type
		{V: 1, T: "hullo"},                  // unknown type
	} {
		b, err := cbor.Marshal(&w)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xa1, 0x61, 'v', 0x02})  // version 2
	f.Add(bytes.Repeat([]byte{0x81}, 64)) // nested arrays past the limit

	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decodeCtl(p)
		if len(p) > ctlMax && err == nil {
			t.Fatalf("accepted a message of %d bytes (limit %d)", len(p), ctlMax)
		}
		if err != nil {
			return
		}
		b1, err := encodeCtl(m)
		if err != nil {
			t.Fatalf("re-encoding an accepted message: %v", err)
		}
		if len(b1) > ctlMax {
			return // longer once re-encoded (a raw qp map is kept as sent): nothing to compare
		}
		m2, err := decodeCtl(b1)
		if err != nil {
			t.Fatalf("an accepted message re-encoded is refused: %v (%x)", err, b1)
		}
		b2, err := encodeCtl(m2)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("round trip changed the message:\n%x\n%x (%v)", b1, b2, err)
		}
	})
}
