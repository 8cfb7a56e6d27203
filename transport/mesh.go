package transport

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/nexar-go/nexar/topology"
)

// A Builder assembles one rank's mesh out of concrete transports, so that
// the layer above (core) names none of them: it holds a Builder (core's
// Config.Mesh, which package mesh implements) and drives what it returns
// as a DataPath, finding optional capabilities on the Mesh's parts by
// type assertion (As). Adding a transport changes the builder, not core.
type Builder interface {
	// Listen binds this rank's mesh node and makes its TLS identity: the
	// rendezvous needs the address and fingerprint before any peer is
	// known. Connect the Listener with the peer table, or Close it.
	Listen(o MeshOptions) (Listener, error)
	// Local connects len(rs) ranks of this process in memory (tests and
	// core.NewLocal): rank i delivers to rs[i]. Under o.Graph each is a
	// relay over links between neighbours only. o.Rank is ignored.
	Local(o MeshOptions, rs []Receiver) ([]Mesh, error)
}

// A Listener is a bound mesh node before it knows its peers.
type Listener interface {
	// Addr is where the node listens (what the rank advertises).
	Addr() net.Addr
	// Fingerprint is the node's TLS identity, which peers pin.
	Fingerprint() [32]byte
	// Connect forms the mesh with peers (the rendezvous' table; rank is
	// this rank in it, which the seed may have chosen after Listen, and
	// advertise its advertised host:port) and negotiates the data paths
	// over it, delivering to r. On failure it closes what it made but the
	// Listener, which the caller closes.
	Connect(ctx context.Context, rank int, peers []Peer, advertise string, r Receiver) (Mesh, error)
	// Close releases the node: after the Mesh's path is closed, or
	// without Connect. Idempotent.
	Close() error
}

// MeshOptions is what a Builder needs of the layer above's configuration,
// as plain values.
type MeshOptions struct {
	// Rank is this rank for Listen, or -1 when the rendezvous assigns it
	// (Connect then has it); Size the world's size.
	Rank, Size int
	// BindAddr is the node's host:port (port 0: any free one).
	BindAddr string
	// Graph is the sparse topology (nil: every pair talks directly):
	// the path is then a relay over links between neighbours.
	Graph *topology.Graph
	// OnDemand > 0 makes connections at first use, at most OnDemand held
	// (no bulk path then).
	OnDemand int
	// Patience is the shortest time the mesh's own waits may give up
	// after (the heartbeat timeout): dials, ring handshakes and idle
	// timeouts are never shorter.
	Patience time.Duration
	// WatchedIdle is the least idle timeout of a connection whose peer
	// the layer above watches by heartbeats (0: none watched).
	WatchedIdle time.Duration
	// Bulk is the bulk data path's mode ("auto", "off", "shm", "tcp",
	// "rdma"; CheckBulkMode), with its connections per pair, plaintext TCP
	// and RDMA between trusted hosts, and the size from which a ring
	// peer reads a payload from the sender's memory.
	Bulk          string
	BulkConns     int
	BulkPlaintext bool
	BulkRemoteMin int
	// RingSize and RingBudget bound the shared-memory rings (0: the
	// bulk path's defaults).
	RingSize, RingBudget int
	// RDMA selects the RDMA device; GPU, when set, lets it move device
	// memory (GPUDirect).
	RDMA   RDMAOptions
	GPU    GPUMemory
	Logger *slog.Logger
}

// Receiver is where one rank's mesh delivers.
type Receiver struct {
	Handle Handler
	// Place, if set, receives LaneData payloads in place (PlaceFunc).
	Place PlaceFunc
	Down  DownHandler
	// RelayLost, under a sparse topology, is told from a delivery
	// goroutine that messages from world rank src relayed via rank via
	// were lost with it.
	RelayLost func(src, via int)
	// Forming, if set, is called with the mesh's endpoint once it is
	// connected and before its data paths are negotiated (which may take
	// seconds): the layer above heartbeats on it meanwhile.
	Forming func(Endpoint)
	// Formed, if set, is called once the data paths are negotiated and
	// before a relay starts: an error from it (a peer lost meanwhile)
	// makes Connect close what it made and return that error.
	Formed func() error
}

// SetupError is a Builder's failure on this rank itself, before any peer
// was involved: Unavailable when a path the options require is not
// available here (NEXAR_BULK=rdma without an RDMA device), else an
// internal failure (no socket, no key).
type SetupError struct {
	Err         error
	Unavailable bool
}

func (e *SetupError) Error() string { return e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }

// CheckBulkMode reports an error unless s names a mode of the bulk data
// path (MeshOptions.Bulk): "auto" (or ""), "off" (or "quic"), "tcp",
// "shm" or "rdma", in any case; transport/bulk.ParseMode reads them, and
// package mesh's test keeps the two in step.
func CheckBulkMode(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto", "off", "quic", "tcp", "shm", "rdma":
		return nil
	}
	return fmt.Errorf("bulk: unknown mode %q (want auto, off, tcp, shm or rdma)", s)
}

