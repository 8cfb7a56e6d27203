package quictransport

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport/internal/frame"
)

// feed hands the parts of message seq listed in order to a, as part
// readers would.
func feed(t *testing.T, a *assembler, seq uint64, n, k int, parts [][]byte, order []int) {
	t.Helper()
	for _, i := range order {
		h := partHeader{index: i, seq: seq, n: n, parts: len(parts), k: k}
		m, region, err := a.claim(context.Background(), h, func() {})
		if err != nil {
			t.Fatalf("claim part %d: %v", i, err)
		}
		if m == nil {
			continue // complete: not needed
		}
		if len(region) != len(parts[i]) {
			t.Fatalf("part %d: region of %d bytes for a %d-byte part", i, len(region), len(parts[i]))
		}
		copy(region, parts[i])
		a.filled(m, i, true)
	}
}

// TestAssemblerRebuild: a message comes out whole from any k of its parts,
// data or parity, in any order; parts claimed but not needed are
// cancelled when it completes.
func TestAssemblerRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var c codecs
	for _, shape := range []struct{ n, stripes int }{
		{stripeMin, 31}, {stripeMin + 1, 7}, {1<<19 + 3, 31}, {1 << 20, 15}, {5*lossyPartMin - 1, 31}, {3 << 20, 2},
	} {
		k, parts := partsOf(shape.n, shape.stripes, true)
		payload := make([]byte, shape.n)
		crand.Read(payload)
		out, err := c.encodeParts(payload, k, parts)
		if err != nil {
			t.Fatal(err)
		}
		for trial := range 8 {
			a := newAssembler(&c)
			order := rng.Perm(parts)[:k] // which k arrive first
			if trial == 0 {
				order = rng.Perm(k) // only the data parts: no rebuilding
			}
			// One more part is claimed and still being read when the
			// k-th completes: it must be cancelled, and the message
			// completes once its reader has stopped.
			late := -1
			for _, i := range rng.Perm(parts) {
				if parts > k && !slices.Contains(order, i) {
					late = i
					break
				}
			}
			cancelled := make(chan struct{})
			if late >= 0 {
				h := partHeader{index: late, seq: 1, n: shape.n, parts: parts, k: k}
				m, _, err := a.claim(context.Background(), h, func() { close(cancelled) })
				if err != nil || m == nil {
					t.Fatalf("claim of the late part: %v, %v", m, err)
				}
				go func() {
					<-cancelled // its stream is cancelled: the read fails
					a.filled(m, late, false)
				}()
			}
			feed(t, a, 1, shape.n, k, out, order)
			got, err := a.await(context.Background(), shape.n, parts, k)
			if err != nil {
				t.Fatalf("n=%d %d+%d parts, from %v: %v", shape.n, k, parts-k, order, err)
			}
			if !bytes.Equal(got, payload) {
				t.Fatalf("n=%d %d+%d parts, from %v: payload differs", shape.n, k, parts-k, order)
			}
			if late >= 0 {
				select {
				case <-cancelled:
				default:
					t.Errorf("n=%d: the late part %d was not cancelled", shape.n, late)
				}
			}
			if len(a.msgs) != 0 || a.next != 2 {
				t.Errorf("after delivery: %d messages held, next %d", len(a.msgs), a.next)
			}
		}
	}
}

