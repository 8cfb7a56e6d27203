package core

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/internal/hostid"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// Sparse topologies (Config.Topology, docs/scale.md). Under one, a node
// heartbeats and watches its neighbours only, a failure it detects (or
// hears of) is passed on to its neighbours (ctlFailed: flooding, once per
// rank and node, so every live rank hears in at most the graph's diameter
// of hops), and its endpoint is the relaying path the mesh builder makes
// (transport/relay), which carries messages for non-neighbours through
// neighbours. The full mesh keeps the
// direct behaviour: every rank watches every other itself.

// ctlFailed (node level, comm 0, LaneControl, to neighbours only): the
// sender learned that a rank is down. Payload: the failed world rank and
// the rank that detected it (int32 each, little-endian), then the
// detector's reason (UTF-8). Numbered apart from the communicator-level
// subtypes so that new ones do not collide.
const ctlFailed uint8 = 32

// topologyGraph returns the graph of a sparse topology over size ranks,
// nil for one where every pair talks directly.
func topologyGraph(spec topology.Spec, size int) (*topology.Graph, error) {
	if err := spec.Validate(); err != nil {
		return nil, invalidArg("new", "Config.Topology: %v", err)
	}
	if !spec.Sparse(size) { // the full mesh, or on demand (routes are the full mesh's)
		return nil, nil
	}
	g, err := topology.New(spec, size)
	if err != nil {
		return nil, invalidArg("new", "Config.Topology: %v", err)
	}
	return g, nil
}

// watched returns the ranks this node heartbeats and watches: its
// neighbours under a sparse topology, none on demand (a connection's
// keep-alives and idle timeout watch a peer while it is open, a dial that
// fails finds one that died meanwhile), else every other rank.
func (n *node) watched() []int {
	if n.onDemand != nil {
		return nil
	}
	if n.graph != nil {
		return n.graph.Neighbors(n.rank)
	}
	out := make([]int, 0, n.size-1)
	for p := 0; p < n.size; p++ {
		if p != n.rank {
			out = append(out, p)
		}
	}
	return out
}

// watches reports whether the monitor checks world rank p's silence.
func (n *node) watches(p int) bool {
	return p != n.rank && n.onDemand == nil && (n.graph == nil || n.graph.IsNeighbor(n.rank, p))
}

// onDemand checks Config.Topology's "ondemand:M" where connections are
// made: over QUIC, whose connections open and close; the in-memory mesh of
// NewLocal has none to bound.
func onDemand(cfg Config, size int, local bool) error {
	if cfg.Topology.Kind != topology.OnDemand || size == 1 || !local {
		return nil
	}
	return invalidArg("new", "Config.Topology %s: connections on demand need QUIC (New, NewLocalQUIC); NewLocal's in-memory mesh has no connections to bound", cfg.Topology)
}

// connectedOnDemand reports whether a message to world rank p goes on a
// connection open now; false when p's connection is closed on demand (a
// goodbye or notice that is not needed then would open one).
func (n *node) connectedOnDemand(p int) bool {
	return n.onDemand == nil || n.onDemand.Connected(p)
}

// gossipFailedLocked tells the neighbours, in the background, that world
// rank p is down (detected by rank by, for why: by's own reason). Called with n.mu held,
// once per p (peerDown's guard), so the flood ends.
func (n *node) gossipFailedLocked(p, by int, why string) {
	n.noteDownLocked(p)
	if n.graph == nil || n.ep == nil {
		return
	}
	if by == n.rank && n.stalledFor(time.Now()) > 0 {
		return // this rank was stopped: its neighbours' silence says nothing to pass on
	}
	payload := make([]byte, 8, 8+len(why))
	binary.LittleEndian.PutUint32(payload, uint32(p))
	binary.LittleEndian.PutUint32(payload[4:], uint32(by))
	payload = append(payload, truncate(why, 512)...)
	var th transport.Header
	(&header{kind: kindControl, sub: ctlFailed, total: uint64(len(payload))}).encode(&th, n.view.Gen)
	var to []int
	for _, q := range n.graph.Neighbors(n.rank) {
		if q != p && n.down[q] == nil && n.left[q] == nil {
			to = append(to, q)
		}
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for _, q := range to {
			ctx, cancel := context.WithTimeout(n.life, n.cfg.HeartbeatTimeout)
			_ = n.ep.Send(ctx, q, transport.LaneControl, &th, payload)
			cancel()
		}
	}()
}

// failedNotice takes a neighbour's ctlFailed: the rank it names is down
// here too (and the notice goes on), naming the rank that detected it.
func (n *node) failedNotice(from int, payload []byte) {
	if len(payload) < 8 {
		return
	}
	p := int(int32(binary.LittleEndian.Uint32(payload)))
	by := int(int32(binary.LittleEndian.Uint32(payload[4:])))
	if p < 0 || p >= n.size || p == n.rank {
		return // about this rank: its detector tells it directly (ctlDeclaredDown)
	}
	found := string(payload[8:]) // passed on as it came, so that it does not nest per hop
	n.peerDownBy(p, by, found, fmt.Sprintf("rank %d found it unreachable (%s), rank %d passed it on", by, found, from), nil)
}