// Mesh is a formed mesh: the DataPath the layer above drives, and the
// parts it is made of (outermost first: a relay, the bulk path, the QUIC
// node), on which As finds optional capabilities.
type Mesh struct {
	Path  DataPath
	Parts []any
}

// As returns the first of m's path and parts that implements T, as
// errors.As finds an error in a chain.
func As[T any](m Mesh) (T, bool) {
	if t, ok := m.Path.(T); ok {
		return t, true
	}
	for _, p := range m.Parts {
		if t, ok := p.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// Optional capabilities of a Mesh's parts, each found with As.

// Registrar is a path whose channels register memory with a NIC (RDMA,
// transport/bulk): Prepare says that the pieces of b are about to be sent
// or received, so that the path registers b whole once, where its
// registrations last across operations, instead of each piece on its own.
// A hint; safe for concurrent use. Forget says that b's memory is about
// to be given back (to the Go heap, or unmapped): the registrations of its
// range kept by Prepare or by the operations on it are dropped, so that
// none pins pages nobody uses (one in use by an operation goes when that
// operation ends). Registers reports whether the path has a NIC whose
// registrations Prepare makes (an RDMA device was opened; fixed for the
// path's life): without one, Prepare and Forget do nothing, and owners
// need not arrange their memory for them (core's Slabs).
type Registrar interface {
	Prepare(b []byte)
	Forget(b []byte)
	Registers() bool
}

// Broadcaster is a path that relays (transport/relay): Broadcast delivers
// one message to the world ranks in to as if sent to each directly, in
// one pass over the route tree; Talked reports whether this rank relayed
// anything to peer, which a message that must stay behind it cannot then
// overtake by broadcast.
type Broadcaster interface {
	Broadcast(ctx context.Context, lane Lane, h *Header, payload []byte, to []int) error
	Talked(peer int) bool
}

// Forwarder counts the payload bytes it forwarded for other ranks.
type Forwarder interface {
	ForwardedBytes() int64
}

// OnDemand is a mesh whose connections are made at first use and closed
// when unused: Connected reports whether one to peer is open now,
// OpenConns how many are and the most held at once.
type OnDemand interface {
	Connected(peer int) bool
	OpenConns() (open, most int)
}

// RingHolder holds shared-memory rings: RingBytes is their capacity now.
type RingHolder interface {
	RingBytes() int64
}

// GPUMemory is what a path needs of a GPU runtime: which buffers are
// device memory, a dma-buf for a device range, and copies for the staged
// path (transport/rdma.CUDA adapts hw/cuda). Implementations are safe for
// concurrent use.
type GPUMemory interface {
	// IsDevice reports whether addr is device memory.
	IsDevice(addr uintptr) bool
	// DmaBuf exports [addr, addr+n) (page aligned) as a dma-buf: the fd
	// and the range's offset in it; an error wrapping
	// transport/rdma.ErrGPUNotSupported when the driver or kernel cannot.
	DmaBuf(addr, n uintptr) (fd int, offset uint64, err error)
	CopyToHost(dst []byte, src uintptr) error
	CopyToDevice(dst uintptr, src []byte) error
}

// RDMAOptions configures an RDMA device (transport/rdma.Options). Zero
// values select the defaults.
type RDMAOptions struct {
	// Library is the libibverbs to load; "" for hw/rdma's default
	// (libibverbs.so.1). core fills Library, Device, Port and GIDIndex
	// from its configuration (NEXAR_IBVERBS, NEXAR_IB_HCA,
	// NEXAR_IB_GID_INDEX).
	Library string
	// Device and Port select the port ("", 0: the first active one).
	Device string
	Port   int
	// GIDIndex is the RoCE source GID index when SetGIDIndex; otherwise
	// the device chooses (the first RoCE v2 GID of an IPv4 address, else
	// the first RoCE v2 one, else index 0).
	GIDIndex    int
	SetGIDIndex bool
	// Slots is the number of receive buffers a receiving end posts (the
	// sender's credits); SlotSize their size. Default
	// transport/rdma.DefaultSlots and DefaultSlotSize.
	Slots, SlotSize int
	// WriteMin is the smallest buffer sent by RDMA WRITE into the
	// receiver's destination; shorter ones go by SEND. Default
	// transport/rdma.DefaultWriteMin.
	WriteMin int
	// RegCacheSize bounds the registrations held at once. Default 256.
	RegCacheSize int
	// GPU, when set, lets the channel register device memory with the NIC
	// (GPUDirect) or stage it.
	GPU    GPUMemory
	Logger *slog.Logger
}
