package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/internal/race"
	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport/bulk"
	"github.com/nexar-go/nexar/transport/mem"
	"github.com/nexar-go/nexar/transport/relay"
)

var sparseSpecs = []topology.Spec{{Kind: topology.KRegular, N: 2}, {Kind: topology.KRegular, N: 4}, {Kind: topology.Hypercube}}

func topoWorlds() []int {
	if os.Getenv("NEXAR_TEST_QUICK") == "1" || testing.Short() {
		return []int{2, 3, 5, 8, 13, 16, 31, 64}
	}
	ws := make([]int, 0, 63)
	for n := 2; n <= 64; n++ {
		ws = append(ws, n)
	}
	return ws
}

func newLocalTopo(t testing.TB, n int, spec topology.Spec) []*Comm {
	t.Helper()
	cfg := topoTestConfig()
	cfg.Topology = spec
	comms, err := testNewLocal(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return comms
}

// fval is an input whose float32 sums depend on the order of addition.
func fval(r, i int) float32 {
	return float32(math.Sin(float64(r*7919+i*104729))) * float32(1+(r+i)%13) * 1e3
}

func fill(r, n int) []byte {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		copy(b[4*i:], f32s(fval(r, i)))
	}
	return b
}

// runEveryCollective runs each collective (and Barrier) once and returns,
// per rank, everything it received, in call order.
func runEveryCollective(t *testing.T, comms []*Comm) [][]byte {
	n := len(comms)
	// All of them take 5-8 s at 64 ranks under -race beside another
	// package's race tests; once, in make test, they did not end within
	// 60 s (docs/scale.md, Limits).
	const bound = 3 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	// Shortly before the bound, say where every rank is: the step each
	// finished last and the goroutines' stacks, grouped. The one overrun
	// seen so far left nothing to tell a stall from a slow machine.
	done := make([]atomic.Pointer[string], n)
	dumped := make(chan struct{})
	watch := time.AfterFunc(bound-10*time.Second, func() {
		defer close(dumped)
		dumpProgress(t, done)
	})
	defer func() {
		if !watch.Stop() {
			<-dumped // no t.Log after the test has ended
		}
	}()
	out := make([][]byte, n)
	errs := each(comms, func(c *Comm) error {
		r := c.Rank()
		var acc bytes.Buffer
		step := func(name string, err error, got ...[]byte) error {
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			done[r].Store(&name)
			for _, g := range got {
				acc.Write(g)
			}
			return nil
		}
		f32 := collective.Float32
		for _, count := range []int{3, 70000} { // 70000 floats: above the ring threshold
			recv := make([]byte, 4*count)
			if err := step("allreduce", c.Allreduce(ctx, fill(r, count), recv, f32, collective.Sum), recv); err != nil {
				return err
			}
		}
		const k = 5
		buf := fill(r, k)
		if err := step("broadcast", c.Broadcast(ctx, buf, f32, n-1), buf); err != nil {
			return err
		}
		red := make([]byte, 4*k)
		if err := step("reduce", c.Reduce(ctx, fill(r, k), red, f32, collective.Sum, n/2), red); err != nil {
			return err
		}
		ag := make([]byte, 4*k*n)
		if err := step("allgather", c.Allgather(ctx, fill(r, k), ag, f32), ag); err != nil {
			return err
		}
		counts, displs, total := make([]int, n), make([]int, n), 0
		for i := range counts {
			counts[i], displs[i] = 1+i%3, total
			total += counts[i]
		}
		agv := make([]byte, 4*total)
		if err := step("allgatherv", c.Allgatherv(ctx, fill(r, counts[r]), agv, counts, displs, f32), agv); err != nil {
			return err
		}
		rs := make([]byte, 4*k)
		if err := step("reducescatter", c.ReduceScatter(ctx, fill(r, k*n), rs, f32, collective.Sum), rs); err != nil {
			return err
		}
		a2a := make([]byte, 4*k*n)
		if err := step("alltoall", c.Alltoall(ctx, fill(r, k*n), a2a, f32), a2a); err != nil {
			return err
		}
		a2av := make([]byte, 4*total)
		sd, sc := make([]int, n), make([]int, n)
		for j := range sd {
			sc[j], sd[j] = counts[r], j*counts[r]
		}
		rc, rd := make([]int, n), make([]int, n)
		for j := range rc {
			rc[j], rd[j] = counts[j], displs[j]
		}
		if err := step("alltoallv", c.Alltoallv(ctx, fill(r, counts[r]*n), sc, sd, a2av, rc, rd, f32), a2av); err != nil {
			return err
		}
		var g []byte
		if r == 0 {
			g = make([]byte, 4*k*n)
		}
		if err := step("gather", c.Gather(ctx, fill(r, k), g, f32, 0), g); err != nil {
			return err
		}
		var gv []byte
		if r == 1%n {
			gv = make([]byte, 4*total)
		}
		if err := step("gatherv", c.Gatherv(ctx, fill(r, counts[r]), gv, counts, displs, f32, 1%n), gv); err != nil {
			return err
		}
		var ss []byte
		if r == n-1 {
			ss = fill(r, k*n)
		}
		sr := make([]byte, 4*k)
		if err := step("scatter", c.Scatter(ctx, ss, sr, f32, n-1), sr); err != nil {
			return err
		}
		var svs []byte
		if r == 0 {
			svs = fill(r, total)
		}
		svr := make([]byte, 4*counts[r])
		if err := step("scatterv", c.Scatterv(ctx, svs, counts, displs, svr, f32, 0), svr); err != nil {
			return err
		}
		sc1 := make([]byte, 4*k)
		if err := step("scan", c.Scan(ctx, fill(r, k), sc1, f32, collective.Sum), sc1); err != nil {
			return err
		}
		ex := make([]byte, 4*k)
		if err := step("exscan", c.Exscan(ctx, fill(r, k), ex, f32, collective.Sum), ex); err != nil {
			return err
		}
		if err := step("barrier", c.Barrier(ctx)); err != nil {
			return err
		}
		out[r] = acc.Bytes()
		return nil
	})
	mustAll(t, errs)
	return out
}

