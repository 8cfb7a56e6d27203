package rdma

import (
	"log/slog"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// Limits and defaults.
const (
	DefaultSlots    = 16
	DefaultSlotSize = 64 << 10
	DefaultWriteMin = 64 << 10
	maxSlots        = 1024
	minSlotSize     = 4 << 10
	maxSlotSize     = 4 << 20
	// initialCredits bounds how long a sender waits for the receiver to
	// accept (its first credits).
	initialCredits = 30 * time.Second
	// closeDrain bounds how long a closing end waits for its sends to be
	// acknowledged before it flushes them.
	closeDrain = 2 * time.Second
	// probeEvery is how long a sending end waits on its receiver before it
	// probes it, and then between probes (End.waitLocked). A probe to a
	// dead receiver fails once the NIC's retries run out: 8 tries of the
	// local ACK timeout (Timeout 14: 67 ms), about 0.5 s.
	probeEvery = time.Second
)

// Options configures a Device (transport.RDMAOptions, where core's
// configuration names it). Zero values select the defaults.
type Options = transport.RDMAOptions

func withDefaults(o Options) Options {
	if o.Slots <= 0 {
		o.Slots = DefaultSlots
	}
	o.Slots = min(o.Slots, maxSlots)
	if o.SlotSize <= 0 {
		o.SlotSize = DefaultSlotSize
	}
	o.SlotSize = min(max(o.SlotSize, minSlotSize), maxSlotSize)
	if o.WriteMin <= 0 {
		o.WriteMin = DefaultWriteMin
	}
	if o.RegCacheSize <= 0 {
		o.RegCacheSize = 256
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
