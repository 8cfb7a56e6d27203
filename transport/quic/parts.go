package quictransport

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/klauspost/reedsolomon"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/internal/frame"
)

// A LaneData payload of stripeMin bytes or more to a peer with further data
// connections travels in parts (docs/wire-format.md, "QUIC data parts"):
// the data lane stream carries the frame prefix and two bytes, the number
// of parts and how many of them are data, and part i travels on a
// unidirectional stream of data connection i+1 behind a part header: a
// coded part (one of a message with parity) on a new stream of its own,
// which the receiver can cancel once it no longer needs it; plain parts
// one after the other on a long-lived stream. On a
// lossy link a third of the parts (rounded up) are Reed-Solomon parity, so
// that the receiver completes the message from the first k parts to arrive
// whichever they are, instead of waiting for the slowest (see
// docs/bulk-path.md, "Under loss").
//
//	offset size field
//	0      2    magic 'N' 'P'
//	2      1    version (1)
//	3      1    index of this part, < parts
//	4      8    seq: the message's number among the striped messages of this
//	            pair and direction, from 1, u64 LE
//	12     4    payload length n, u32 LE
//	16     1    parts
//	17     1    k: data parts
//	18     2    reserved, zero
//
// Data part i < k is payload[i*size : min((i+1)*size, n)] with size =
// ceil(n/k); parity part i >= k is size bytes over the data parts, each
// padded with zeros to size.
const (
	partHeaderSize = 20
	partVersion    = 1
	// assemblyWindow is how many messages of a pair a receiver assembles
	// at once: a part of a later one waits (and QUIC flow control holds its
	// sender) until the data lane has delivered the earlier ones.
	assemblyWindow = 2
	// parityDiv: a lossy link's message has ceil(k/parityDiv) parity parts.
	parityDiv = 3
	// partStreams is the stream credit a data connection has for parts
	// beyond the lane streams: the parts of the messages being assembled,
	// and cancelled ones whose end the sender has not yet confirmed.
	partStreams = 8
)

// Datagram kinds: the first byte of every DATAGRAM frame.
const (
	dgProbe  = 0 // a tail probe (see writeMarker); the rest is padding
	dgDone   = 1 // 8 bytes follow: seq of a coded message the sender completed
	doneSize = 9
	// doneCopies: how many of a pair's connections carry each done notice.
	doneCopies = 4
)

// partHeader is one decoded part header.
type partHeader struct {
	index    int
	seq      uint64
	n        int
	parts, k int
}

func (h partHeader) marshal(b *[partHeaderSize]byte) {
	*b = [partHeaderSize]byte{'N', 'P', partVersion, byte(h.index)}
	binary.LittleEndian.PutUint64(b[4:], h.seq)
	binary.LittleEndian.PutUint32(b[12:], uint32(h.n))
	b[16], b[17] = byte(h.parts), byte(h.k)
}

// parsePartHeader decodes and checks a part header from a pair with stripes
// further data connections.
func parsePartHeader(b *[partHeaderSize]byte, stripes int) (partHeader, error) {
	if b[0] != 'N' || b[1] != 'P' || b[2] != partVersion || b[18] != 0 || b[19] != 0 {
		return partHeader{}, fmt.Errorf("%w: part header % x", frame.ErrMalformed, b[:4])
	}
	h := partHeader{index: int(b[3]), seq: binary.LittleEndian.Uint64(b[4:]),
		n: int(binary.LittleEndian.Uint32(b[12:])), parts: int(b[16]), k: int(b[17])}
	if err := checkParts(h.n, h.parts, h.k, stripes); err != nil {
		return partHeader{}, err
	}
	if h.index >= h.parts || h.seq == 0 {
		return partHeader{}, fmt.Errorf("%w: part %d of %d, message %d", frame.ErrMalformed, h.index, h.parts, h.seq)
	}
	return h, nil
}

// checkParts checks the split of an n-byte payload into parts, k of them
// data, against a pair with stripes further data connections: what the
// sender may choose (partsOf), and nothing that would make a part empty or
// an allocation unbounded.
func checkParts(n, parts, k, stripes int) error {
	if n < stripeMin || n > transport.MaxPayload || k < 1 || parts < k || parts > stripes ||
		parts-k > (k+parityDiv-1)/parityDiv || k > n/lossyPartMin {
		return fmt.Errorf("%w: %d-byte payload in %d parts (%d data) over %d connections", frame.ErrMalformed, n, parts, k, stripes)
	}
	return nil
}

