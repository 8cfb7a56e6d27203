// Package record is the sealed record layer of the bulk TCP path: once a
// TLS 1.3 handshake has authenticated both ends of a connection (pinned
// certificates, as on every bulk connection), its bytes travel in records of
// up to MaxPlain bytes sealed under keys exported from that TLS session
// (RFC 8446 §7.5), instead of in TLS's own 16 KiB records. Large records
// cost one system call and one header per 256 KiB instead of per 16 KiB, a
// reader opens a record straight into the caller's buffer instead of into
// TLS's and copying out. The AEAD is AES-128-GCM from crypto/cipher (the
// standard library's constant-time implementation; a faster AEAD of our
// own, AEGIS-128L in assembly, was measured and not adopted: hand-written
// cryptography with no review behind it, and not FIPS 140 approved).
//
// A record:
//
//	offset  size  field
//	0       4     n: plaintext length, u32 LE, 1..MaxPlain
//	4       n     ciphertext
//	4+n     16    tag
//
// The nonce is the record's sequence number (u64 BE) in the nonce's last 8
// bytes, zeros before it (a 12-byte nonce): 0
// for a direction's first record, one more for each record after it. It is
// never sent, so a record that is dropped, repeated or moved fails
// authentication, and so does one whose header was altered (the header is
// the additional authenticated data). No byte of a record is returned
// before its tag has been checked. The first error is final: a stream that
// failed once stays failed.
//
// Keys: each direction of a connection has a 32-byte secret,
// secret_0 = TLS-Exporter("EXPORTER-nexar-bulk-record", side "/" suite, 32),
// side being "dialer" or "acceptor" (the end that seals) and suite the
// AEAD's name. Its records are sealed with key_i = HKDF-Expand(SHA-256,
// secret_i, "nexar record key", 16); after RekeyEvery records the secret
// moves on, secret_{i+1} = HKDF-Expand(SHA-256, secret_i, "nexar record
// next", 32), and the old one is forgotten. At most RekeyEvery records of at
// most 256 KiB (2^34 AES blocks) are sealed under one key: the bound TLS 1.3
// sets for AES-GCM (RFC 8446 §5.5).
//
// Sealer, Opener, Writer and Reader are not safe for concurrent use: each
// belongs to one goroutine at a time (a connection's writer or reader).
package record

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	// HeaderSize is the size of a record's header.
	HeaderSize = 4
	// TagSize is the size of a record's GCM tag.
	TagSize = 16
	// Overhead is what a record adds to its plaintext.
	Overhead = HeaderSize + TagSize
	// MaxPlain is the largest plaintext a record may carry.
	MaxPlain = 256 << 10
	// RekeyEvery is the number of records sealed under one key.
	RekeyEvery = 1 << 20
	// SecretSize is the size of a direction's secret.
	SecretSize = 32
)

// Exporter label and HKDF labels (see the package doc).
const (
	exporterLabel = "EXPORTER-nexar-bulk-record"
	keyLabel      = "nexar record key"
	nextLabel     = "nexar record next"
)

var (
	// ErrAuth: a record failed authentication (altered, dropped, repeated,
	// reordered, or sealed under another key).
	ErrAuth = errors.New("record: authentication failed: the stream was altered, or records were dropped, repeated or reordered")
	// ErrMalformed: a record header states an impossible length.
	ErrMalformed = errors.New("record: malformed record header")
	// ErrExhausted: a direction sealed 2^64 records (never in practice).
	ErrExhausted = errors.New("record: sequence numbers exhausted")
)

// Suite is a record AEAD; its value is its code in the bulk preamble's
// answer (transport/bulk, tcp.go).
type Suite uint8

const (
	// AES128GCM is AES-128-GCM from crypto/cipher (12-byte nonces), the
	// one suite; the code leaves room for another.
	AES128GCM Suite = 2
)

func (s Suite) String() string {
	switch s {
	case AES128GCM:
		return "aes-128-gcm"
	}
	return fmt.Sprintf("suite(%d)", uint8(s))
}

// Valid reports whether s is a known suite.
func (s Suite) Valid() bool { return s == AES128GCM }

// Secret is one direction's key material.
type Secret [SecretSize]byte

// Secrets exports the secrets of both directions for suite from an
// established TLS 1.3 session: send seals what this end writes, recv opens
// what it reads. dialer says which end of the connection this is.
func Secrets(cs *tls.ConnectionState, dialer bool, suite Suite) (send, recv Secret, err error) {
	if cs.Version != tls.VersionTLS13 || !cs.HandshakeComplete {
		return send, recv, fmt.Errorf("record: need a completed TLS 1.3 handshake (version %#x)", cs.Version)
	}
	if !suite.Valid() {
		return send, recv, fmt.Errorf("record: unknown suite %d", uint8(suite))
	}
	d, err := cs.ExportKeyingMaterial(exporterLabel, []byte("dialer/"+suite.String()), SecretSize)
	if err != nil {
		return send, recv, fmt.Errorf("record: export keying material: %w", err)
	}
	a, err := cs.ExportKeyingMaterial(exporterLabel, []byte("acceptor/"+suite.String()), SecretSize)
	if err != nil {
		return send, recv, fmt.Errorf("record: export keying material: %w", err)
	}
	if dialer {
		return Secret(d), Secret(a), nil
	}
	return Secret(a), Secret(d), nil
}

