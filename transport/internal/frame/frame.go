// Package frame encodes and decodes the bulk wire frame shared by the stream
// transports: a fixed little-endian prefix, the 56-byte opaque header and the
// raw payload.
//
//	offset size field
//	0      2    magic 'N' 'X'
//	2      1    version (1)
//	3      1    lane
//	4      4    payload length, u32 LE, <= transport.MaxPayload
//	8      56   header, opaque
//	64     n    payload
//
// A goodbye frame is the last frame on a stream: the lane byte carries
// FlagGoodbye, the length is 0 and the header all zero. It tells the reader
// that the sender has closed and that every frame before it on the stream
// has been read.
//
// It is kept apart from any one transport so that a later bulk path (TCP,
// shared memory) can speak the same frames.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/nexar-go/nexar/transport"
)

const (
	// Magic0 and Magic1 open every frame.
	Magic0, Magic1 = 'N', 'X'
	// Version is the only frame version this code speaks.
	Version = 1
	// PrefixSize is the size of the fixed part before the payload.
	PrefixSize = 8 + transport.HeaderSize
)

// FlagGoodbye marks the lane byte of a goodbye frame.
const FlagGoodbye = 0x80

// FlagRemote marks the lane byte of a remote frame (shared-memory rings
// only): instead of the n payload bytes, RemoteSize bytes follow that say
// where the payload lies in the sender's memory, for the receiver to copy
// with one system call (cross-memory attach). See docs/wire-format.md.
const FlagRemote = 0x40

// RemoteSize is the size of a remote frame's descriptor: the payload's
// address in the sender (u64 LE) and 8 reserved zero bytes.
const RemoteSize = 16

// AppendRemote appends the prefix and descriptor of a remote frame for the
// n-byte payload at addr in the sender's memory.
func AppendRemote(dst []byte, lane transport.Lane, h *transport.Header, n int, addr uint64) []byte {
	dst = AppendPrefix(dst, lane, h, n)
	dst[len(dst)-PrefixSize+3] |= FlagRemote
	var d [RemoteSize]byte
	binary.LittleEndian.PutUint64(d[:], addr)
	return append(dst, d[:]...)
}

// RemoteAddr reads a remote frame's descriptor.
func RemoteAddr(d *[RemoteSize]byte) (uint64, error) {
	if binary.LittleEndian.Uint64(d[8:]) != 0 {
		return 0, fmt.Errorf("%w: remote descriptor with reserved bytes set", ErrMalformed)
	}
	return binary.LittleEndian.Uint64(d[:]), nil
}

// ErrGoodbye is returned, with the frame's lane, by ParsePrefix and
// Reader.Next for a well-formed goodbye frame.
var ErrGoodbye = errors.New("frame: goodbye")

// AppendGoodbye appends a goodbye frame for lane.
func AppendGoodbye(dst []byte, lane transport.Lane) []byte {
	dst = AppendPrefix(dst, lane, nil, 0)
	dst[len(dst)-PrefixSize+3] |= FlagGoodbye
	return dst
}

// ErrMalformed wraps every decoding error caused by the bytes on the wire.
var ErrMalformed = errors.New("frame: malformed")

// AppendPrefix appends the fixed part of a frame for a payload of n bytes.
func AppendPrefix(dst []byte, lane transport.Lane, h *transport.Header, n int) []byte {
	var p [8]byte
	p[0], p[1], p[2], p[3] = Magic0, Magic1, Version, byte(lane)
	binary.LittleEndian.PutUint32(p[4:], uint32(n))
	dst = append(dst, p[:]...)
	if h == nil {
		var z transport.Header
		return append(dst, z[:]...)
	}
	return append(dst, h[:]...)
}

