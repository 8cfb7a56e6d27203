// Package mesh assembles one rank's data path out of the concrete
// transports, which core names none of: the QUIC mesh (transport/quic),
// the bulk path over it (transport/bulk: shared-memory rings, TCP, RDMA
// through transport/rdma), the relay under a sparse topology
// (transport/relay), and in-memory meshes for tests (transport/mem).
// Builder implements transport.Builder; what it returns is a
// transport.Mesh, whose path core drives and on whose parts core finds the
// optional capabilities (transport.Poller, Broadcaster, Forwarder,
// OnDemand, RingHolder) by type assertion, as net/http's callers find an
// http.Flusher. Adding a transport changes this package, not core.
//
// Why the builder is a value in core's Config (Config.Mesh) rather than a
// function core calls: core must not depend on the transports, and this
// package depends on all of them, so core cannot import it; the other way
// to reach it, a registry filled by an init function, is mutable state at
// package level, which the project keeps out. So whoever makes a
// communicator names the builder (cfg.Mesh = mesh.Builder{}), as an
// http.Server names its Handler. The package imports no core: it takes
// plain options (transport.MeshOptions) and reports to plain callbacks
// (transport.Receiver).
package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/bulk"
	"github.com/nexar-go/nexar/transport/mem"
	nquic "github.com/nexar-go/nexar/transport/quic"
	trdma "github.com/nexar-go/nexar/transport/rdma"
	"github.com/nexar-go/nexar/transport/relay"
)

// Builder makes QUIC meshes with the bulk path (and a relay under a
// sparse topology), and in-memory meshes for in-process ranks. The zero
// value is ready; it holds nothing.
type Builder struct{}

var _ transport.Builder = Builder{}

// The capabilities core looks for, checked where they are implemented.
var (
	_ transport.Poller      = (*bulk.Endpoint)(nil)
	_ transport.RingHolder  = (*bulk.Endpoint)(nil)
	_ transport.Poller      = (*relay.Endpoint)(nil)
	_ transport.Broadcaster = (*relay.Endpoint)(nil)
	_ transport.Forwarder   = (*relay.Endpoint)(nil)
	_ transport.OnDemand    = (*nquic.Node)(nil)
	_ transport.OnDemand    = (*listener)(nil)
)

// withDefaults fills in what o may leave out.
func withDefaults(o transport.MeshOptions) transport.MeshOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// dialFloor is the least time an on-demand dial may take before its peer
// counts as down (MeshOptions.Patience raises it).
const dialFloor = 10 * time.Second

// Listen makes this rank's TLS identity and binds its QUIC node.
func (Builder) Listen(o transport.MeshOptions) (transport.Listener, error) {
	o = withDefaults(o)
	mode, err := bulk.ParseMode(o.Bulk)
	if err != nil {
		return nil, &transport.SetupError{Err: err}
	}
	id, err := nquic.NewIdentity()
	if err != nil {
		return nil, &transport.SetupError{Err: err}
	}
	qo := nquic.Options{BindAddr: o.BindAddr}
	qo.IdleTimeout = max(nquic.DefaultIdleTimeout, o.Patience, o.WatchedIdle)
	if mode == bulk.ModeAuto || mode == bulk.ModeTCP {
		// The bulk path carries LaneData between hosts over TCP; QUIC
		// carries it only if that fails to set up, and one connection
		// per pair is then enough.
		qo.DataConns = 1
	}
	if o.Graph != nil {
		qo.Neighbors = o.Graph.IsNeighbor
	}
	if o.OnDemand > 0 {
		// A peer not reached within the heartbeat timeout (or the
		// handshake's 10 s, if longer) is down.
		qo.OnDemand, qo.DialTimeout = o.OnDemand, max(dialFloor, o.Patience)
	}
	qn, err := nquic.Listen(id, qo)
	if err != nil {
		return nil, &transport.SetupError{Err: fmt.Errorf("bind %s: %w", o.BindAddr, err)}
	}
	return &listener{Node: qn, o: o, mode: mode, id: id, qn: qn}, nil
}

// listener is the bound QUIC node (Addr, Close, and on demand
// transport.OnDemand: its methods are the node's).
type listener struct {
	*nquic.Node
	o    transport.MeshOptions
	mode bulk.Mode
	id   *nquic.Identity
	qn   *nquic.Node
}

func (l *listener) Fingerprint() [32]byte { return l.id.Fingerprint }

// Connect forms the QUIC mesh, then negotiates the bulk path over it; the
// relay, under a sparse topology, wraps the bulk path and starts once
// r.Formed accepted the mesh.
func (l *listener) Connect(ctx context.Context, rank int, peers []transport.Peer, advertise string, r transport.Receiver) (transport.Mesh, error) {
	o := l.o
	o.Rank = rank // Listen's may be -1: the seed chose
	h, down := r.Handle, r.Down
	var rl *relay.Endpoint
	if o.Graph != nil {
		rl = relay.New(o.Graph, o.Rank, r.Handle, r.Down, relay.Options{Lost: r.RelayLost, Linger: linger(o.Patience)})
		h, down = rl.Handler(), rl.DownHandler() // the bulk path delivers to the relay
	}
	closeRelay := func() {
		if rl != nil {
			rl.Close()
		}
	}
	bk, err := l.newBulk(o, peers, advertise, r.Place, h, down)
	if err != nil {
		closeRelay()
		return transport.Mesh{}, err
	}
	fail := func(err error) (transport.Mesh, error) {
		bk.Close()
		closeRelay()
		return transport.Mesh{}, err
	}
	ep, err := l.qn.Connect(ctx, o.Rank, peers, bk.Handler(), bk.DownHandler())
	if err != nil {
		return fail(fmt.Errorf("forming the mesh: %w", err))
	}
	if r.Forming != nil {
		r.Forming(ep)
	}
	if err := bk.Start(ctx, ep); err != nil {
		return fail(fmt.Errorf("negotiating the bulk data path: %w", err))
	}
	if r.Formed != nil {
		if err := r.Formed(); err != nil {
			return fail(err)
		}
	}
	m := transport.Mesh{Path: bk, Parts: []any{bk, l.qn}}
	if rl != nil {
		rl.Start(bk)
		m = transport.Mesh{Path: rl, Parts: []any{rl, bk, l.qn}}
	}
	return m, nil
}