// TestAssemblerRefuses: a part claimed twice, or a split that disagrees
// with the one announced first, is malformed; a part of a delivered
// message is dropped; a part beyond the window waits for the window to move.
func TestAssemblerRefuses(t *testing.T) {
	var c codecs
	a := newAssembler(&c)
	ctx := context.Background()
	n := 1 << 20
	k, parts := partsOf(n, 31, true)
	h := partHeader{index: 3, seq: 1, n: n, parts: parts, k: k}
	if m, _, err := a.claim(ctx, h, func() {}); m == nil || err != nil {
		t.Fatalf("first claim: %v, %v", m, err)
	}
	if _, _, err := a.claim(ctx, h, func() {}); !errors.Is(err, frame.ErrMalformed) {
		t.Errorf("second claim of a part: %v, want malformed", err)
	}
	h2 := h
	h2.index, h2.n = 4, n+1
	if _, _, err := a.claim(ctx, h2, func() {}); !errors.Is(err, frame.ErrMalformed) {
		t.Errorf("a part announcing another length: %v, want malformed", err)
	}
	if _, err := a.await(ctx, n, parts-1, k); !errors.Is(err, frame.ErrMalformed) {
		t.Errorf("a frame announcing another split: %v, want malformed", err)
	}

	// Seq 3 is beyond the window [1, 3) until seq 1 is delivered.
	h3 := partHeader{index: 0, seq: 3, n: stripeMin, parts: 1, k: 1}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := a.claim(wctx, h3, func() {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim beyond the window: %v, want it to wait until ctx ends", err)
	}
	claimed := make(chan error, 1)
	go func() {
		m, _, err := a.claim(ctx, h3, func() {})
		if err == nil && m == nil {
			err = errors.New("dropped")
		}
		claimed <- err
	}()
	b := bytes.Repeat([]byte{7}, n)
	out, _ := c.encodeParts(b, k, parts)
	// Part 3 was claimed above: complete it, then the rest of k.
	m := a.msgs[1]
	copy(m.buf[3*m.size:], out[3])
	a.filled(m, 3, true)
	var order []int
	for i := range k + 1 {
		if i != 3 {
			order = append(order, i)
		}
	}
	feed(t, a, 1, n, k, out, order[:k-1])
	select {
	case err := <-claimed:
		t.Fatalf("claim beyond the window returned before the window moved: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	if got, err := a.await(ctx, n, parts, k); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("await: %v", err)
	}
	select {
	case err := <-claimed:
		if err != nil {
			t.Fatalf("claim after the window moved: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("claim beyond the window still waiting after the window moved")
	}
	if m, _, err := a.claim(ctx, partHeader{index: 5, seq: 1, n: n, parts: parts, k: k}, func() {}); m != nil || err != nil {
		t.Errorf("a part of a delivered message: %v, %v, want it dropped", m, err)
	}
}

// TestBadPartHeader: every field out of range is refused, naming the
// problem as a malformed frame.
func TestBadPartHeader(t *testing.T) {
	good := partHeader{index: 30, seq: 9, n: 1 << 20, parts: 31, k: 23}
	var b [partHeaderSize]byte
	good.marshal(&b)
	if h, err := parsePartHeader(&b, 31); err != nil || h != good {
		t.Fatalf("round trip: %+v, %v", h, err)
	}
	for name, mutate := range map[string]func(b *[partHeaderSize]byte){
		"magic":           func(b *[partHeaderSize]byte) { b[1] = 'X' },
		"version":         func(b *[partHeaderSize]byte) { b[2] = 2 },
		"reserved":        func(b *[partHeaderSize]byte) { b[19] = 1 },
		"index":           func(b *[partHeaderSize]byte) { b[3] = 31 },
		"seq 0":           func(b *[partHeaderSize]byte) { clear(b[4:12]) },
		"small payload":   func(b *[partHeaderSize]byte) { b[12], b[13], b[14], b[15] = 0, 0, 1, 0 },
		"large payload":   func(b *[partHeaderSize]byte) { b[15] = 0x10 },
		"too many parts":  func(b *[partHeaderSize]byte) { b[16] = 32 },
		"no data part":    func(b *[partHeaderSize]byte) { b[17] = 0 },
		"too much parity": func(b *[partHeaderSize]byte) { b[17] = 20 },
		"parts under 16K": func(b *[partHeaderSize]byte) { b[12], b[13], b[14], b[15] = 0, 0, 4, 0; b[16], b[17] = 5, 4 },
		"fewer than data": func(b *[partHeaderSize]byte) { b[16] = 22 },
	} {
		bad := b
		mutate(&bad)
		if _, err := parsePartHeader(&bad, 31); !errors.Is(err, frame.ErrMalformed) {
			t.Errorf("%s: %v, want malformed", name, err)
		}
	}
}

// FuzzPartHeader: no input panics, and what is accepted is what the
// sender could have written, with every part non-empty and the
// allocation it implies bounded by the payload.
func FuzzPartHeader(f *testing.F) {
	var b [partHeaderSize]byte
	partHeader{index: 1, seq: 1, n: 1 << 20, parts: 31, k: 23}.marshal(&b)
	f.Add(b[:], 31)
	partHeader{index: 0, seq: 1 << 40, n: stripeMin, parts: 1, k: 1}.marshal(&b)
	f.Add(b[:], 1)
	f.Fuzz(func(t *testing.T, in []byte, stripes int) {
		if len(in) != partHeaderSize || stripes < 0 || stripes > maxStripes {
			return
		}
		h, err := parsePartHeader((*[partHeaderSize]byte)(in), stripes)
		if err != nil {
			if !errors.Is(err, frame.ErrMalformed) {
				t.Fatalf("error %v is not a malformed frame", err)
			}
			return
		}
		var out [partHeaderSize]byte
		h.marshal(&out)
		if !bytes.Equal(out[:], in) {
			t.Fatalf("accepted % x, re-encoded as % x", in, out)
		}
		size := partSize(h.n, h.k)
		if last := h.n - (h.k-1)*size; last <= 0 || h.k*size > h.n+h.k || h.parts > stripes || h.index >= h.parts {
			t.Fatalf("accepted %+v over %d connections: last data part %d bytes, buffer %d", h, stripes, last, h.k*size)
		}
	})
}