// ParsePrefix checks the fixed part of a frame and returns its lane, header
// and payload length; max bounds the length (use transport.MaxPayload). A
// remote frame is malformed here (see ParsePrefixRemote).
func ParsePrefix(b *[PrefixSize]byte, max uint32) (transport.Lane, *transport.Header, int, error) {
	lane, h, n, remote, err := ParsePrefixRemote(b, max)
	if err == nil && remote {
		return 0, nil, 0, fmt.Errorf("%w: remote frame on a stream", ErrMalformed)
	}
	return lane, h, n, err
}

// ParsePrefixRemote is ParsePrefix for streams that may carry remote
// frames; remote reports one (its descriptor follows the prefix).
func ParsePrefixRemote(b *[PrefixSize]byte, max uint32) (lane transport.Lane, h *transport.Header, n int, remote bool, err error) {
	lane, h, n, err = parsePrefix(b, max)
	return lane, h, n, err == nil && b[3]&FlagRemote != 0, err
}

func parsePrefix(b *[PrefixSize]byte, max uint32) (transport.Lane, *transport.Header, int, error) {
	h := new(transport.Header)
	lane, n, err := parsePrefixInto(b, max, h)
	if err != nil {
		return lane, nil, 0, err
	}
	return lane, h, n, nil
}

// ParsePrefixInto is ParsePrefixRemote writing the header into h, which
// the caller owns (no allocation: the shared-memory reader keeps one per
// channel). On error h is undefined.
func ParsePrefixInto(b *[PrefixSize]byte, max uint32, h *transport.Header) (lane transport.Lane, n int, remote bool, err error) {
	lane, n, err = parsePrefixInto(b, max, h)
	return lane, n, err == nil && b[3]&FlagRemote != 0, err
}

func parsePrefixInto(b *[PrefixSize]byte, max uint32, h *transport.Header) (transport.Lane, int, error) {
	if b[0] != Magic0 || b[1] != Magic1 {
		return 0, 0, fmt.Errorf("%w: bad magic %#02x%02x", ErrMalformed, b[0], b[1])
	}
	if b[2] != Version {
		return 0, 0, fmt.Errorf("%w: unknown version %d", ErrMalformed, b[2])
	}
	lane := transport.Lane(b[3] &^ (FlagGoodbye | FlagRemote))
	if lane >= transport.NumLanes {
		return 0, 0, fmt.Errorf("%w: unknown lane %d", ErrMalformed, b[3])
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if b[3]&FlagGoodbye != 0 {
		if b[3]&FlagRemote != 0 {
			return 0, 0, fmt.Errorf("%w: goodbye frame marked remote", ErrMalformed)
		}
		if n != 0 || *(*transport.Header)(b[8:]) != (transport.Header{}) {
			return 0, 0, fmt.Errorf("%w: goodbye frame with a payload or header", ErrMalformed)
		}
		return lane, 0, ErrGoodbye
	}
	if n > max {
		return 0, 0, fmt.Errorf("%w: payload length %d exceeds %d", ErrMalformed, n, max)
	}
	copy(h[:], b[8:])
	return lane, int(n), nil
}

// Reader decodes frames from a byte stream. It is not safe for concurrent use.
type Reader struct {
	R   io.Reader
	Max uint32 // payload bound; zero means transport.MaxPayload
	buf [PrefixSize]byte
}

// Next reads one frame. It returns io.EOF only on a clean end between frames;
// a truncated frame is io.ErrUnexpectedEOF; a goodbye frame is ErrGoodbye
// with its lane. The payload is freshly allocated
// (after the length was checked) and belongs to the caller.
func (r *Reader) Next() (transport.Lane, *transport.Header, []byte, error) {
	if _, err := io.ReadFull(r.R, r.buf[:]); err != nil {
		return 0, nil, nil, err
	}
	max := r.Max
	if max == 0 {
		max = transport.MaxPayload
	}
	lane, h, n, err := ParsePrefix(&r.buf, max)
	if err != nil {
		return lane, nil, nil, err
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r.R, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, nil, err
	}
	return lane, h, p, nil
}
