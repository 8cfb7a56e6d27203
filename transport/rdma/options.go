package rdma

import (
	"log/slog"
	"time"
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

// Options configures a Device. Zero values select the defaults.
type Options struct {
	// Library is the libibverbs to load; "" for hw/rdma's default
	// (libibverbs.so.1). core fills Library, Device, Port and GIDIndex
	// from its configuration (NEXAR_IBVERBS, NEXAR_IB_HCA,
	// NEXAR_IB_GID_INDEX).
	Library string
	// Device and Port select the port ("", 0: the first active one).
	Device string
	Port   int
	// GIDIndex is the RoCE source GID index when SetGIDIndex; otherwise
	// Open chooses (the first RoCE v2 GID of an IPv4 address, else the
	// first RoCE v2 one, else index 0).
	GIDIndex    int
	SetGIDIndex bool
	// Slots is the number of receive buffers a receiving end posts (the
	// sender's credits); SlotSize their size. Default DefaultSlots and
	// DefaultSlotSize.
	Slots, SlotSize int
	// WriteMin is the smallest buffer sent by RDMA WRITE into the
	// receiver's destination; shorter ones go by SEND. Default
	// DefaultWriteMin.
	WriteMin int
	// RegCacheSize bounds the registrations held at once. Default 256.
	RegCacheSize int
	// GPU, when set, lets the channel register device memory with the NIC
	// (GPUDirect) or stage it (gpu.go).
	GPU    GPUMemory
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
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