// relayLost is the relay's report that messages from world rank src were
// lost when relay via failed: every communicator with src fails, naming
// via (its rank in the communicator when it is a member).
//
// A communicator registered after this rank knew via was down sent nothing
// through it (every member had routed around via before it could agree on
// the communicator: a shrunk successor), so it is spared; with via unknown,
// or not yet known down here, every communicator with src fails.
func (n *node) relayLost(src, via int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.comms {
		r, ok := c.rankOfWorld(src)
		if !ok || src == n.rank {
			continue
		}
		if via >= 0 && via < n.size && n.down[via] != nil && n.topo.born[c.id] >= n.topo.downAt[via] {
			continue
		}
		rank := -1
		if vr, ok := c.rankOfWorld(via); ok {
			rank = vr
		}
		c.fail(&Error{Code: CodePeerDown, Op: "comm", Rank: rank,
			Msg: fmt.Sprintf("messages from rank %d were lost when world rank %d, a relay on their route, failed", r, via)})
	}
}

// topoState is the node's record, under node.mu, of when communicators
// were registered and ranks declared down, counted in failures learned
// (relayLost spares communicators made after the failure it reports).
type topoState struct {
	failures uint64
	downAt   map[int]uint64    // world rank -> failures counted when it went down
	born     map[uint64]uint64 // communicator id -> failures counted at registration
}

// noteDownLocked records that world rank p was declared down. Called with
// n.mu held.
func (n *node) noteDownLocked(p int) {
	if n.topo.downAt == nil {
		n.topo.downAt = map[int]uint64{}
	}
	n.topo.failures++
	n.topo.downAt[p] = n.topo.failures
}

// noteRegisteredLocked records c's registration. Called with n.mu held.
func (n *node) noteRegisteredLocked(c *Comm) {
	if n.graph == nil {
		return
	}
	if n.topo.born == nil {
		n.topo.born = map[uint64]uint64{}
	}
	n.topo.born[c.id] = n.topo.failures
}

// byeByCast reports whether a goodbye to world rank w goes in the relay's
// broadcast (transport.Broadcaster: transport/relay/cast.go): w is no neighbour and this node
// relayed nothing to it, so no message of this rank is on a route to w for
// the goodbye to stay behind. One broadcast costs N-1 one-hop sends where
// relaying to every member costs the sum of their distances: with every
// rank closing at once, O(N^2) relayed hops in all.
func (n *node) byeByCast(w int) bool {
	return n.cast != nil && !n.graph.IsNeighbor(n.rank, w) && !n.cast.Talked(w)
}

// byeSkipped reports whether a goodbye to world rank w is left out: on
// demand, where this rank has no connection to w. What it sent w went on a
// connection that was closed, so it was delivered; w learns of the
// departure when it next dials this rank (which fails: the rank is gone).
func (n *node) byeSkipped(w int) bool { return !n.connectedOnDemand(w) }

// connections is how many other ranks this node talks to directly now
// (Stats.Connections).
func (n *node) connections() int {
	switch {
	case n.onDemand != nil:
		open, _ := n.onDemand.OpenConns()
		return open
	case n.graph != nil:
		return len(n.graph.Neighbors(n.rank))
	}
	return n.size - 1
}

// relayedBytes is the payload this node forwarded for other ranks.
func (n *node) relayedBytes() int64 {
	if n.fwd == nil {
		return 0
	}
	return n.fwd.ForwardedBytes()
}

// joinOptions is what the seed checks that every rank agrees on, the
// topology ("" for the full mesh, as a joiner that predates topologies
// sends), and the rendezvous link's idle timeout (Config.tolerated).
func joinOptions(cfg Config) membership.JoinOptions {
	var o membership.JoinOptions
	o.IdleTimeout = cfg.tolerated(membership.IdleTimeout)
	if cfg.Topology != (topology.Spec{}) {
		o.Topology = cfg.Topology.String()
	}
	o.Host = hostKey(cfg)
	return o
}

// hostKey names this rank's host to the others, through the seed: equal
// keys put ranks on one host for the host-aware schedules
// (collective.HostMap). Config.HierHostID where set (tests simulate hosts
// with it), else this host and boot (internal/hostid), the identity the
// shared-memory path trusts.
func hostKey(cfg Config) string {
	if cfg.HierHostID != "" {
		return cfg.HierHostID
	}
	return hostid.Local()
}

// hostKeys returns every world rank's host key from the seed's table, nil
// when some rank did not send one (a peer built before keys existed).
func hostKeys(peers []transport.Peer) []string {
	keys := make([]string, len(peers))
	for i, p := range peers {
		if p.Host == "" {
			return nil
		}
		keys[i] = p.Host
	}
	return keys
}

