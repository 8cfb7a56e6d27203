package frame

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/nexar-go/nexar/transport"
)

func encode(lane transport.Lane, h *transport.Header, p []byte) []byte {
	return append(AppendPrefix(nil, lane, h, len(p)), p...)
}

func TestRoundTrip(t *testing.T) {
	var h transport.Header
	for i := range h {
		h[i] = byte(i * 7)
	}
	tests := []struct {
		lane    transport.Lane
		payload []byte
	}{
		{transport.LaneControl, nil},
		{transport.LaneData, []byte("hello")},
		{transport.LaneRPC, bytes.Repeat([]byte{0xAB}, 70000)},
	}
	var stream []byte
	for _, tc := range tests {
		stream = append(stream, encode(tc.lane, &h, tc.payload)...)
	}
	r := &Reader{R: bytes.NewReader(stream)}
	for i, tc := range tests {
		lane, gh, p, err := r.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if lane != tc.lane || *gh != h || !bytes.Equal(p, tc.payload) {
			t.Fatalf("frame %d: got lane %v len %d, want lane %v len %d", i, lane, len(p), tc.lane, len(tc.payload))
		}
	}
	if _, _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("after last frame: got %v, want io.EOF", err)
	}
}

func TestMalformed(t *testing.T) {
	good := encode(transport.LaneData, nil, []byte("abc"))
	mut := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"magic", mut(func(b []byte) { b[0] = 'x' }), ErrMalformed},
		{"version", mut(func(b []byte) { b[2] = 9 }), ErrMalformed},
		{"lane", mut(func(b []byte) { b[3] = byte(transport.NumLanes) }), ErrMalformed},
		{"length", mut(func(b []byte) { b[7] = 0xff }), ErrMalformed},
		{"truncated payload", good[:len(good)-1], io.ErrUnexpectedEOF},
		{"truncated prefix", good[:10], io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reader{R: bytes.NewReader(tc.in)}
			if _, _, _, err := r.Next(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzReader checks that no input panics the decoder and that every frame it
// accepts re-encodes to the same bytes.
func FuzzReader(f *testing.F) {
	f.Add(encode(transport.LaneData, nil, []byte("abc")))
	f.Add(encode(transport.LaneControl, nil, nil))
	f.Add([]byte("NX\x01\x00\xff\xff\xff\xff"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &Reader{R: bytes.NewReader(in), Max: 1 << 16}
		var out []byte
		for {
			lane, h, p, err := r.Next()
			if err != nil {
				break
			}
			if len(p) > 1<<16 {
				t.Fatalf("payload of %d bytes exceeds bound", len(p))
			}
			out = append(out, encode(lane, h, p)...)
		}
		if !bytes.HasPrefix(in, out) {
			t.Fatalf("re-encoded frames differ from input")
		}
	})
}

func TestGoodbye(t *testing.T) {
	stream := encode(transport.LaneData, nil, []byte("last"))
	stream = AppendGoodbye(stream, transport.LaneData)
	r := &Reader{R: bytes.NewReader(stream)}
	if _, _, p, err := r.Next(); err != nil || string(p) != "last" {
		t.Fatalf("frame before goodbye: %q, %v", p, err)
	}
	lane, _, _, err := r.Next()
	if !errors.Is(err, ErrGoodbye) || lane != transport.LaneData {
		t.Fatalf("goodbye: lane %v, err %v; want %v, ErrGoodbye", lane, err, transport.LaneData)
	}
	bad := [][]byte{
		func() []byte { b := AppendGoodbye(nil, transport.LaneRPC); b[4] = 1; return append(b, 'x') }(),
		func() []byte { b := AppendGoodbye(nil, transport.LaneRPC); b[20] = 1; return b }(),
		func() []byte {
			b := AppendGoodbye(nil, transport.LaneRPC)
			b[3] = FlagGoodbye | byte(transport.NumLanes)
			return b
		}(),
	}
	for i, b := range bad {
		if _, _, _, err := (&Reader{R: bytes.NewReader(b)}).Next(); !errors.Is(err, ErrMalformed) {
			t.Errorf("bad goodbye %d: got %v, want ErrMalformed", i, err)
		}
	}
}
