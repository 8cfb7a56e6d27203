package record

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	nquic "github.com/nexar-go/nexar/transport/quic"
)

var testSecret = Secret{1, 2, 3}

var suites = []Suite{AES128GCM}

// eachSuite runs f as a subtest per suite.
func eachSuite(t *testing.T, f func(t *testing.T, s Suite)) {
	for _, s := range suites {
		t.Run(s.String(), func(t *testing.T) { f(t, s) })
	}
}

// pattern is the plaintext the tests seal as record seq of n bytes, so that
// any record that authenticates at position seq can be checked.
func pattern(seq, n int) []byte {
	p := make([]byte, n)
	for j := range p {
		p[j] = byte(seq*31 + j*7 + j>>8)
	}
	return p
}

// stream seals one record per length, record i holding pattern(i, n).
func stream(t testing.TB, s Secret, suite Suite, lens ...int) []byte {
	t.Helper()
	sl, err := NewSealer(s, suite)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for i, n := range lens {
		if out, err = sl.Seal(out, pattern(i, n)); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sealer(t testing.TB, suite Suite) *Sealer {
	t.Helper()
	s, err := NewSealer(testSecret, suite)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func reader(t testing.TB, s Secret, suite Suite, r io.Reader) *Reader {
	t.Helper()
	o, err := NewOpener(s, suite)
	if err != nil {
		t.Fatal(err)
	}
	return NewReader(r, o, &Pool{})
}

// readAll reads r to its end in reads of at most step bytes.
func readAll(r io.Reader, step int) ([]byte, error) {
	var out []byte
	buf := make([]byte, step)
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
		if n == 0 {
			return out, errors.New("Read returned 0, nil")
		}
	}
}

func TestRoundTrip(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		sizes := []int{1, 7, 64, smallBuf - Overhead, smallBuf - Overhead + 1, 100 << 10, MaxPlain, MaxPlain + 1, 3<<20 + 5}
		for _, step := range []int{1, 64, 4096, MaxPlain - 1, MaxPlain, 4 << 20} {
			if step == 1 && testing.Short() {
				continue
			}
			var pr, pw = net.Pipe()
			sl := sealer(t, suite)
			w := NewWriter(pw, sl, &Pool{})
			var want []byte
			go func() {
				rng := rand.New(rand.NewPCG(1, 2))
				for _, n := range sizes {
					// One buffer, then the same bytes as a small buffer and the rest.
					p := make([]byte, n)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					if m, err := w.Write(p); err != nil || m != n {
						t.Errorf("write %d: %d, %v", n, m, err)
						break
					}
					k := min(64, n)
					if m, err := w.Write(p[:k], p[k:]); err != nil || m != n {
						t.Errorf("write %d in two: %d, %v", n, m, err)
						break
					}
				}
				pw.Close()
			}()
			rng := rand.New(rand.NewPCG(1, 2))
			for _, n := range sizes {
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				want = append(want, p...)
				want = append(want, p...)
			}
			got, err := readAll(reader(t, testSecret, suite, pr), step)
			if err != io.EOF {
				t.Fatalf("step %d: %v, want io.EOF at the end", step, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("step %d: %d bytes read, want %d (or different)", step, len(got), len(want))
			}
		}
	})
}

// TestTamper flips every byte of a stream of three records, in turn: the
// reader returns the records before the altered one and then an error,
// never a byte of the altered record or of any after it.
func TestTamper(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		lens := []int{64, 20 << 10, 300}
		clean := stream(t, testSecret, suite, lens...)
		bounds := []int{0}
		for _, n := range lens {
			bounds = append(bounds, bounds[len(bounds)-1]+n+Overhead)
		}
		var before []byte
		prefix := [][]byte{nil}
		for i, n := range lens {
			before = append(before, pattern(i, n)...)
			prefix = append(prefix, bytes.Clone(before))
		}
		for pos := range clean {
			rec := 0
			for pos >= bounds[rec+1] {
				rec++
			}
			for _, step := range []int{5, MaxPlain} {
				bad := bytes.Clone(clean)
				bad[pos] ^= 0x20
				got, err := readAll(reader(t, testSecret, suite, bytes.NewReader(bad)), step)
				if err == nil || err == io.EOF {
					t.Fatalf("byte %d flipped: read %d bytes and %v, want an error", pos, len(got), err)
				}
				if !errors.Is(err, ErrAuth) && !errors.Is(err, ErrMalformed) && err != io.ErrUnexpectedEOF {
					t.Fatalf("byte %d flipped: %v", pos, err)
				}
				if !bytes.Equal(got, prefix[rec]) {
					t.Fatalf("byte %d (record %d) flipped: returned %d bytes, want the %d of the records before it", pos, rec, len(got), len(prefix[rec]))
				}
			}
		}
	})
}