// partsOf says how a LaneData payload of n >= stripeMin bytes to a pair
// with stripes further data connections is split: k data parts of at least
// partMin bytes (lossyPartMin on a lossy link), and on a lossy link up to
// ceil(k/parityDiv) parity parts, all on distinct connections, so that at
// least three quarters of them carry data.
func partsOf(n, stripes int, lossy bool) (k, parts int) {
	if !lossy {
		k = max(1, min(stripes, n/partMin))
		return k, k
	}
	k = max(1, min(n/lossyPartMin, stripes*(parityDiv)/(parityDiv+1)))
	return k, k + min(stripes-k, (k+parityDiv-1)/parityDiv)
}

// partSize is the size of each part of an n-byte payload in k data parts
// (the last data part may be shorter).
func partSize(n, k int) int { return (n + k - 1) / k }

// codecs caches one Reed-Solomon codec per shape; codecs are safe for
// concurrent use, making one inverts a matrix.
type codecs struct {
	mu sync.Mutex
	m  map[[2]int]reedsolomon.Encoder
}

func (c *codecs) get(k, parity int) (reedsolomon.Encoder, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if enc, ok := c.m[[2]int{k, parity}]; ok {
		return enc, nil
	}
	enc, err := reedsolomon.New(k, parity)
	if err != nil {
		return nil, fmt.Errorf("quic: parity code for %d+%d parts: %w", k, parity, err)
	}
	if c.m == nil {
		c.m = map[[2]int]reedsolomon.Encoder{}
	}
	c.m[[2]int{k, parity}] = enc
	return enc, nil
}

// encodeParts returns the parts of payload: the data parts point into it,
// the parity parts (if parts > k) are new.
func (c *codecs) encodeParts(payload []byte, k, parts int) ([][]byte, error) {
	n, size := len(payload), partSize(len(payload), k)
	out := make([][]byte, parts)
	for i := range k {
		out[i] = payload[i*size : min((i+1)*size, n)]
	}
	if parts == k {
		return out, nil
	}
	enc, err := c.get(k, parts-k)
	if err != nil {
		return nil, err
	}
	shards := make([][]byte, parts)
	copy(shards, out[:k])
	shards[k-1] = make([]byte, size) // padded with zeros
	copy(shards[k-1], out[k-1])
	parity := make([]byte, (parts-k)*size)
	for i := k; i < parts; i++ {
		shards[i] = parity[(i-k)*size : (i-k+1)*size]
		out[i] = shards[i]
	}
	if err := enc.Encode(shards); err != nil {
		return nil, fmt.Errorf("quic: parity of %d+%d parts: %w", k, parts-k, err)
	}
	return out, nil
}

// assembler puts together the striped messages a pair receives. It does no
// IO: part readers claim a part, fill the region it returns and report;
// the data lane's reader awaits each message in order. All methods are safe
// for concurrent use.
type assembler struct {
	codecs *codecs
	mu     sync.Mutex
	next   uint64 // seq of the message the data lane delivers next, from 1
	msgs   map[uint64]*inMessage
	moved  chan struct{} // closed and replaced when next advances
}

// inMessage is one message being assembled.
type inMessage struct {
	seq           uint64
	n, parts, k   int
	size          int
	buf           []byte   // k*size bytes: the data parts, zero padded
	parity        [][]byte // by part index - k, allocated when claimed
	claimed, have uint64   // bit i: part i
	count         int      // parts in have
	cancel        []func() // by part index: abandons a claimed part's read
	readers       sync.WaitGroup
	complete      bool
	done          chan struct{} // closed when buf holds the payload or err is set
	err           error
}

func newAssembler(c *codecs) *assembler {
	return &assembler{codecs: c, next: 1, msgs: map[uint64]*inMessage{}, moved: make(chan struct{})}
}

// message returns the message seq, made with the given split if it is
// new; a part or marker that disagrees with what came first is malformed.
// Called with a.mu held.
func (a *assembler) message(seq uint64, n, parts, k int) (*inMessage, error) {
	m := a.msgs[seq]
	if m == nil {
		size := partSize(n, k)
		m = &inMessage{seq: seq, n: n, parts: parts, k: k, size: size, buf: make([]byte, k*size),
			parity: make([][]byte, parts-k), cancel: make([]func(), parts), done: make(chan struct{})}
		a.msgs[seq] = m
		return m, nil
	}
	if m.n != n || m.parts != parts || m.k != k {
		return nil, fmt.Errorf("%w: message %d announced as %d bytes in %d parts (%d data), then as %d in %d (%d)",
			frame.ErrMalformed, seq, m.n, m.parts, m.k, n, parts, k)
	}
	return m, nil
}