// newBulk prepares the composite endpoint that carries LaneData over
// shared memory, TCP or RDMA and everything else over the QUIC mesh.
func (l *listener) newBulk(o transport.MeshOptions, peers []transport.Peer, advertise string, place transport.PlaceFunc, h transport.Handler, down transport.DownHandler) (*bulk.Endpoint, error) {
	fps := make([][32]byte, o.Size)
	for _, p := range peers {
		if p.Rank >= 0 && p.Rank < len(fps) {
			fps[p.Rank] = p.Fingerprint
		}
	}
	advHost, _, _ := net.SplitHostPort(advertise)
	bindHost, _, _ := net.SplitHostPort(o.BindAddr)
	if bindHost == "" {
		bindHost = "0.0.0.0" // ":port" asked for every interface
	}
	rd, err := openRDMA(o, l.mode)
	if err != nil {
		return nil, err
	}
	var peersOf func(int) bool // under a sparse topology: the neighbours (the relay carries the rest)
	if o.Graph != nil {
		peersOf = func(r int) bool { return o.Graph.IsNeighbor(o.Rank, r) }
	}
	bk, err := bulk.New(o.Rank, o.Size, bulk.Options{
		Mode: l.mode, Conns: o.BulkConns, Plaintext: o.BulkPlaintext,
		BindHost: bindHost, AdvertiseHost: advHost,
		Identity: l.id, Fingerprints: fps, Logger: o.Logger, Place: place, RemoteMin: o.BulkRemoteMin,
		RingSize: o.RingSize, RingBudget: o.RingBudget, RDMA: rd, Peers: peersOf, Forwards: peersOf != nil,
		RingTimeout: max(bulk.DefaultRingTimeout, o.Patience),
	}, h, down)
	if err != nil {
		if rd != nil {
			rd.Close()
		}
		return nil, &transport.SetupError{Err: err}
	}
	return bk, nil
}

// openRDMA opens the RDMA device for the bulk endpoint where the mode may
// use one: under "auto" its absence is no error (nil: no RDMA); under
// "rdma" it is.
//
// RDMA carries data in the clear, so "auto" uses it only where the job
// declared its network trusted (BulkPlaintext), as it must for plaintext
// TCP: nothing leaves a host unencrypted unless asked
// (docs/guides/security.md).
func openRDMA(o transport.MeshOptions, mode bulk.Mode) (bulk.RDMA, error) {
	if mode != bulk.ModeAuto && mode != bulk.ModeRDMA {
		return nil, nil
	}
	if mode == bulk.ModeAuto && !o.BulkPlaintext {
		o.Logger.Debug("nexar: RDMA not used: it is not encrypted; NEXAR_BULK_PLAINTEXT=1 or NEXAR_BULK=rdma allow it")
		return nil, nil
	}
	opt := o.RDMA
	opt.Logger = o.Logger
	opt.GPU = o.GPU
	d, err := trdma.Open(opt)
	if err != nil {
		if mode == bulk.ModeRDMA {
			return nil, &transport.SetupError{Err: errors.New("NEXAR_BULK=rdma, but " + err.Error()), Unavailable: true}
		}
		o.Logger.Debug("nexar: no RDMA data path", "err", err)
		return nil, nil
	}
	return d, nil
}

// linger is how long a closing rank relays for the others
// (relay.Options.Linger): less than the heartbeat timeout (patience),
// within which its neighbours, which no longer get its heartbeats, would
// declare it down.
func linger(patience time.Duration) time.Duration {
	return min(max(patience/2, time.Second), 10*time.Second)
}

// Local connects len(rs) ranks of this process in memory; under o.Graph
// each is a relay over an in-memory mesh that it uses between neighbours
// only.
func (Builder) Local(o transport.MeshOptions, rs []transport.Receiver) ([]transport.Mesh, error) {
	o = withDefaults(o)
	n := len(rs)
	hs := make([]transport.Handler, n)
	ds := make([]transport.DownHandler, n)
	out := make([]transport.Mesh, n)
	if o.Graph == nil {
		for i, r := range rs {
			hs[i], ds[i] = r.Handle, r.Down
		}
		for i, p := range mem.NewMesh(n, hs, ds) {
			out[i] = transport.Mesh{Path: p, Parts: []any{p}}
		}
		return out, nil
	}
	rls := make([]*relay.Endpoint, n)
	for i, r := range rs {
		rls[i] = relay.New(o.Graph, i, r.Handle, r.Down, relay.Options{Lost: r.RelayLost, Linger: linger(o.Patience)})
		hs[i], ds[i] = rls[i].Handler(), rls[i].DownHandler()
	}
	inner := mem.NewMeshLinked(n, hs, ds, o.Graph.IsNeighbor)
	for i, rl := range rls {
		rl.Start(inner[i])
		out[i] = transport.Mesh{Path: rl, Parts: []any{rl, inner[i]}}
	}
	return out, nil
}