// hosts is the collective.HostMap of a communicator of the world ranks
// world, nil where its ranks all run on one host or the hosts are unknown.
func (n *node) hosts(world []int) *collective.HostMap {
	if n.hostKeys == nil || len(world) < 3 {
		return nil
	}
	keys := make([]string, len(world))
	for i, w := range world {
		keys[i] = n.hostKeys[w]
	}
	h := collective.NewHostMap(keys)
	if h.Hosts() < 2 {
		return nil
	}
	return h
}

// parseSchedules reads Config.Schedules: nil for "fit" (or "": the
// topology's graph), a zero Spec for "rank", else the topology named.
func parseSchedules(v string) (*topology.Spec, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "fit":
		return nil, nil
	case "rank":
		return &topology.Spec{}, nil
	}
	s, err := topology.Parse(v)
	if err != nil {
		return nil, fmt.Errorf("%q: want fit, rank or a topology: %v", v, err)
	}
	return &s, nil
}

// scheduleGraph resolves cfg.Schedules over size ranks whose connection
// graph is topo (nil: full mesh): the graph the schedules fit, nil for
// rank order.
func scheduleGraph(cfg Config, topo *topology.Graph, size int) (*topology.Graph, error) {
	s, err := parseSchedules(cfg.Schedules)
	if err != nil {
		return nil, invalidArg("new", "Config.Schedules: %v", err)
	}
	if s == nil {
		return topo, nil
	}
	if !s.Sparse(size) {
		return nil, nil
	}
	g, err := topology.New(*s, size)
	if err != nil {
		return nil, invalidArg("new", "Config.Schedules: %v", err)
	}
	return g, nil
}

// layout is the collective.Layout of a communicator of the world ranks
// world over n.sched, nil for rank order.
func (n *node) layout(world []int) collective.Layout {
	if n.sched == nil || len(world) < 3 {
		return nil
	}
	return newCommLayout(n.sched, world)
}

// commLayout fits a communicator's schedules to the graph its members sit
// on (collective.Layout; comm ranks throughout): the graph's ring with the
// non-members left out, breadth-first trees over the edges between members
// (a member the others do not reach hangs from the root: that edge is
// relayed), and whether the members form a cube. Safe for concurrent use.
type commLayout struct {
	g      *topology.Graph
	world  []int       // comm rank -> world rank
	of     map[int]int // world rank -> comm rank
	ring   []int
	cube   bool
	digest uint64

	mu    sync.Mutex
	trees *simplelru.LRU[int, *layoutTree] // by root: collectives mostly reuse a few
}

type layoutTree struct {
	parent   []int
	children [][]int
}

// layoutTrees is how many trees (by root) a communicator keeps: each is
// two slices of its size.
const layoutTrees = 8

func newCommLayout(g *topology.Graph, world []int) *commLayout {
	l := &commLayout{g: g, world: world, of: make(map[int]int, len(world))}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d:", g.Spec(), g.Size())
	for r, w := range world {
		l.of[w] = r
		binary.Write(h, binary.LittleEndian, int32(w))
	}
	l.digest = h.Sum64()
	for _, w := range g.Ring() {
		if r, ok := l.of[w]; ok {
			l.ring = append(l.ring, r)
		}
	}
	n := len(world)
	l.cube = n&(n-1) == 0
	for r := 0; r < n && l.cube; r++ {
		for b := 1; b < n; b <<= 1 {
			if !g.IsNeighbor(world[r], world[r^b]) {
				l.cube = false
				break
			}
		}
	}
	l.trees, _ = simplelru.NewLRU[int, *layoutTree](layoutTrees, nil)
	return l
}

func (l *commLayout) Ring() []int    { return l.ring }
func (l *commLayout) Cube() bool     { return l.cube }
func (l *commLayout) Digest() uint64 { return l.digest }

func (l *commLayout) Tree(root, rank int) (int, []int) {
	l.mu.Lock()
	t, ok := l.trees.Get(root)
	if !ok {
		t = l.tree(root)
		l.trees.Add(root, t)
	}
	l.mu.Unlock()
	return t.parent[rank], t.children[rank]
}

// tree is the breadth-first tree from root over the edges between members.
func (l *commLayout) tree(root int) *layoutTree {
	n := len(l.world)
	t := &layoutTree{parent: make([]int, n), children: make([][]int, n)}
	for i := range t.parent {
		t.parent[i] = -2
	}
	t.parent[root] = -1
	queue := make([]int, 0, n)
	visit := func(at, r int) {
		t.parent[r] = at
		t.children[at] = append(t.children[at], r)
		queue = append(queue, r)
	}
	queue = append(queue, root)
	for start := 0; ; {
		for ; start < len(queue); start++ {
			at := queue[start]
			for _, w := range l.g.Neighbors(l.world[at]) {
				if r, ok := l.of[w]; ok && t.parent[r] == -2 {
					visit(at, r)
				}
			}
		}
		if len(queue) == n {
			return t
		}
		for r := range n { // a member the edges between members do not reach
			if t.parent[r] == -2 {
				visit(root, r)
				break
			}
		}
	}
}