// dumpProgress logs, per step, the ranks whose last finished step it is
// (ranks still in the first allreduce show as "none"), then every
// goroutine's stack, identical stacks counted once.
func dumpProgress(t *testing.T, done []atomic.Pointer[string]) {
	at := map[string][]int{}
	for r := range done {
		name := "none"
		if p := done[r].Load(); p != nil {
			name = *p
		}
		at[name] = append(at[name], r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "runEveryCollective near its bound; last step finished, by rank:")
	names := make([]string, 0, len(at))
	for name := range at {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(&b, "\n  %s: %v", name, at[name])
	}
	b.WriteString("\ngoroutines:\n")
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	t.Log(b.String())
}

// Every collective over every sparse topology, world 2-64 in memory, gives
// bit for bit what the full mesh gives with the same schedules: the
// topology's graph-fitted ones (Config.Schedules "fit", the default, against
// a full mesh told to fit that graph), and rank order ("rank", against the
// full mesh's default, for one topology per world size).
func TestTopologyCollectivesMatchFullMesh(t *testing.T) {
	run := func(n int, spec topology.Spec, schedules string) ([][]byte, int64) {
		cfg := topoTestConfig()
		cfg.Topology, cfg.Schedules = spec, schedules
		// One collective of 39 ranks under -race took over testConfig's
		// 20 s while make test ran another package's race tests beside
		// these; this test is about results, not timeouts.
		cfg.Timeout = 2 * time.Minute
		comms, err := testNewLocal(n, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := runEveryCollective(t, comms)
		var relayed int64
		for _, c := range comms {
			relayed += c.Stats().RelayedBytes
		}
		closeAll(t, comms)
		return got, relayed
	}
	same := func(what string, got, want [][]byte) {
		t.Helper()
		for r := range want {
			if !bytes.Equal(got[r], want[r]) {
				t.Fatalf("%s: rank %d's results differ", what, r)
			}
		}
	}
	for _, n := range topoWorlds() {
		rankOrder, _ := run(n, topology.Spec{}, "")
		for i, spec := range sparseSpecs {
			got, relayed := run(n, spec, "")
			want := rankOrder
			if spec.Sparse(n) {
				want, _ = run(n, topology.Spec{}, spec.String())
			}
			same(fmt.Sprintf("world %d, %s, fitted schedules against the full mesh with the same", n, spec), got, want)
			if spec.Sparse(n) && n > 4 && relayed == 0 {
				t.Fatalf("world %d, %s: nothing was relayed", n, spec)
			}
			if i == n%len(sparseSpecs) {
				got, _ = run(n, spec, "rank")
				same(fmt.Sprintf("world %d, %s, rank-order schedules against the full mesh's", n, spec), got, rankOrder)
			}
		}
	}
}

// topoTestConfig is newLocalTopo's configuration.
func topoTestConfig() Config {
	cfg := testConfig()
	// 64 ranks under -race on a loaded machine can starve a heartbeat
	// loop for seconds, and one collective of every schedule took more
	// than testConfig's 20 s with a core taken by another process; these
	// tests are not about failure detection or deadlines.
	cfg.HeartbeatTimeout = time.Minute
	cfg.Timeout = time.Minute
	return cfg
}

// The graph-fitted schedules relay nothing where the graph allows: allreduce
// (small and large), broadcast, reduce, reduce-scatter and the ring
// allgather on a hypercube of 2^k ranks (recursive doubling, the Gray code
// ring, trees) and on a ring lattice (its own ring, trees). In rank order
// ("rank") the same calls relay. (The barrier, an allgather of signatures
// by Bruck's algorithm, relays its few bytes.)
func TestTopologySchedulesRelayNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		spec topology.Spec
		n    int
	}{{topology.Spec{Kind: topology.Hypercube}, 16}, {topology.Spec{Kind: topology.KRegular, N: 4}, 13}, {topology.Spec{Kind: topology.KRegular, N: 2}, 16}} {
		relayed := map[string]int64{}
		for _, schedules := range []string{"fit", "rank"} {
			cfg := topoTestConfig()
			cfg.Topology, cfg.Schedules = tc.spec, schedules
			comms, err := testNewLocal(tc.n, cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := tc.n
			mustAll(t, each(comms, func(c *Comm) error {
				f32 := collective.Float32
				for _, count := range []int{2, 1 << 18} { // 8 B and 1 MiB
					if err := c.Allreduce(ctx, make([]byte, 4*count), make([]byte, 4*count), f32, collective.Sum); err != nil {
						return err
					}
					if err := c.Broadcast(ctx, make([]byte, 4*count), f32, n/2); err != nil {
						return err
					}
				}
				if err := c.Reduce(ctx, make([]byte, 64), make([]byte, 64), f32, collective.Sum, n-1); err != nil {
					return err
				}
				if err := c.ReduceScatter(ctx, make([]byte, 4*n*4096), make([]byte, 4*4096), f32, collective.Sum); err != nil {
					return err
				}
				return c.Allgather(ctx, make([]byte, 64<<10), make([]byte, n*64<<10), f32)
			}))
			for _, c := range comms {
				relayed[schedules] += c.Stats().RelayedBytes
			}
			closeAll(t, comms)
		}
		t.Logf("%s, %d ranks: relayed %d bytes with fitted schedules, %d in rank order", tc.spec, tc.n, relayed["fit"], relayed["rank"])
		if relayed["fit"] != 0 {
			t.Errorf("%s, %d ranks: graph-fitted schedules relayed %d bytes, want 0", tc.spec, tc.n, relayed["fit"])
		}
		if relayed["rank"] == 0 && tc.spec.Kind == topology.Hypercube {
			t.Errorf("%s, %d ranks: rank-order schedules relayed nothing: the check cannot fail", tc.spec, tc.n)
		}
	}
}

// Point-to-point between non-neighbours: tags received out of order and
// any-source receives.
func TestTopologyP2PNonNeighbours(t *testing.T) {
	const n = 16
	comms := newLocalTopo(t, n, topology.Spec{Kind: topology.KRegular, N: 2})
	defer closeAll(t, comms)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const far = n / 2 // 4 hops on a ring of 16 with K=2
	errs := each(comms, func(c *Comm) error {
		r := c.Rank()
		peer := (r + far) % n
		for tag := uint64(0); tag < 4; tag++ {
			if req := c.ISend(fill(r*10+int(tag), 100), peer, tag); req == nil {
				return errors.New("nil request")
			}
		}
		from := (r - far + n) % n
		for _, tag := range []uint64{3, 1, 0, 2} { // out of order
			buf := make([]byte, 400)
			if _, err := c.Recv(ctx, buf, from, tag); err != nil {
				return err
			}
			if !bytes.Equal(buf, fill(from*10+int(tag), 100)) {
				return fmt.Errorf("tag %d from %d: wrong data", tag, from)
			}
		}
		// Any source: rank 0 collects one message from every other rank.
		if r != 0 {
			return c.Send(ctx, fill(r, 8), 0, 77)
		}
		seen := map[int]bool{}
		for range n - 1 {
			buf := make([]byte, 32)
			st, err := c.Recv(ctx, buf, AnySource, 77)
			if err != nil {
				return err
			}
			if seen[st.Source] || !bytes.Equal(buf, fill(st.Source, 8)) {
				return fmt.Errorf("any-source: %d twice or wrong data", st.Source)
			}
			seen[st.Source] = true
		}
		return nil
	})
	mustAll(t, errs)
}

// A relay that stops (no heartbeats, no delivery) is found by its
// neighbours and the failure spreads by gossip: every other rank's
// communicator fails naming it, never one of the ranks routed through it.
func TestTopologyRelayFailureNamesDeadRank(t *testing.T) {
	const n, dead = 12, 3
	cfg := testConfig()
	// The dead rank's neighbours learn of it from its connections (Kill);
	// a short timeout would only let a starved live rank be declared down.
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, 10*time.Second
	cfg.Topology = topology.Spec{Kind: topology.KRegular, N: 2}
	comms, err := testNewLocal(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	mem.Kill(innerOf(comms[dead]))
	comms[dead].n.freeze()
	var wg sync.WaitGroup
	for r, c := range comms {
		if r == dead {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			select {
			case <-c.failed:
			case <-ctx.Done():
				t.Errorf("rank %d: not failed within 10 s", r)
				return
			}
			var e *Error
			if err := c.Err(); !errors.As(err, &e) || e.Code != CodePeerDown || e.Rank != dead {
				t.Errorf("rank %d: failed with %v, want CodePeerDown naming rank %d", r, err, dead)
			}
			if r != dead-1 && r != dead+1 && !strings.Contains(c.Err().Error(), "passed it on") {
				t.Errorf("rank %d (not a neighbour of %d): %v, want it learned by gossip", r, dead, c.Err())
			}
			// Each hop passes the detector's reason on, not the
			// message it made of it (which nested once per hop).
			if k := strings.Count(c.Err().Error(), "found it unreachable"); k > 1 {
				t.Errorf("rank %d: the reason nests %d times: %v", r, k, c.Err())
			}
		}()
	}
	wg.Wait()
	comms[dead].n.thaw()
}

// innerOf is the in-memory endpoint under c's relay (tests kill it).
func innerOf(c *Comm) *mem.Endpoint { return c.n.ep.(*relay.Endpoint).Inner().(*mem.Endpoint) }

func TestTopologyConfig(t *testing.T) {
	env := map[string]string{"NEXAR_RANK": "0", "NEXAR_WORLD_SIZE": "4", "NEXAR_SEED": "127.0.0.1:1", "NEXAR_TOKEN": "x"}
	look := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	env["NEXAR_TOPOLOGY"] = "kregular:8"
	cfg, err := ConfigFromLookup(look)
	if err != nil || cfg.Topology != (topology.Spec{Kind: topology.KRegular, N: 8}) {
		t.Fatalf("kregular:8: %v, %v", cfg.Topology, err)
	}
	env["NEXAR_TOPOLOGY"] = "torus:3"
	if _, err := ConfigFromLookup(look); err == nil || !strings.Contains(err.Error(), `"torus:3"`) || !strings.Contains(err.Error(), "NEXAR_TOPOLOGY") {
		t.Fatalf("bad topology: %v, want an error naming NEXAR_TOPOLOGY and the value", err)
	}
	bad := testConfig()
	bad.Topology = topology.Spec{Kind: topology.KRegular, N: 3}
	if _, err := testNewLocal(4, bad); CodeOf(err) != CodeInvalidArgument {
		t.Fatalf("NewLocal with kregular:3: %v, want CodeInvalidArgument", err)
	}
	bad.Topology = topology.Spec{Kind: topology.OnDemand, N: 4}
	if _, err := testNewLocal(8, bad); CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), "ondemand:4") {
		t.Fatalf("NewLocal with ondemand:4: %v, want CodeInvalidArgument naming it (not built)", err)
	}
}

