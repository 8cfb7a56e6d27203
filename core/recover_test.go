package core

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/transport/mem"
)

func recoverConfig(p FailurePolicy) Config {
	cfg := testConfig()
	cfg.OnFailure = p
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
	return cfg
}

func newRecoverLocal(t *testing.T, n int, p FailurePolicy) []*Comm {
	t.Helper()
	comms, err := testNewLocal(n, recoverConfig(p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			_ = c.CloseChain()
		}
	})
	return comms
}

// sumCheck runs an allreduce of (rank+1) on every comm and checks the sum.
func sumCheck(t *testing.T, comms []*Comm) {
	t.Helper()
	n := len(comms)
	errs := each(comms, func(c *Comm) error {
		b := make([]byte, 8*1000)
		for i := 0; i < 1000; i++ {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(c.Rank()+1+i))
		}
		if err := c.Allreduce(context.Background(), nil, b, collective.Int64, collective.Sum); err != nil {
			return err
		}
		for i := 0; i < 1000; i++ {
			want := uint64(n*(n+1)/2 + n*i)
			if got := binary.LittleEndian.Uint64(b[8*i:]); got != want {
				return fmt.Errorf("rank %d element %d: %d, want %d", c.Rank(), i, got, want)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("allreduce on %d ranks: rank %d: %v", n, r, err)
		}
	}
}

// shrinkAll shrinks every communicator of live at once and returns the
// survivors' communicators in the same order (closed at the test's end).
func shrinkAll(t *testing.T, live []*Comm) []*Comm {
	t.Helper()
	kids := make([]*Comm, len(live))
	errs := each(live, func(c *Comm) error {
		k, err := c.Shrink(context.Background())
		kids[slices.Index(live, c)] = k
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%d survivors: rank %d: shrink: %v", len(live), live[i].Rank(), err)
		}
	}
	t.Cleanup(func() { closeAll(t, kids) })
	return kids
}

func TestRecoveryRefusedUnderAbort(t *testing.T) {
	comms := newLocal(t, 2)
	if _, _, err := comms[0].Agree(context.Background(), 1); CodeOf(err) != CodeUnavailable {
		t.Fatalf("Agree under the abort policy: %v, want CodeUnavailable", err)
	}
	if _, err := comms[0].Shrink(context.Background()); CodeOf(err) != CodeUnavailable {
		t.Fatalf("Shrink under the abort policy: %v, want CodeUnavailable", err)
	}
}

// TestRevoke: a rank's revoke ends the others' calls in progress, which
// wait for it in vain, and later ones; agree still works afterwards.
func TestRevoke(t *testing.T) {
	comms := newRecoverLocal(t, 3, PolicyManual)
	ctx := context.Background()
	errs := each(comms, func(c *Comm) error {
		if c.Rank() == 0 {
			time.Sleep(100 * time.Millisecond)
			c.Revoke()
			return nil
		}
		return c.Allreduce(ctx, nil, make([]byte, 4096), collective.Float32, collective.Sum)
	})
	for r := 1; r < 3; r++ {
		if e, ok := errs[r].(*Error); !ok || e.Code != CodeRevoked || e.Rank != 0 {
			t.Fatalf("rank %d: %v, want CodeRevoked by rank 0", r, errs[r])
		}
	}
	for _, c := range comms {
		if !c.Revoked() {
			t.Fatalf("rank %d does not know it is revoked", c.Rank())
		}
		if err := c.Barrier(ctx); CodeOf(err) != CodeRevoked {
			t.Fatalf("rank %d: a later call: %v, want CodeRevoked", c.Rank(), err)
		}
	}
	flags := []uint64{0b111, 0b101, 0b110}
	res := make([]uint64, 3)
	errs = each(comms, func(c *Comm) error {
		f, failed, err := c.Agree(ctx, flags[c.Rank()])
		if err == nil && len(failed) != 0 {
			err = fmt.Errorf("failed %v, want none", failed)
		}
		res[c.Rank()] = f
		return err
	})
	for r, err := range errs {
		if err != nil || res[r] != 0b100 {
			t.Fatalf("rank %d: agree %b, %v; want 100", r, res[r], err)
		}
	}
}

// TestAgreeAfterKill: survivors of a death agree on the same flag and the
// same failed set, also when the death is only known to some of them.
func TestAgreeAfterKill(t *testing.T) {
	for _, n := range []int{3, 4, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := newRecoverLocal(t, n, PolicyManual)
			dead := n / 2
			mem.Kill(comms[dead].n.ep)
			live := slices.Delete(slices.Clone(comms), dead, dead+1)
			type res struct {
				flag   uint64
				failed []int
			}
			out := make([]res, len(live))
			errs := each(live, func(c *Comm) error {
				f, failed, err := c.Agree(context.Background(), ^uint64(0)&^(1<<uint(c.Rank())))
				i := slices.Index(live, c)
				out[i] = res{f, failed}
				return err
			})
			want := ^uint64(0)
			for _, c := range live {
				want &^= 1 << uint(c.Rank())
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", live[i].Rank(), err)
				}
				if out[i].flag != want || !slices.Equal(out[i].failed, []int{dead}) {
					t.Fatalf("rank %d: flag %x failed %v, want %x [%d]", live[i].Rank(), out[i].flag, out[i].failed, want, dead)
				}
			}
		})
	}
}

