package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/topology"
)

// newElasticQUIC builds n ranks over loopback QUIC under policy p, each
// with a lobby, and returns them with the config a joiner needs.
func newElasticQUIC(t *testing.T, n int, p FailurePolicy, maxWorld int) ([]*Comm, Config) {
	t.Helper()
	cfg := recoverConfig(p)
	cfg.MaxWorldSize = maxWorld
	return newElasticQUICConfig(t, n, cfg)
}

// newElasticQUICConfig is newElasticQUIC with the members' whole config.
func newElasticQUICConfig(t *testing.T, n int, cfg Config) ([]*Comm, Config) {
	t.Helper()
	comms, err := testNewLocalQUIC(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			_ = c.CloseChain()
		}
	})
	jc := cfg
	jc.Token = comms[0].cfg.Token
	jc.BindAddr, jc.AdvertiseAddr = "127.0.0.1:0", ""
	jc.Timeout = 60 * time.Second
	return comms, jc
}

// startJoiners starts k joiners through addrs and waits until members'
// lobbies hold all of them; results arrive on the returned channel.
func startJoiners(t *testing.T, k int, jc Config, addrs []string, members []*Comm) chan joinResult {
	t.Helper()
	lists := make([][]string, k)
	for i := range lists {
		lists[i] = addrs
	}
	return startJoinersVia(t, lists, jc, members)
}