// Real QUIC on loopback: a sparse mesh dials its neighbours only, relays
// the rest, and every collective gives the full mesh's bits.
func TestTopologyQUIC(t *testing.T) {
	n := 9
	if testing.Short() || race.Enabled {
		n = 4 // QUIC's handshakes under -race starve the rendezvous links of larger worlds here
	}
	for _, spec := range []topology.Spec{{Kind: topology.KRegular, N: 2}, {Kind: topology.Hypercube}} {
		// The same schedules on the in-memory full mesh give the bits.
		fcfg := topoTestConfig()
		fcfg.Schedules = spec.String()
		full, err := testNewLocal(n, fcfg)
		if err != nil {
			t.Fatal(err)
		}
		want := runEveryCollective(t, full)
		closeAll(t, full)
		cfg := testConfig()
		cfg.Topology = spec
		comms, err := testNewLocalQUIC(n, cfg)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		g, _ := topology.New(spec, n)
		got := runEveryCollective(t, comms)
		shmHere, _, _ := bulk.Available()
		for r, c := range comms {
			paths := c.Paths()
			for p := 0; p < n; p++ {
				if p == r {
					continue
				}
				// Neighbours on this host talk over shared memory, the
				// others through relays.
				relayed, shm := strings.HasPrefix(paths[p], "relay"), strings.HasPrefix(paths[p], "shm")
				if relayed == g.IsNeighbor(r, p) || (strings.HasPrefix(shmHere, "yes") && shm != g.IsNeighbor(r, p)) {
					t.Fatalf("%s: rank %d's path to %d is %q (neighbour: %v)", spec, r, p, paths[p], g.IsNeighbor(r, p))
				}
			}
		}
		closeAll(t, comms)
		for r := range want {
			if !bytes.Equal(got[r], want[r]) {
				t.Fatalf("%s over QUIC: rank %d's results differ from the full mesh's with the same schedules", spec, r)
			}
		}
	}
}