// TestShrink: after a death, the survivors' communicator has the live
// ranks in the old order, a new generation, and computes right; the old
// one stays failed.
func TestShrink(t *testing.T) {
	comms := newRecoverLocal(t, 5, PolicyManual)
	sumCheck(t, comms)
	mem.Kill(comms[1].n.ep)
	live := []*Comm{comms[0], comms[2], comms[3], comms[4]}
	// Some ranks have not seen the death yet when they are asked to
	// shrink: the revoke and the agreement tell them.
	kids := shrinkAll(t, live)
	for i, k := range kids {
		if k.Rank() != i || k.Size() != 4 || !slices.Equal(k.world, []int{0, 2, 3, 4}) || k.gen != membership.First+1 {
			t.Fatalf("old rank %d: new rank %d of %d, world %v, generation %d", live[i].Rank(), k.Rank(), k.Size(), k.world, k.gen)
		}
		if k.id != kids[0].id {
			t.Fatalf("new communicators' ids differ: %x and %x", k.id, kids[0].id)
		}
	}
	sumCheck(t, kids)
	checkCollectives(t, kids, 7)
	if err := live[0].Barrier(context.Background()); err == nil {
		t.Fatal("the old communicator works after the shrink")
	}
}

// TestShrinkRepeatedly: 8 ranks lose one at a time, down to 4, shrinking
// by hand after each loss, with an allreduce check at every size.
func TestShrinkRepeatedly(t *testing.T) {
	comms := newRecoverLocal(t, 8, PolicyManual)
	cur := comms
	for len(cur) > 4 {
		victim := len(cur) / 3
		mem.Kill(cur[victim].n.ep)
		live := slices.Delete(slices.Clone(cur), victim, victim+1)
		kids := shrinkAll(t, live)
		sumCheck(t, kids)
		cur = kids
	}
}