// startJoinersVia starts a joiner per list of addresses.
func startJoinersVia(t *testing.T, lists [][]string, jc Config, members []*Comm) chan joinResult {
	t.Helper()
	k := len(lists)
	out := make(chan joinResult, k)
	for _, addrs := range lists {
		jc := jc
		jc.Seed = strings.Join(addrs, ",")
		go func() {
			c, err := testJoin(context.Background(), jc)
			out <- joinResult{c, err}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		waiting := 0
		for _, m := range members {
			m.n.mu.Lock()
			lb := m.n.lobby
			m.n.mu.Unlock()
			if lb != nil && lb.get() != nil {
				waiting += len(lb.get().Waiting())
			}
		}
		if waiting == k {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d joiners waiting in the lobbies", waiting, k)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lobbyOf is the lobby c's node holds now (nil: none).
func lobbyOf(c *Comm) *membership.Lobby {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	return c.n.lobby.get()
}

// waitWaiting waits until n joiners wait in c's lobby.
func waitWaiting(t *testing.T, c *Comm, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); len(lobbyOf(c).Waiting()) != n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d joiners waiting in rank %d's lobby, want %d", what, len(lobbyOf(c).Waiting()), c.Rank(), n)
		}
	}
}

type joinResult struct {
	c   *Comm
	err error
}

// growAll calls Grow on every member at once and collects the joiners:
// the grown world in rank order.
func growAll(t *testing.T, members []*Comm, joiners chan joinResult, k int) []*Comm {
	t.Helper()
	grown := make([]*Comm, len(members))
	errs := each(members, func(c *Comm) error {
		g, err := c.Grow(context.Background())
		grown[slices.Index(members, c)] = g
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: grow: %v", members[i].Rank(), err)
		}
	}
	world := slices.Clone(grown)
	for i := 0; i < k; i++ {
		r := <-joiners
		if r.err != nil {
			t.Fatalf("joiner: %v", r.err)
		}
		world = append(world, r.c)
	}
	slices.SortFunc(world, func(a, b *Comm) int { return a.Rank() - b.Rank() })
	t.Cleanup(func() {
		for _, c := range world {
			_ = c.CloseChain()
		}
	})
	for i, c := range world {
		if c.Rank() != i || c.Size() != len(members)+k {
			t.Fatalf("grown world: rank %d of %d at index %d, want %d of %d", c.Rank(), c.Size(), i, i, len(members)+k)
		}
	}
	return world
}

// TestGrow: two joiners, one through each member's lobby, come in after
// the members; the grown world is one generation on and computes right.
func TestGrow(t *testing.T) {
	comms, jc := newElasticQUIC(t, 2, PolicyManual, 4)
	addrs := comms[0].JoinAddrs()
	if len(addrs) != 2 || addrs[0] == "" || addrs[1] == "" || addrs[0] == addrs[1] {
		t.Fatalf("JoinAddrs = %q, want two lobbies", addrs)
	}
	joined := startJoinersVia(t, [][]string{addrs[:1], addrs[1:]}, jc, comms)
	world := growAll(t, comms, joined, 2)
	for i, c := range world {
		if c.gen != membership.First+1 {
			t.Fatalf("rank %d: generation %d, want %d", i, c.gen, membership.First+1)
		}
	}
	sumCheck(t, world)
	checkCollectives(t, world, 3)
	// The old communicator still works, and the lobbies moved on with the
	// grown world: the old addresses are the grown world's members'.
	sumCheck(t, comms)
	got := world[0].JoinAddrs()
	if got[0] != addrs[0] || got[1] != addrs[1] || got[2] == "" || got[3] == "" {
		t.Fatalf("grown world's lobbies %q; the members' were %q", got, addrs)
	}
}

// TestGrowNobodyWaiting: with no joiner, Grow is the survivors' (here:
// everyone's) communicator on the same connections, one generation on.
func TestGrowNobodyWaiting(t *testing.T) {
	comms, _ := newElasticQUIC(t, 3, PolicyManual, 0)
	grown := make([]*Comm, 3)
	errs := each(comms, func(c *Comm) error {
		g, err := c.Grow(context.Background())
		grown[c.Rank()] = g
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer closeAll(t, grown)
	for r, g := range grown {
		if g.Size() != 3 || g.Rank() != r || g.n != comms[r].n || g.gen != comms[r].gen+1 {
			t.Fatalf("rank %d: grown %d of %d, same node %v, generation %d", r, g.Rank(), g.Size(), g.n == comms[r].n, g.gen)
		}
	}
	sumCheck(t, grown)
}

// TestGrowReplacesLostRank: rank 0 (which embedded nothing here, and whose
// lobby is gone with it) stops; the survivors grow through rank 1's lobby
// with a replacement, which takes the last rank; the lost rank is out.
func TestGrowReplacesLostRank(t *testing.T) {
	comms, jc := newElasticQUIC(t, 3, PolicyManual, 0)
	addrs := comms[1].JoinAddrs()
	comms[0].n.freeze()
	comms[0].n.mu.Lock()
	lb := comms[0].n.lobby
	comms[0].n.mu.Unlock()
	lb.close() // its process is gone: so is its lobby
	live := comms[1:]
	joiners := startJoiners(t, 1, jc, addrs, live) // tries rank 0's lobby first
	world := growAll(t, live, joiners, 1)
	sumCheck(t, world)
	comms[0].n.thaw()
}

// TestGrowJoinerLeavesBeforeAdmission: a joiner that the agreement named
// leaves its lobby before the member admits it. Every member's Grow fails
// at once, naming the joiner's would-be rank and the lobby's member, and
// keeps the old communicator; another joiner, admitted through the other
// lobby, goes back to waiting and comes in with the next grow. (Before
// ctlGrowAbort the members waited for the grown world's seed: the
// connect timeout, 60 s.)
func TestGrowJoinerLeavesBeforeAdmission(t *testing.T) {
	comms, jc := newElasticQUIC(t, 2, PolicyManual, 4)
	addrs := comms[0].JoinAddrs()
	stay := startJoinersVia(t, [][]string{addrs[1:]}, jc, comms)
	lctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	lc := jc
	lc.Seed = addrs[0]
	go func() {
		_, err := testJoin(lctx, lc)
		left <- err
	}()
	lobby0 := func() *membership.Lobby {
		comms[0].n.mu.Lock()
		defer comms[0].n.mu.Unlock()
		return comms[0].n.lobby.get()
	}
	for deadline := time.Now().Add(20 * time.Second); len(lobby0().Waiting()) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the leaving joiner never waited in rank 0's lobby")
		}
	}
	comms[0].mu.Lock()
	comms[0].rec.afterGrowAgreement = func() {
		leave()
		<-left
		for deadline := time.Now().Add(10 * time.Second); len(lobby0().Waiting()) != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("rank 0's lobby still holds the joiner that left")
				return
			}
		}
	}
	comms[0].mu.Unlock()
	start := time.Now()
	errs := each(comms, func(c *Comm) error {
		_, err := c.Grow(context.Background())
		return err
	})
	took := time.Since(start)
	var blamed []int // the joiner's rank in the grown world: 2 or 3, in the decision's order
	for r, err := range errs {
		var e *Error
		if !errors.As(err, &e) || e.Code != CodePeerDown || (e.Rank != 2 && e.Rank != 3) ||
			!strings.Contains(e.Msg, fmt.Sprintf("rank %d of the grown world left rank 0's lobby", e.Rank)) {
			t.Fatalf("member %d: grow returned %v; want CodePeerDown naming the joiner's rank (2 or 3) and rank 0's lobby", r, err)
		}
		blamed = append(blamed, e.Rank)
	}
	if blamed[0] != blamed[1] {
		t.Fatalf("the members name different joiners: ranks %v", blamed)
	}
	if took > 20*time.Second {
		t.Errorf("the abandoned grow took %v", took)
	}
	t.Logf("abandoned grow took %v", took.Round(time.Millisecond))
	sumCheck(t, comms) // the members keep the old communicator
	comms[0].mu.Lock()
	comms[0].rec.afterGrowAgreement = nil
	comms[0].mu.Unlock()
	// The joiner that stayed was admitted to the abandoned grow: it goes
	// back to a lobby, and the next grow takes it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		for _, c := range comms {
			c.n.mu.Lock()
			if l := c.n.lobby.get(); l != nil {
				n += len(l.Waiting())
			}
			c.n.mu.Unlock()
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d joiners back in the lobbies after the abandoned grow, want 1", n)
		}
	}
	world := growAll(t, comms, stay, 1) // the joiner that stayed
	sumCheck(t, world)
}

