package record

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
)

const (
	// smallBuf is a Reader's own buffer: headers are read with up to this
	// much read-ahead, and records that fit it are opened there.
	smallBuf = 16 << 10
	// bufCap is the capacity of a pooled buffer: a full record, plus room
	// for a small one before it (a frame's prefix), so that both leave in
	// one write.
	bufCap = MaxPlain + 2*Overhead + 4<<10
)

// Pool lends the record-sized buffers that Writers seal into and Readers
// read large records into, so that idle connections hold none. The zero
// value is ready; it is safe for concurrent use.
type Pool struct{ p sync.Pool }

func (p *Pool) get() *[]byte {
	if b, ok := p.p.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, bufCap)
	return &b
}

func (p *Pool) put(b *[]byte) { p.p.Put(b) }

// Writer seals what is written to it into records and writes them to w.
type Writer struct {
	w    io.Writer
	s    *Sealer
	pool *Pool
}

// NewWriter returns a Writer that seals with s into buffers from pool.
func NewWriter(w io.Writer, s *Sealer, pool *Pool) *Writer { return &Writer{w: w, s: s, pool: pool} }

// Write seals bufs, in order, into records (a buffer of more than MaxPlain
// bytes into several; small ones are not merged, so that a reader meets
// record boundaries where a writer's buffers begin) and writes them, as few
// at a time as a pooled buffer holds. It returns the number of bytes of bufs
// written, and an error if that is not all of them; n > 0 whenever any byte
// reached w, so that a caller can tell an untouched stream from a broken one.
func (w *Writer) Write(bufs ...[]byte) (int, error) {
	b := w.pool.get()
	defer w.pool.put(b)
	out := (*b)[:0]
	done, pending, wire := 0, 0, 0
	flush := func() error {
		m, err := w.w.Write(out)
		wire += m
		if err != nil {
			return err
		}
		done += pending
		pending = 0
		out = out[:0]
		return nil
	}
	fail := func(err error) (int, error) {
		if done == 0 && wire > 0 {
			done = 1
		}
		return done, err
	}
	for _, p := range bufs {
		for len(p) > 0 {
			k := min(len(p), MaxPlain)
			if len(out) > 0 && len(out)+k+Overhead > cap(out) {
				if err := flush(); err != nil {
					return fail(err)
				}
			}
			var err error
			if out, err = w.s.Seal(out, p[:k]); err != nil {
				if ferr := flush(); ferr != nil {
					return fail(ferr)
				}
				return fail(err)
			}
			pending += k
			p = p[k:]
		}
	}
	if len(out) > 0 {
		if err := flush(); err != nil {
			return fail(err)
		}
	}
	return done, nil
}

// Reader reads records from r, checks them and returns their plaintext.
// A record whose plaintext fits the caller's buffer is opened straight into
// it; a read smaller than the record gets the rest on the following reads.
type Reader struct {
	r      io.Reader
	o      *Opener
	pool   *Pool
	buf    []byte // read-ahead: raw bytes buf[lo:hi] not yet used; made on first read
	lo, hi int
	big    *[]byte // a large record's buffer, while plain points into it
	plain  []byte  // plaintext of the current record not yet returned
	err    error   // the first failure, returned from then on
}

// NewReader returns a Reader that opens with o, reading large records into
// buffers from pool.
func NewReader(r io.Reader, o *Opener, pool *Pool) *Reader {
	return &Reader{r: r, o: o, pool: pool}
}

