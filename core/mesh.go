package core

import (
	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// core names no concrete transport: Config.Mesh (a transport.Builder;
// package transport/mesh's Builder) assembles them, from the plain
// options below, into a transport.Mesh whose path the node drives and on
// whose parts worldComm finds the optional capabilities (transport.As).

// meshOptions is what the mesh builder takes of cfg (defaults filled in),
// under the sparse topology g (nil: none).
func meshOptions(cfg Config, g *topology.Graph) transport.MeshOptions {
	o := transport.MeshOptions{
		Rank: cfg.Rank, Size: cfg.WorldSize, BindAddr: cfg.BindAddr, Graph: g,
		Patience: cfg.HeartbeatTimeout,
		Bulk:     cfg.Bulk, BulkConns: cfg.BulkConns, BulkPlaintext: cfg.BulkPlaintext, BulkRemoteMin: cfg.BulkRemoteMin,
		RingSize: cfg.RingSize, RingBudget: cfg.RingBudget,
		RDMA: cfg.RDMA, GPU: cfg.GPU,
		Logger: cfg.Logger.With("subsys", SubsysNet),
	}
	if cfg.Topology.Kind == topology.OnDemand {
		// The bulk path negotiates with every peer it talks to when the
		// job forms, which on demand would open every connection: the
		// data goes on the QUIC connection of the moment (docs/scale.md).
		// A connection's keep-alives watch its peer, not heartbeats.
		o.OnDemand, o.Bulk = cfg.Topology.N, "off"
	} else {
		o.WatchedIdle = watchedIdle(cfg) // heartbeats judge silence (detector.go)
	}
	return o
}

// errNoMesh is New's error for a Config without a mesh builder.
func errNoMesh() error {
	return invalidArg("new", "Config.Mesh is nil: set it to mesh.Builder{} (package github.com/nexar-go/nexar/transport/mesh), which assembles the transports")
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
