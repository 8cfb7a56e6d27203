package collective

import (
	"context"
	"testing"

	"github.com/nexar-go/nexar/internal/race"
)

// nullLink is one rank of a world whose peers are not there: sends go
// nowhere and receives read zeros, without allocating, so that what a
// schedule itself allocates can be counted (the transports' allocations
// are counted by core's tests).
type nullLink struct {
	rank, size int
	tuning     Tuning
	scratch    *ScratchPool
	sentTo     []int // the peers sent to, while record is set
	record     bool
}

func (l *nullLink) Rank() int             { return l.rank }
func (l *nullLink) Size() int             { return l.size }
func (l *nullLink) Tuning() *Tuning       { return &l.tuning }
func (l *nullLink) Scratch() *ScratchPool { return l.scratch }
func (l *nullLink) Send(_ context.Context, peer int, _ uint32, _ []byte) error {
	if l.record {
		l.sentTo = append(l.sentTo, peer)
	}
	return nil
}
func (l *nullLink) Recv(_ context.Context, _ int, _ uint32, buf []byte) error {
	clear(buf)
	return nil
}

// TestLeaderAllreduceAllocs: the leader schedule (the small allreduce with
// several ranks per host) allocates nothing per call, on a leader and on
// the other ranks, once its sub-links are in the HostMap's pool. It made
// two sub-links, a list of leaders and a tree per call, and with ranks
// that share cores each garbage collection was a slow call. A first call
// shows that the schedule is the leader one: a rank that is not its
// host's leader sends once, to a rank of its own host.
func TestLeaderAllreduceAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates, and its sync.Pool drops items at random")
	}
	hosts := NewHostMap([]string{"a", "a", "b", "b", "c", "c", "c", "c"})
	for _, rank := range []int{0, 1, 4, 7} {
		tun := testTuning.WithDefaults()
		tun.Hosts = hosts
		l := &nullLink{rank: rank, size: hosts.Size(), tuning: tun, scratch: NewScratchPool(1 << 20), record: true}
		buf := make([]byte, 8)
		ctx := context.Background()
		call := func() {
			if err := Allreduce(ctx, l, nil, buf, Float32, Sum); err != nil {
				t.Fatalf("rank %d: %v", rank, err)
			}
		}
		call()
		l.record = false
		if mine, li := hosts.place(rank); li != 0 && (len(l.sentTo) != 1 || hosts.Of(l.sentTo[0]) != hosts.Of(rank)) {
			t.Fatalf("rank %d (local rank %d of %v) sent to %v: not the leader schedule", rank, li, mine, l.sentTo)
		}
		if got := testing.AllocsPerRun(100, call); got != 0 {
			t.Errorf("rank %d: the leader allreduce allocates %.1f times per call, want 0", rank, got)
		}
	}
}
