package core

import (
	"context"
	"strings"
	"testing"

	"github.com/nexar-go/nexar/collective"
)

// newHostsQUIC forms a world over QUIC on loopback whose rank r says it
// runs on host hosts[r] (Config.HierHostID, as NEXAR_HIER_HOST_ID).
func newHostsQUIC(t *testing.T, hosts []string) []*Comm {
	t.Helper()
	comms, err := newLocalQUICEach(len(hosts), withMesh(testConfig()), func(i int, c *Config) { c.HierHostID = hosts[i] })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, comms) })
	return comms
}

// TestHostAwareSchedules: each rank's host travels through the seed to
// every member, whose communicators (the world's and a split's) carry the
// same HostMap, so the allreduce in the ring's range takes the two-level
// schedule; the results are those of every collective's check.
func TestHostAwareSchedules(t *testing.T) {
	comms := newHostsQUIC(t, []string{"A", "B", "A", "B"})
	for _, c := range comms {
		h := c.cfg.Tuning.Hosts
		if h == nil || h.String() != "2 hosts x 2 ranks" || h.Of(0) != h.Of(2) || h.Of(0) == h.Of(1) {
			t.Fatalf("rank %d: hosts %v, want A,B,A,B as 2 hosts x 2 ranks", c.Rank(), h)
		}
		if c.tuningDigest != comms[0].tuningDigest {
			t.Fatalf("rank %d's tuning digest differs from rank 0's", c.Rank())
		}
	}
	checkCollectives(t, comms, (1<<20)/8+3) // 1 MiB of int64: the allreduce takes two levels

	// Forced, so that a world without two levels would fail the call.
	ctx := context.Background()
	for _, c := range comms {
		c.cfg.Tuning.Force.Allreduce = collective.AlgoHier
		c.tuningDigest = c.cfg.Tuning.Digest()
	}
	mustAll(t, each(comms, func(c *Comm) error {
		buf := make([]byte, 8*1000)
		for i := 0; i < 1000; i++ {
			putI64(buf, i, int64(c.Rank()+i))
		}
		if err := c.Allreduce(ctx, nil, buf, collective.Int64, collective.Sum); err != nil {
			return err
		}
		for i := 0; i < 1000; i++ {
			if got, want := i64(buf, i), int64(6+4*i); got != want {
				t.Errorf("rank %d: [%d] = %d, want %d", c.Rank(), i, got, want)
				break
			}
		}
		return nil
	}))

	// A split of ranks 0, 1 and 2 (hosts A, B, A) has unequal hosts: it
	// keeps a HostMap; a forced two-level call takes the leader schedule
	// below the ring's range and fails naming the hosts in it.
	subs := make([]*Comm, 3)
	mustAll(t, each(comms, func(c *Comm) error {
		color := 0
		if c.Rank() == 3 {
			color = 1
		}
		s, err := c.Split(ctx, color, c.Rank())
		if c.Rank() < 3 {
			subs[c.Rank()] = s
		}
		return err
	}))
	for _, c := range subs {
		if h := c.cfg.Tuning.Hosts; h == nil || h.String() != "2 hosts (1-2 ranks)" {
			t.Fatalf("split rank %d: hosts %v, want A,B,A", c.Rank(), h)
		}
		c.cfg.Tuning.Force.Allreduce = collective.AlgoHier
		c.tuningDigest = c.cfg.Tuning.Digest()
	}
	mustAll(t, each(subs, func(c *Comm) error {
		buf := make([]byte, 8*100)
		for i := 0; i < 100; i++ {
			putI64(buf, i, int64(c.Rank()+i))
		}
		if err := c.Allreduce(ctx, nil, buf, collective.Int64, collective.Sum); err != nil {
			return err
		}
		for i := 0; i < 100; i++ {
			if got, want := i64(buf, i), int64(3+3*i); got != want {
				t.Errorf("split rank %d: [%d] = %d, want %d", c.Rank(), i, got, want)
				break
			}
		}
		return nil
	}))
	// Every rank fails this call itself, or first hears of another's
	// failure of it; both name the hosts.
	mustAll(t, each(subs, func(c *Comm) error {
		err := c.Allreduce(ctx, nil, make([]byte, 2<<20), collective.Float32, collective.Sum)
		if err == nil || !strings.Contains(err.Error(), "2 hosts (1-2 ranks)") {
			t.Errorf("rank %d: forced hier on hosts A,B,A in the ring's range: %v", c.Rank(), err)
		}
		return nil
	}))
}

// TestNoHostsOnOneHost: ranks that all run on one host get no HostMap
// (nothing to save), and neither does NewLocal's in-process world.
func TestNoHostsOnOneHost(t *testing.T) {
	for _, c := range newHostsQUIC(t, []string{"H", "H", "H"}) {
		if c.cfg.Tuning.Hosts != nil {
			t.Fatalf("rank %d: hosts %v on one host", c.Rank(), c.cfg.Tuning.Hosts)
		}
	}
	for _, c := range newLocal(t, 4) {
		if c.cfg.Tuning.Hosts != nil {
			t.Fatalf("NewLocal rank %d: hosts %v", c.Rank(), c.cfg.Tuning.Hosts)
		}
	}
}
