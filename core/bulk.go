package core

import (
	"net"

	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/bulk"
	nquic "github.com/nexar-go/nexar/transport/quic"
	trdma "github.com/nexar-go/nexar/transport/rdma"
)

// quicOptions configures the QUIC mesh. Where the bulk path may use TCP
// between hosts, QUIC carries LaneData across hosts only if that fails to
// set up, so one connection per pair is enough; otherwise QUIC's default
// (several data connections to a peer on another host) applies.
func quicOptions(cfg Config) nquic.Options {
	o := nquic.Options{BindAddr: cfg.BindAddr}
	o.IdleTimeout = cfg.tolerated(nquic.DefaultIdleTimeout)
	if cfg.Topology.Kind != topology.OnDemand {
		o.IdleTimeout = max(o.IdleTimeout, watchedIdle(cfg)) // heartbeats judge silence (detector.go)
	}
	if mode, err := bulk.ParseMode(cfg.Bulk); err == nil && (mode == bulk.ModeAuto || mode == bulk.ModeTCP) {
		o.DataConns = 1
	}
	return o
}

// newBulk prepares the composite endpoint that carries LaneData over shared
// memory or parallel TCP and everything else over the QUIC mesh.
// down serves the layer above in place of nd.onDown.
func newBulk(cfg Config, rank int, adv string, id *nquic.Identity, peers []nquic.Peer, nd *node, down transport.DownHandler) (*bulk.Endpoint, error) {
	mode, err := bulk.ParseMode(cfg.Bulk)
	if err != nil {
		return nil, invalidArg("new", "%v", err)
	}
	fps := make([][32]byte, cfg.WorldSize)
	for _, p := range peers {
		if p.Rank >= 0 && p.Rank < len(fps) {
			fps[p.Rank] = p.Fingerprint
		}
	}
	advHost, _, _ := net.SplitHostPort(adv)
	bindHost, _, _ := net.SplitHostPort(cfg.BindAddr)
	if bindHost == "" {
		bindHost = "0.0.0.0" // ":port" asked for every interface
	}
	rd, err := openRDMA(cfg, mode)
	if err != nil {
		return nil, err
	}
	var peersOf func(int) bool // under a sparse topology: the neighbours (the relay carries the rest)
	if nd.graph != nil {
		peersOf = func(r int) bool { return nd.graph.IsNeighbor(rank, r) }
	}
	bk, err := bulk.New(rank, cfg.WorldSize, bulk.Options{
		Mode: mode, Conns: cfg.BulkConns, Plaintext: cfg.BulkPlaintext,
		BindHost: bindHost, AdvertiseHost: advHost,
		Identity: id, Fingerprints: fps, Logger: cfg.Logger.With("subsys", SubsysNet), Place: nd.place, RemoteMin: cfg.BulkRemoteMin,
		RingSize: cfg.RingSize, RingBudget: cfg.RingBudget, RDMA: rd, Peers: peersOf, Forwards: peersOf != nil,
		RingTimeout: cfg.tolerated(bulk.DefaultRingTimeout),
	}, nd.bulkHandler(), down)
	if err != nil {
		if rd != nil {
			rd.Close()
		}
		return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
	}
	return bk, nil
}

// openRDMA opens the RDMA device for the bulk endpoint (transport/rdma;
// Config.RDMA: NEXAR_IBVERBS, NEXAR_IB_HCA, NEXAR_IB_GID_INDEX) where the mode may use
// one: under "auto" its absence is no error (nil: no RDMA); under "rdma" it
// is.
//
// RDMA carries data in the clear, so "auto" uses it only where the job
// declared its network trusted (BulkPlaintext), as it must for plaintext
// TCP: nothing leaves a host unencrypted unless asked (docs/guides/security.md).
func openRDMA(cfg Config, mode bulk.Mode) (bulk.RDMA, error) {
	if mode != bulk.ModeAuto && mode != bulk.ModeRDMA {
		return nil, nil
	}
	if mode == bulk.ModeAuto && !cfg.BulkPlaintext {
		cfg.Logger.Debug("nexar: RDMA not used: it is not encrypted; NEXAR_BULK_PLAINTEXT=1 or NEXAR_BULK=rdma allow it", "subsys", SubsysNet)
		return nil, nil
	}
	opt := cfg.RDMA
	opt.Logger = cfg.Logger.With("subsys", SubsysNet)
	opt.GPU = cfg.GPU
	d, err := trdma.Open(opt)
	if err != nil {
		if mode == bulk.ModeRDMA {
			return nil, &Error{Code: CodeUnavailable, Op: "new", Rank: -1, Msg: "NEXAR_BULK=rdma, but " + err.Error(), Cause: err}
		}
		cfg.Logger.Debug("nexar: no RDMA data path", "subsys", SubsysNet, "err", err)
		return nil, nil
	}
	return d, nil
}

// Paths says which path carries this rank's data to each member of c, by
// comm rank: e.g. "shm 8 MiB ring", "tcp x2 tls", "rdma mlx5_0:1 roce v2",
// "quic", "mem" (NewLocal)
// or "loopback" for c's own rank.
func (c *Comm) Paths() map[int]string {
	wp := c.n.ep.Paths()
	m := make(map[int]string, len(c.world))
	for r, w := range c.world {
		switch {
		case w == c.n.rank:
			m[r] = "loopback"
		case wp[w] != "":
			m[r] = wp[w]
		default:
			m[r] = "mem"
		}
	}
	return m
}