// Read returns plaintext of authenticated records only. It returns io.EOF
// when r ends at a record boundary, io.ErrUnexpectedEOF inside a record,
// and otherwise the first error met (ErrAuth, ErrMalformed, r's) on every
// call from then on.
func (r *Reader) Read(p []byte) (int, error) {
	if len(r.plain) > 0 {
		n := copy(p, r.plain)
		r.plain = r.plain[n:]
		if len(r.plain) == 0 {
			r.release()
		}
		return n, nil
	}
	if r.err != nil {
		return 0, r.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := r.record(p)
	if err != nil {
		r.err = err
		r.plain = nil
		r.release()
		return 0, err
	}
	return n, nil
}

// Buffered is the number of bytes r holds that the connection no longer
// does: plaintext not yet returned, and read-ahead of a record not yet
// opened (whose rest is on its way). A reader that sees none here and none
// on the connection would block.
func (r *Reader) Buffered() int { return len(r.plain) + r.hi - r.lo }

func (r *Reader) release() {
	if r.big != nil {
		r.pool.put(r.big)
		r.big = nil
	}
}

// record reads the next record and opens it into p if its plaintext fits,
// else into its buffer, returning the part that fits p.
func (r *Reader) record(p []byte) (int, error) {
	if r.buf == nil {
		r.buf = make([]byte, smallBuf) // on first use: a connection's writing end never reads
	}
	if err := r.fill(HeaderSize); err != nil {
		return 0, err
	}
	n, err := Length(r.buf[r.lo:r.hi])
	if err != nil {
		return 0, err
	}
	total := n + Overhead
	var rec []byte
	if total <= len(r.buf) {
		if err := r.fill(total); err != nil {
			return 0, err
		}
		rec = r.buf[r.lo : r.lo+total]
		r.lo += total
	} else {
		r.big = r.pool.get()
		rec = (*r.big)[:total]
		k := copy(rec, r.buf[r.lo:r.hi])
		r.lo, r.hi = 0, 0
		if _, err := io.ReadFull(r.r, rec[k:]); err != nil {
			return 0, midRecord(err)
		}
	}
	if len(p) >= n {
		_, err := r.o.Open(p, rec)
		r.release()
		return n, err
	}
	if _, err := r.o.Open(rec[HeaderSize:], rec); err != nil {
		return 0, err
	}
	k := copy(p, rec[HeaderSize:HeaderSize+n])
	r.plain = rec[HeaderSize+k : HeaderSize+n]
	return k, nil
}

// fill makes buf[lo:hi] hold at least need bytes (need <= len(buf)),
// reading as much as r has ready up to the end of buf.
func (r *Reader) fill(need int) error {
	if r.lo == r.hi {
		r.lo, r.hi = 0, 0
	} else if r.lo+need > len(r.buf) {
		r.hi = copy(r.buf, r.buf[r.lo:r.hi])
		r.lo = 0
	}
	for r.hi-r.lo < need {
		m, err := r.r.Read(r.buf[r.hi:])
		r.hi += m
		if r.hi-r.lo >= need {
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) && r.hi == r.lo {
				return io.EOF
			}
			return midRecord(err)
		}
	}
	return nil
}

func midRecord(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Conn is a net.Conn whose bytes are sealed into records: reads and writes
// go through a Reader and a Writer on the underlying connection, everything
// else (deadlines, addresses, Close) to it directly. One goroutine may read
// while another writes.
type Conn struct {
	net.Conn
	r     *Reader
	w     *Writer
	suite Suite
}

// Suite is the AEAD the records are sealed with.
func (c *Conn) Suite() Suite { return c.suite }

// NewConn switches raw, whose TLS 1.3 handshake (state cs) has completed
// and whose TLS stream has no unread bytes on either side, to records
// sealed with suite. dialer says which end this is.
func NewConn(raw net.Conn, cs *tls.ConnectionState, dialer bool, suite Suite, pool *Pool) (*Conn, error) {
	send, recv, err := Secrets(cs, dialer, suite)
	if err != nil {
		return nil, err
	}
	s, err := NewSealer(send, suite)
	if err != nil {
		return nil, err
	}
	o, err := NewOpener(recv, suite)
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: raw, r: NewReader(raw, o, pool), w: NewWriter(raw, s, pool), suite: suite}, nil
}

func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// ReadSource makes the connection's reading side read its records from r
// (the same byte stream, reached another way: the socket taken out of Go's
// poller) instead of the connection. Call it before the first Read.
func (c *Conn) ReadSource(r io.Reader) { c.r.r = r }

// WriteSink makes the connection's writing side write its records to w
// (the same byte stream, reached another way) instead of the connection.
// Call it before the first Write.
func (c *Conn) WriteSink(w io.Writer) { c.w.w = w }

// Buffered is Reader.Buffered of the connection's reading side; like
// Read, not safe concurrently with Read.
func (c *Conn) Buffered() int               { return c.r.Buffered() }
func (c *Conn) Write(p []byte) (int, error) { return c.w.Write(p) }

// WriteBuffers seals bufs, in order, as Writer.Write does: as few writes
// to the connection as its pooled buffer allows, where a Write per buffer
// would make one each.
func (c *Conn) WriteBuffers(bufs ...[]byte) (int, error) { return c.w.Write(bufs...) }