// The seed refuses a world whose ranks disagree on the topology, naming
// both values, on every rank.
func TestTopologySeedMismatch(t *testing.T) {
	const n = 3
	token := []byte("topology mismatch token")
	seed, err := StartSeed("127.0.0.1:0", n, token)
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := testConfig()
			cfg.WorldSize, cfg.Rank, cfg.Token, cfg.Seed = n, i, token, seed.Addr().String()
			cfg.BindAddr, cfg.ConnectTimeout = "127.0.0.1:0", 20*time.Second
			if i == 2 {
				cfg.Topology = topology.Spec{Kind: topology.Hypercube}
				time.Sleep(300 * time.Millisecond) // join last
			}
			c, err := testNewQUIC(context.Background(), cfg, false)
			if c != nil {
				c.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `"full"`) || !strings.Contains(err.Error(), `"hypercube"`) {
			t.Errorf("rank %d: %v, want a topology mismatch naming both values", r, err)
		}
	}
}

// A relay killed mid-collective on a ring (kregular:2): every survivor's
// call fails naming the dead rank (never a rank routed through it), and
// under the shrink policy the survivors' successor works, relaying around
// the gap.
func TestTopologyRelayKilledShrink(t *testing.T) {
	const n, dead = 8, 3
	cfg := recoverConfig(PolicyShrink)
	cfg.HeartbeatTimeout = 10 * time.Second // found by Kill; see TestTopologyRelayFailureNamesDeadRank
	cfg.Topology = topology.Spec{Kind: topology.KRegular, N: 2}
	comms, err := testNewLocal(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer each(comms, func(c *Comm) error { return c.CloseChain() }) // at once: see closeAll
	ctx := context.Background()
	live := slices.Delete(slices.Clone(comms), dead, dead+1)
	errs := each(comms, func(c *Comm) error {
		for i := 0; ; i++ {
			if c.Rank() == dead && i == 3 {
				// Dies between its calls while the others are in the
				// next one, waiting for it or for data it relays.
				mem.Kill(innerOf(c))
				c.n.freeze()
				return nil
			}
			if err := c.Allreduce(ctx, nil, make([]byte, 1<<16), collective.Float32, collective.Sum); err != nil {
				return err
			}
		}
	})
	defer comms[dead].n.thaw()
	for r, err := range errs {
		if r == dead {
			continue
		}
		var e *Error
		if !errors.As(err, &e) || (e.Code != CodePeerDown && e.Code != CodeRevoked) || (e.Code == CodePeerDown && e.Rank != dead) {
			t.Fatalf("rank %d: %v, want CodePeerDown naming rank %d (or CodeRevoked)", r, err, dead)
		}
	}
	next := make([]*Comm, len(live))
	for i, c := range live {
		s, err := c.Successor(ctx)
		if err != nil || s == c {
			t.Fatalf("rank %d: successor %v, %v", c.Rank(), s, err)
		}
		next[i] = s
	}
	sumCheck(t, next)
}

// Split works on a sparse world: the children (every other rank of a ring,
// so no two members are neighbours) talk through relays outside them.
func TestTopologySplit(t *testing.T) {
	const n = 16
	comms := newLocalTopo(t, n, topology.Spec{Kind: topology.KRegular, N: 2})
	defer closeAll(t, comms)
	kids := make([]*Comm, n)
	mustAll(t, each(comms, func(c *Comm) error {
		k, err := c.Split(context.Background(), c.Rank()%2, c.Rank())
		kids[c.Rank()] = k
		return err
	}))
	defer closeAll(t, kids)
	var even, odd []*Comm
	for r, k := range kids {
		if r%2 == 0 {
			even = append(even, k)
		} else {
			odd = append(odd, k)
		}
	}
	sumCheck(t, even)
	sumCheck(t, odd)
}

// On demand over real QUIC with room for 3 connections among 8 ranks:
// every collective gives the full mesh's bits, every pair exchanges
// point-to-point messages (tags out of order, any source), and no rank
// ever holds more than 3 connections.
func TestTopologyOnDemand(t *testing.T) {
	const n, m = 8, 3
	full, err := testNewLocal(n, topoTestConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := runEveryCollective(t, full)
	closeAll(t, full)
	cfg := topoTestConfig()
	cfg.Topology = topology.Spec{Kind: topology.OnDemand, N: m}
	comms, err := testNewLocalQUIC(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	got := runEveryCollective(t, comms)
	for r := range want {
		if !bytes.Equal(got[r], want[r]) {
			t.Fatalf("rank %d's results differ from the full mesh's", r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mustAll(t, each(comms, func(c *Comm) error {
		r := c.Rank()
		for d := 1; d < n; d++ {
			peer := (r + d) % n
			for tag := uint64(0); tag < 3; tag++ {
				c.ISend(fill(r*10+int(tag), 50), peer, tag)
			}
		}
		for d := 1; d < n; d++ {
			from := (r - d + n) % n
			for _, tag := range []uint64{2, 0, 1} {
				buf := make([]byte, 200)
				if _, err := c.Recv(ctx, buf, from, tag); err != nil {
					return err
				}
				if !bytes.Equal(buf, fill(from*10+int(tag), 50)) {
					return fmt.Errorf("tag %d from %d: wrong data", tag, from)
				}
			}
		}
		return c.Barrier(ctx)
	}))
	for _, c := range comms {
		open, most := c.n.onDemand.OpenConns()
		t.Logf("rank %d: %d connections open, at most %d", c.Rank(), open, most)
		if most > m || most == 0 {
			t.Errorf("rank %d held %d connections at once, room for %d", c.Rank(), most, m)
		}
	}
}

// On demand, a rank that dies while no connection to it is open is found
// when a rank next talks to it: that rank's communicator fails naming it.
func TestTopologyOnDemandDeadFoundAtNextUse(t *testing.T) {
	cfg := topoTestConfig()
	cfg.Topology = topology.Spec{Kind: topology.OnDemand, N: 1}
	cfg.HeartbeatTimeout = 2 * time.Second // dials give up after 10 s (the handshake's)
	comms, err := testNewLocalQUIC(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	talk := func(a, b int) {
		t.Helper()
		mustAll(t, each(comms[:], func(c *Comm) error {
			switch c.Rank() {
			case a:
				return c.Send(ctx, []byte("x"), b, 0)
			case b:
				_, err := c.Recv(ctx, make([]byte, 1), a, 0)
				return err
			}
			return nil
		}))
	}
	talk(0, 1)
	talk(0, 2) // rank 0's one connection moves from 1 to 2
	for comms[0].n.onDemand.Connected(1) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	comms[1].n.onDemand.(interface{ Kill() }).Kill() // the QUIC node (transport/mesh)
	start := time.Now()
	err = comms[0].Send(ctx, []byte("x"), 1, 0)
	var e *Error
	if err == nil {
		select {
		case <-comms[0].failed:
			err = comms[0].Err()
		case <-ctx.Done():
		}
	}
	if !errors.As(err, &e) || e.Code != CodePeerDown || e.Rank != 1 {
		t.Fatalf("send to the dead rank 1: %v, want CodePeerDown naming rank 1", err)
	}
	t.Logf("found after %v: %v", time.Since(start), err)
}