// TestGrowMaxWorldSize: joiners beyond MaxWorldSize wait for a later grow.
func TestGrowMaxWorldSize(t *testing.T) {
	cfg := recoverConfig(PolicyManual)
	cfg.MaxWorldSize = 3
	comms, err := testNewLocalQUIC(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	jc := cfg
	jc.Token = comms[0].cfg.Token
	jc.BindAddr = "127.0.0.1:0"
	joiners := startJoiners(t, 2, jc, comms[0].JoinAddrs(), comms)
	world := growAll(t, comms, joiners, 1)
	sumCheck(t, world)
	waiting := 0
	for _, c := range world {
		c.n.mu.Lock()
		if c.n.lobby != nil && c.n.lobby.get() != nil {
			waiting += len(c.n.lobby.get().Waiting())
		}
		c.n.mu.Unlock()
	}
	if waiting != 1 {
		t.Fatalf("%d joiners still waiting, want 1 (the world is at its maximum)", waiting)
	}
	for _, c := range world {
		c.n.mu.Lock()
		lb := c.n.lobby
		c.n.mu.Unlock()
		if lb != nil {
			lb.close() // the one left waiting moves on and times out at the test's end
		}
	}
}

// TestShrinkGrowCycles: one job of 3 loses a rank (stopped, then declared
// down), shrinks to 2, checks an allreduce, grows back to 3 with a new
// process's rank through a survivor's lobby, checks again; 20 times (5
// with NEXAR_TEST_QUICK).
func TestShrinkGrowCycles(t *testing.T) {
	cycles := 20
	if testQuick() {
		cycles = 5
	}
	world, jc := newElasticQUIC(t, 3, PolicyManual, 0)
	for cycle := 0; cycle < cycles; cycle++ {
		victim := cycle % len(world)
		world[victim].n.freeze()
		world[victim].n.mu.Lock()
		lb := world[victim].n.lobby
		world[victim].n.mu.Unlock()
		if lb != nil {
			lb.close()
		}
		live := slices.Delete(slices.Clone(world), victim, victim+1)
		kids := shrinkAll(t, live)
		sumCheck(t, kids)
		addrs := kids[0].JoinAddrs()
		joiners := startJoiners(t, 1, jc, addrs, kids)
		grown := growAll(t, kids, joiners, 1)
		sumCheck(t, grown)
		world[victim].n.thaw()
		for _, c := range world {
			_ = c.Close()
		}
		for _, c := range kids {
			_ = c.Close()
		}
		world = grown
	}
}

// testQuick reports whether NEXAR_TEST_QUICK=1 asks for short forms (make
// test's -race run).
func testQuick() bool { return os.Getenv("NEXAR_TEST_QUICK") == "1" }

// TestAdmitted: the joiners a decision names, in its order, without those
// of failed members, repeated ids or malformed records, at most room.
func TestAdmitted(t *testing.T) {
	id := func(b byte) []byte { return bytes.Repeat([]byte{b}, membership.JoinIDSize) }
	d := &membership.Decision{Failed: []int{1}, Extra: [][]byte{
		joinRecord(0, id(1)),
		joinRecord(1, id(2)), // its member failed: its lobby is gone
		joinRecord(2, id(1)), // the same joiner seen in two lobbies: the first counts
		joinRecord(2, id(3)),
		joinRecord(9, id(4)), // no such member
		{1, 2, 3},            // malformed
		joinRecord(0, id(5)),
	}}
	got := admitted(d, 3, 10)
	want := []joiner{{0, id(1)}, {2, id(3)}, {0, id(5)}}
	if len(got) != len(want) {
		t.Fatalf("admitted %v, want %v", got, want)
	}
	for i := range want {
		if got[i].member != want[i].member || !bytes.Equal(got[i].id, want[i].id) {
			t.Fatalf("admitted[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if got := admitted(d, 3, 2); len(got) != 2 {
		t.Fatalf("room 2: %d admitted", len(got))
	}
	if got := admitted(d, 3, -1); len(got) != 0 {
		t.Fatalf("no room: %d admitted", len(got))
	}
}

// TestGrowJoinerTakesJobTopology: members on a ring (kregular:2) grow with
// a joiner that set no topology (or another one): the joiner forms the
// grown world with the job's topology, so the seed does not refuse it as a
// mismatch, and traffic between non-neighbours is relayed.
func TestGrowJoinerTakesJobTopology(t *testing.T) {
	for _, own := range []topology.Spec{{}, {Kind: topology.Hypercube}} {
		t.Run(own.String(), func(t *testing.T) {
			cfg := recoverConfig(PolicyManual)
			cfg.MaxWorldSize = 5
			cfg.Topology = topology.Spec{Kind: topology.KRegular, N: 2}
			comms, jc := newElasticQUICConfig(t, 4, cfg)
			jc.Topology = own
			joined := startJoiners(t, 1, jc, comms[0].JoinAddrs()[:1], comms)
			world := growAll(t, comms, joined, 1)
			if got := world[4].cfg.Topology; got != cfg.Topology {
				t.Fatalf("joiner formed with topology %s, want the job's %s", got, cfg.Topology)
			}
			sumCheck(t, world)
		})
	}
}

// TestGrowLeavesAStoppedJoinerWaiting: of two joiners in rank 0's lobby,
// one reads nothing (as a SIGSTOPped process). The grow admits the live
// one after the admission window, not the members' timeout (an hour
// here), and the stopped one is still waiting afterwards.
func TestGrowLeavesAStoppedJoinerWaiting(t *testing.T) {
	comms, jc := newElasticQUIC(t, 2, PolicyManual, 4)
	for _, c := range comms {
		c.cfg.Timeout = time.Hour
	}
	addrs := comms[0].JoinAddrs()[:1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resume := make(chan struct{})
	defer close(resume)
	go func() { _, _ = membership.AwaitAdmissionPaused(ctx, addrs, jc.Token, resume) }()
	waitWaiting(t, comms[0], 1, "the stopped joiner")
	joined := startJoiners(t, 1, jc, addrs, comms[:1])
	waitWaiting(t, comms[0], 2, "the live joiner") // startJoiners counted the stopped one
	start := time.Now()
	world := growAll(t, comms, joined, 1)
	t.Logf("grow with a stopped joiner in the lobby: %v", time.Since(start).Round(time.Millisecond))
	sumCheck(t, world)
	if n := len(lobbyOf(world[0]).Waiting()); n != 1 { // the grown world's node has the lobby now
		t.Fatalf("%d joiners wait in rank 0's lobby after the grow, want the stopped one", n)
	}
}