// claim reserves part h.index of message h.seq for one reader and returns
// the region its bytes go to. It waits while the message is beyond the
// assembly window. A nil message means the part is not needed (the
// message is complete or delivered): the reader drops it. cancel abandons
// the read (e.g. cancels the stream); the assembler calls it when the
// message completes without this part. Two claims of one part are
// malformed.
func (a *assembler) claim(ctx context.Context, h partHeader, cancel func()) (*inMessage, []byte, error) {
	for {
		a.mu.Lock()
		if h.seq < a.next {
			a.mu.Unlock()
			return nil, nil, nil
		}
		if h.seq >= a.next+assemblyWindow {
			moved := a.moved
			a.mu.Unlock()
			select {
			case <-moved:
				continue
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		defer a.mu.Unlock()
		m, err := a.message(h.seq, h.n, h.parts, h.k)
		if err != nil {
			return nil, nil, err
		}
		bit := uint64(1) << h.index
		if m.claimed&bit != 0 {
			return nil, nil, fmt.Errorf("%w: part %d of message %d received twice", frame.ErrMalformed, h.index, h.seq)
		}
		m.claimed |= bit
		if m.complete {
			return nil, nil, nil
		}
		m.readers.Add(1)
		m.cancel[h.index] = cancel
		if h.index < m.k {
			off := h.index * m.size
			return m, m.buf[off:min(off+m.size, m.n)], nil
		}
		m.parity[h.index-m.k] = make([]byte, m.size)
		return m, m.parity[h.index-m.k], nil
	}
}

// filled reports the end of a claimed part's read: ok if its region holds
// the part. With the k-th part the message is complete: the reads still
// going are cancelled and awaited, missing data parts rebuilt from parity,
// and coded reports whether the sender waits for a done notice.
func (a *assembler) filled(m *inMessage, index int, ok bool) (coded bool) {
	a.mu.Lock()
	if ok {
		m.have |= 1 << index
		m.count++
	}
	last := ok && !m.complete && m.count == m.k
	var cancel []func()
	if last {
		m.complete = true
		for i, c := range m.cancel {
			if c != nil && m.have&(1<<i) == 0 {
				cancel = append(cancel, c)
			}
		}
	}
	a.mu.Unlock()
	m.readers.Done()
	if !last {
		return false
	}
	for _, c := range cancel {
		c()
	}
	m.readers.Wait() // nothing writes to buf any more
	m.err = a.rebuild(m)
	close(m.done)
	return m.parts > m.k
}

// rebuild recomputes the data parts m lacks from its parity parts.
func (a *assembler) rebuild(m *inMessage) error {
	dataMask := uint64(1)<<m.k - 1
	if m.have&dataMask == dataMask {
		return nil
	}
	enc, err := a.codecs.get(m.k, m.parts-m.k)
	if err != nil {
		return err
	}
	shards := make([][]byte, m.parts)
	for i := range m.parts {
		switch {
		case i < m.k && m.have&(1<<i) != 0:
			shards[i] = m.buf[i*m.size : (i+1)*m.size]
		case i < m.k:
			shards[i] = m.buf[i*m.size : i*m.size : (i+1)*m.size] // rebuilt in place
		case m.have&(1<<i) != 0:
			shards[i] = m.parity[i-m.k]
		}
	}
	if err := enc.ReconstructData(shards); err != nil {
		return fmt.Errorf("%w: rebuilding message %d from %d of %d parts: %v", frame.ErrMalformed, m.seq, m.count, m.parts, err)
	}
	return nil
}

// await returns the payload of the next message, announced by the data
// lane with its split, once it is complete, and moves the window on.
func (a *assembler) await(ctx context.Context, n, parts, k int) ([]byte, error) {
	a.mu.Lock()
	seq := a.next
	m, err := a.message(seq, n, parts, k)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case <-m.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	a.mu.Lock()
	delete(a.msgs, seq)
	a.next++
	close(a.moved)
	a.moved = make(chan struct{})
	a.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	return m.buf[:m.n], nil
}