// keys is one direction's key schedule: the current AEAD and the sequence
// number of the next record.
type keys struct {
	suite  Suite
	secret Secret
	aead   cipher.AEAD
	seq    uint64
	every  uint64 // records per key: RekeyEvery, smaller in tests
}

func newKeys(s Secret, suite Suite, every uint64) (keys, error) {
	if !suite.Valid() {
		return keys{}, fmt.Errorf("record: unknown suite %d", uint8(suite))
	}
	k := keys{suite: suite, secret: s, every: every}
	return k, k.rekey()
}

// rekey makes the AEAD for k.secret.
func (k *keys) rekey() error {
	key, err := hkdf.Expand(sha256.New, k.secret[:], keyLabel, 16)
	if err != nil {
		return err
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return err
	}
	k.aead, err = cipher.NewGCM(b)
	return err
}

// next returns the nonce of the next record (its last NonceSize bytes) and
// advances, moving to the next key when the current one has sealed its
// share.
func (k *keys) next(nonce *[16]byte) ([]byte, error) {
	if k.seq == ^uint64(0) {
		return nil, ErrExhausted
	}
	if k.seq > 0 && k.seq%k.every == 0 {
		s, err := hkdf.Expand(sha256.New, k.secret[:], nextLabel, SecretSize)
		if err != nil {
			return nil, err
		}
		k.secret = Secret(s)
		if err := k.rekey(); err != nil {
			return nil, err
		}
	}
	*nonce = [16]byte{}
	binary.BigEndian.PutUint64(nonce[8:], k.seq)
	k.seq++
	return nonce[16-k.aead.NonceSize():], nil
}

// Sealer seals the records of one direction; one record at a time (its
// sequence number orders them), so not safe for concurrent use.
type Sealer struct {
	k  keys
	nb [16]byte // the nonce's buffer: a local one escapes through the AEAD
}

// NewSealer returns the sealer for the direction whose secret is s.
func NewSealer(s Secret, suite Suite) (*Sealer, error) {
	k, err := newKeys(s, suite, RekeyEvery)
	if err != nil {
		return nil, err
	}
	return &Sealer{k: k}, nil
}

// Seal appends the record of p (1..MaxPlain bytes) to dst. dst and p must
// not overlap.
func (s *Sealer) Seal(dst, p []byte) ([]byte, error) {
	if len(p) == 0 || len(p) > MaxPlain {
		return dst, fmt.Errorf("record: cannot seal %d bytes (1..%d)", len(p), MaxPlain)
	}
	nonce, err := s.k.next(&s.nb)
	if err != nil {
		return dst, err
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p)))
	hdr := dst[len(dst)-HeaderSize:]
	return s.k.aead.Seal(dst, nonce, p, hdr), nil
}

// Opener opens the records of one direction, in order; not safe for
// concurrent use.
type Opener struct {
	k  keys
	nb [16]byte // as Sealer's
}

// NewOpener returns the opener for the direction whose secret is s.
func NewOpener(s Secret, suite Suite) (*Opener, error) {
	k, err := newKeys(s, suite, RekeyEvery)
	if err != nil {
		return nil, err
	}
	return &Opener{k: k}, nil
}

// Length returns the plaintext length n that a record header states, or
// ErrMalformed. The whole record is n+Overhead bytes.
func Length(hdr []byte) (int, error) {
	n := binary.LittleEndian.Uint32(hdr[:HeaderSize])
	if n == 0 || n > MaxPlain {
		return 0, fmt.Errorf("%w: length %d (1..%d)", ErrMalformed, n, MaxPlain)
	}
	return int(n), nil
}

// Open authenticates rec, the next record whole (header, ciphertext, tag),
// and writes its plaintext to dst[:n]. dst must hold n bytes and either not
// overlap rec or start exactly at its ciphertext (rec[HeaderSize:]). On any
// error dst[:n] holds nothing of the record (zeros) and the opener must not
// be used again.
func (o *Opener) Open(dst, rec []byte) (int, error) {
	n, err := Length(rec)
	if err != nil {
		return 0, err
	}
	if len(rec) != n+Overhead || len(dst) < n {
		return 0, fmt.Errorf("record: open: %d-byte record for %d plaintext bytes into %d", len(rec), n, len(dst))
	}
	seq := o.k.seq
	nonce, err := o.k.next(&o.nb)
	if err != nil {
		return 0, err
	}
	if _, err := o.k.aead.Open(dst[:0], nonce, rec[HeaderSize:], rec[:HeaderSize]); err != nil {
		return 0, fmt.Errorf("%w (record %d)", ErrAuth, seq)
	}
	return n, nil
}