// TestShrinkPolicy: under the shrink policy the call that meets the
// failure returns an error naming the dead rank, and Successor is the
// survivors' communicator, which works; the chain is followed through two
// losses.
func TestShrinkPolicy(t *testing.T) {
	comms := newRecoverLocal(t, 5, PolicyShrink)
	ctx := context.Background()
	cur := comms
	for _, victim := range []int{2, 0} {
		mem.Kill(cur[victim].n.ep)
		live := slices.Delete(slices.Clone(cur), victim, victim+1)
		errs := each(live, func(c *Comm) error {
			return c.Allreduce(ctx, nil, make([]byte, 1<<16), collective.Float32, collective.Sum)
		})
		for i, err := range errs {
			if e, ok := err.(*Error); !ok || e.Code != CodePeerDown && e.Code != CodeRevoked {
				t.Fatalf("rank %d: %v, want the failure", live[i].Rank(), err)
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
		cur = next
	}
	if cur[0].Size() != 3 {
		t.Fatalf("size %d after two losses of 5", cur[0].Size())
	}
}

// TestShrinkExcludesStoppedRank: a rank frozen past the heartbeat timeout
// is left out by the others, who shrink without it; once thawed, its own
// shrink fails (it cannot reach a quorum, or learns it was left out)
// instead of forming a second job.
func TestShrinkExcludesStoppedRank(t *testing.T) {
	comms := newRecoverLocal(t, 4, PolicyManual)
	comms[3].n.freeze()
	live := comms[:3]
	kids := make([]*Comm, 3)
	errs := each(live, func(c *Comm) error {
		// Wait for the detector, as an application would on a failed call.
		err := c.Allreduce(context.Background(), nil, make([]byte, 64), collective.Float32, collective.Sum)
		if code := CodeOf(err); code != CodePeerDown && code != CodeRevoked {
			return fmt.Errorf("allreduce: %v, want CodePeerDown (or CodeRevoked: a faster rank shrinks)", err)
		}
		k, err := c.Shrink(context.Background())
		kids[c.Rank()] = k
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() { closeAll(t, kids) })
	sumCheck(t, kids)
	comms[3].n.thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := comms[3].Shrink(ctx)
	if err == nil {
		k.Close()
		t.Fatal("the stopped rank formed a communicator of its own")
	}
	if c := CodeOf(err); c != CodeNoQuorum && c != CodePeerDown {
		t.Fatalf("stopped rank: %v, want CodeNoQuorum or CodePeerDown", err)
	}
	t.Logf("stopped rank: %v", err)
}

func TestParseFailurePolicy(t *testing.T) {
	for s, want := range map[string]FailurePolicy{"abort": PolicyAbort, "Manual": PolicyManual, " shrink ": PolicyShrink} {
		if got, err := ParseFailurePolicy(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	if _, err := ParseFailurePolicy("restart"); err == nil {
		t.Error("restart accepted")
	}
	cfg, err := ConfigFromLookup(func(k string) (string, bool) {
		v, ok := map[string]string{"NEXAR_RANK": "0", "NEXAR_WORLD_SIZE": "1", "NEXAR_ON_FAILURE": "shrink"}[k]
		return v, ok
	})
	if err != nil || cfg.OnFailure != PolicyShrink {
		t.Fatalf("NEXAR_ON_FAILURE=shrink: %v %v", cfg.OnFailure, err)
	}
}

// TestAgreeThenClose: a member that returns from Agree and closes at once
// must not cost the others the decision (its goodbye can overtake its
// Commit): on 2 ranks, rank 1 losing rank 0 would otherwise find no
// quorum. Over QUIC with shared memory, where the goodbye travels on
// another lane than the agreement.
func TestAgreeThenClose(t *testing.T) {
	for i := 0; i < 10; i++ {
		cfg := recoverConfig(PolicyManual)
		cfg.Bulk = "shm"
		comms, err := testNewLocalQUIC(2, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Data on the ring first, so that the goodbye takes the data lane.
		sumCheck(t, comms)
		errs := each(comms, func(c *Comm) error {
			f, failed, err := c.Agree(context.Background(), 5)
			if err == nil && (f != 5 || len(failed) != 0) {
				err = fmt.Errorf("agreed %d %v", f, failed)
			}
			if c.Rank() == 0 {
				c.Close()
			}
			return err
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("round %d: rank %d: %v", i, r, err)
			}
		}
		closeAll(t, comms)
	}
}
