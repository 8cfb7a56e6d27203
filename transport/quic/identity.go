package quictransport

import (
	"crypto/tls"
	"crypto/x509"

	"github.com/nexar-go/nexar/internal/identity"
)

// ALPN is the application protocol negotiated on every nexar connection.
const ALPN = identity.ALPN

// Identity is a process's TLS key pair (internal/identity).
type Identity = identity.Identity

// NewIdentity makes a fresh key pair and self-signed certificate
// (identity.New).
func NewIdentity() (*Identity, error) { return identity.New() }

// Fingerprint returns the SHA-256 of cert's DER encoding.
func Fingerprint(cert *x509.Certificate) [32]byte { return identity.Fingerprint(cert) }

// Equal compares two fingerprints in constant time.
func Equal(a, b [32]byte) bool { return identity.Equal(a, b) }

// ServerTLSConfig is identity.ServerTLSConfig.
func ServerTLSConfig(id *Identity, verifyPeer func(fp [32]byte) error) *tls.Config {
	return identity.ServerTLSConfig(id, verifyPeer)
}

// ClientTLSConfig is identity.ClientTLSConfig.
func ClientTLSConfig(id *Identity, verifyPeer func(fp [32]byte) error) *tls.Config {
	return identity.ClientTLSConfig(id, verifyPeer)
}

var errNoCert = identity.ErrNoCert