// TestReorder: a record dropped, repeated or moved fails authentication.
func TestReorder(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		lens := []int{10, 20, 30}
		clean := stream(t, testSecret, suite, lens...)
		r0 := clean[:10+Overhead]
		r1 := clean[10+Overhead : 30+2*Overhead]
		r2 := clean[30+2*Overhead:]
		cases := map[string]struct {
			s    []byte
			good int // plaintext bytes before the failure
		}{
			"dropped":  {cat(r0, r2), 10},
			"repeated": {cat(r0, r0, r1), 10},
			"swapped":  {cat(r1, r0, r2), 0},
			"replayed": {cat(r0, r1, r2, r2), 60},
		}
		for name, c := range cases {
			r := reader(t, testSecret, suite, bytes.NewReader(c.s))
			got, err := readAll(r, 1<<20)
			if !errors.Is(err, ErrAuth) || len(got) != c.good {
				t.Errorf("%s: read %d bytes and %v; want %d and ErrAuth", name, len(got), err, c.good)
			}
			// The failure is final.
			if n, err2 := r.Read(make([]byte, 100)); n != 0 || err2 != err {
				t.Errorf("%s: read after the failure: %d, %v", name, n, err2)
			}
		}
		// Another key: nothing authenticates.
		if got, err := readAll(reader(t, Secret{9}, suite, bytes.NewReader(clean)), 64); !errors.Is(err, ErrAuth) || len(got) != 0 {
			t.Errorf("other key: %d bytes, %v", len(got), err)
		}
	})
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestTruncate: a stream cut short ends in io.EOF only at a record boundary.
func TestTruncate(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		lens := []int{100, 17 << 10}
		clean := stream(t, testSecret, suite, lens...)
		for cut := range len(clean) + 1 {
			got, err := readAll(reader(t, testSecret, suite, bytes.NewReader(clean[:cut])), 4096)
			switch cut {
			case 0, len(clean), 100 + Overhead:
				if err != io.EOF {
					t.Fatalf("cut at %d (a boundary): %v", cut, err)
				}
			default:
				if err != io.ErrUnexpectedEOF {
					t.Fatalf("cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
				}
			}
			if want := 0; cut >= 100+Overhead {
				want = 100
				if cut == len(clean) {
					want += lens[1]
				}
				if len(got) != want {
					t.Fatalf("cut at %d: %d bytes", cut, len(got))
				}
			}
		}
	})
}

func TestMalformed(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		for _, n := range []uint32{0, MaxPlain + 1, 1 << 31} {
			h := []byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)}
			s := append(h, make([]byte, 64)...)
			if _, err := reader(t, testSecret, suite, bytes.NewReader(s)).Read(make([]byte, 10)); !errors.Is(err, ErrMalformed) {
				t.Errorf("length %d: %v, want ErrMalformed", n, err)
			}
		}
		sl := sealer(t, suite)
		if _, err := sl.Seal(nil, nil); err == nil {
			t.Error("sealed an empty record")
		}
		if _, err := sl.Seal(nil, make([]byte, MaxPlain+1)); err == nil {
			t.Error("sealed an oversized record")
		}
	})
}

// TestRekey: keys move on every `every` records on both sides, and really
// change.
func TestRekey(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		const every = 3
		ks, err := newKeys(testSecret, suite, every)
		if err != nil {
			t.Fatal(err)
		}
		ko, _ := newKeys(testSecret, suite, every)
		s, o := &Sealer{k: ks}, &Opener{k: ko}
		fixed := sealer(t, suite) // never rekeys in this test
		for i := range 10 {
			p := pattern(i, 50)
			rec, err := s.Seal(nil, p)
			if err != nil {
				t.Fatal(err)
			}
			same, _ := fixed.Seal(nil, p)
			if bytes.Equal(rec, same) != (i < every) {
				t.Fatalf("record %d: sealed under the first key: %v", i, bytes.Equal(rec, same))
			}
			dst := make([]byte, 50)
			if _, err := o.Open(dst, rec); err != nil || !bytes.Equal(dst, p) {
				t.Fatalf("record %d: %v", i, err)
			}
		}
	})
}

