// Package identity is a process's TLS identity and the pinning of its
// peers: a fresh key pair per process, known to peers by the SHA-256
// fingerprint of its self-signed certificate, and the TLS 1.3
// configurations that check a peer's fingerprint instead of a chain.
// The QUIC mesh, the bulk path's TCP connections and the rendezvous
// (membership) all use it; it is a leaf so that the rendezvous need not
// import a transport.
package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// ALPN is the application protocol negotiated on every nexar connection.
const ALPN = "nexar/1"

// Identity is a process's TLS key pair. The private key never leaves the
// process; peers know it only by Fingerprint. It is immutable and safe for
// concurrent use.
type Identity struct {
	Cert        tls.Certificate // self-signed leaf, with Leaf set
	Fingerprint [32]byte        // SHA-256 of the DER leaf
}

// New makes a fresh ECDSA P-256 key and a self-signed certificate.
// Validity dates are generous because peers pin the fingerprint instead of
// checking a chain.
func New() (*Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("identity: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "nexar"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"nexar"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("identity: create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("identity: parse certificate: %w", err)
	}
	return &Identity{
		Cert:        tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		Fingerprint: sha256.Sum256(der),
	}, nil
}

// Fingerprint returns the SHA-256 of cert's DER encoding.
func Fingerprint(cert *x509.Certificate) [32]byte { return sha256.Sum256(cert.Raw) }

// Equal compares two fingerprints in constant time.
func Equal(a, b [32]byte) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// ErrNoCert: the peer presented no certificate.
var ErrNoCert = errors.New("identity: peer presented no certificate")

func verifyLeaf(verifyPeer func(fp [32]byte) error) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return ErrNoCert
		}
		if verifyPeer == nil {
			return errors.New("identity: no peer is trusted")
		}
		return verifyPeer(sha256.Sum256(raw[0]))
	}
}

// ServerTLSConfig returns the TLS 1.3 server configuration nexar uses: id as
// the certificate, a client certificate required, and the client's leaf
// fingerprint passed to verifyPeer, which accepts it by returning nil (use
// Equal to compare). Session resumption is off so every connection is
// verified. A nil verifyPeer refuses every client.
func ServerTLSConfig(id *Identity, verifyPeer func(fp [32]byte) error) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{id.Cert},
		ClientAuth:             tls.RequireAnyClientCert,
		VerifyPeerCertificate:  verifyLeaf(verifyPeer),
		NextProtos:             []string{ALPN},
		SessionTicketsDisabled: true,
	}
}

// ClientTLSConfig is the client side of ServerTLSConfig. Chain verification
// is replaced by pinning: verifyPeer sees the server's leaf fingerprint.
func ClientTLSConfig(id *Identity, verifyPeer func(fp [32]byte) error) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Cert},
		// Safe only because VerifyPeerCertificate pins the leaf.
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: verifyLeaf(verifyPeer),
		NextProtos:            []string{ALPN},
		ServerName:            "nexar",
	}
}
