//go:build !linux

package rdma

import "errors"

// Pages keeps registrations of host memory valid across uses where it can
// prove that their memory is unchanged; only on Linux (pages_linux.go).
// Elsewhere it keeps none. Safe for concurrent use.
type Pages struct{}

// NewPages returns a Pages that keeps nothing on this system.
func NewPages() *Pages { return &Pages{} }

// Usable says why p keeps no registration.
func (p *Pages) Usable() error {
	return errors.New("hw/rdma: lasting registrations need Linux")
}

// Hold never holds here.
func (p *Pages) Hold(addr, n uintptr) (Held, bool) { return nil, false }