// TestSecrets: both ends of a TLS 1.3 connection derive the same secret for
// each direction; the directions, and two connections, differ.
func TestSecrets(t *testing.T) {
	ida, _ := nquic.NewIdentity()
	idb, _ := nquic.NewIdentity()
	any := func([32]byte) error { return nil }
	pair := func() (dial, acc tls.ConnectionState) {
		ca, cb := net.Pipe()
		defer ca.Close()
		defer cb.Close()
		c := tls.Client(ca, nquic.ClientTLSConfig(ida, any))
		s := tls.Server(cb, nquic.ServerTLSConfig(idb, any))
		errc := make(chan error, 1)
		go func() { errc <- s.Handshake() }()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		return c.ConnectionState(), s.ConnectionState()
	}
	d1, a1 := pair()
	ds, dr, err := Secrets(&d1, true, AES128GCM)
	if err != nil {
		t.Fatal(err)
	}
	as, ar, err := Secrets(&a1, false, AES128GCM)
	if err != nil {
		t.Fatal(err)
	}
	if ds != ar || dr != as || ds == dr {
		t.Fatalf("secrets: dialer send %x recv %x, acceptor send %x recv %x", ds[:4], dr[:4], as[:4], ar[:4])
	}
	d2, _ := pair()
	ds2, _, _ := Secrets(&d2, true, AES128GCM)
	if ds2 == ds {
		t.Fatal("two connections share a secret")
	}
	if _, _, err := Secrets(&d1, true, Suite(9)); err == nil {
		t.Fatal("secrets for an unknown suite")
	}
	var none tls.ConnectionState
	if _, _, err := Secrets(&none, true, AES128GCM); err == nil {
		t.Fatal("secrets from no handshake")
	}
}

// TestWriteError: a writer whose stream fails reports 0 only when nothing
// reached it.
func TestWriteError(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		sl := sealer(t, suite)
		w := NewWriter(&failAfter{n: 0}, sl, &Pool{})
		if n, err := w.Write(make([]byte, 100)); n != 0 || err == nil {
			t.Fatalf("nothing written: %d, %v", n, err)
		}
		w = NewWriter(&failAfter{n: 10}, sl, &Pool{})
		if n, err := w.Write(make([]byte, 100)); n == 0 || err == nil {
			t.Fatalf("part written: %d, %v", n, err)
		}
		w = NewWriter(&failAfter{n: MaxPlain + Overhead}, sl, &Pool{})
		if n, err := w.Write(make([]byte, 2*MaxPlain)); n != MaxPlain || err == nil {
			t.Fatalf("one of two records written: %d, %v", n, err)
		}
	})
}

type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) <= f.n {
		f.n -= len(p)
		return len(p), nil
	}
	k := f.n
	f.n = 0
	return k, errors.New("broken")
}

// FuzzReader feeds arbitrary streams to a Reader: it must
// not panic or loop, every record it returns must be one sealed under the
// key at that position (pattern), and reading in small steps must return
// the same bytes as reading whole records. The seed corpus is in
// testdata/fuzz/FuzzReader.
func FuzzReader(f *testing.F) {
	suite := AES128GCM
	f.Add(stream(f, testSecret, suite, 64), uint16(7))
	f.Add(stream(f, testSecret, suite, 64, 1000, 20<<10, 3), uint16(100))
	f.Add(stream(f, testSecret, suite, 1, 2, 3, 4, 5), uint16(1))
	f.Add([]byte{0, 0, 0, 0}, uint16(1))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2}, uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, step uint16) {
		r := reader(t, testSecret, suite, bytes.NewReader(data))
		var whole []byte
		buf := make([]byte, MaxPlain)
		for seq := 0; ; seq++ {
			n, err := r.Read(buf)
			if err != nil {
				if n != 0 {
					t.Fatalf("Read returned %d bytes with %v", n, err)
				}
				break
			}
			if !bytes.Equal(buf[:n], pattern(seq, n)) {
				t.Fatalf("record %d: %d bytes that were not sealed there", seq, n)
			}
			whole = append(whole, buf[:n]...)
		}
		got, err := readAll(reader(t, testSecret, suite, bytes.NewReader(data)), max(int(step), 1))
		if err == nil || !bytes.Equal(got, whole) {
			t.Fatalf("in steps of %d: %d bytes, %v; whole records gave %d", step, len(got), err, len(whole))
		}
	})
}

// TestBuffered: what Buffered counts is what a Read returns without
// reading the connection: the rest of a record opened into its own
// buffer, and records read ahead of the one returned. A poller relies on
// it (transport/bulk): a socket with nothing left does not mean no data.
func TestBuffered(t *testing.T) {
	eachSuite(t, func(t *testing.T, suite Suite) {
		data := stream(t, testSecret, suite, 10, 20, 30)
		r := reader(t, testSecret, suite, bytes.NewReader(data))
		if n := r.Buffered(); n != 0 {
			t.Fatalf("Buffered before any read: %d", n)
		}
		buf := make([]byte, 4)
		if n, err := r.Read(buf); n != 4 || err != nil {
			t.Fatalf("first read: %d, %v", n, err)
		}
		// 6 plaintext bytes of the first record, and the two sealed records
		// read ahead with it.
		if n, want := r.Buffered(), 6+2*Overhead+20+30; n != want {
			t.Fatalf("Buffered after 4 of 10 bytes: %d, want %d", n, want)
		}
		if _, err := readAll(r, 64); err != io.EOF {
			t.Fatalf("reading the rest: %v", err)
		}
		if n := r.Buffered(); n != 0 {
			t.Fatalf("Buffered at the end: %d", n)
		}
	})
}
