//go:build cgo && linux

package bulk_test

import (
	"context"
	"encoding/binary"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/internal/race"
	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport/mesh"
)

// TestRDMAAllreduceRegistrations: 1000 allreduces on one buffer between two
// ranks whose data path is RDMA (the fake NIC) register memory a bounded
// number of times, all in the first calls: registrations last across calls
// (docs/bulk-path.md, "Registrations that last"). Each rank registers
// three regions, once each: its buffer, whole (collective.Preparer: the
// schedule's halves share it), the scratch an in-place call stages the
// peer's half in, and the pooled buffer a message that arrives before its
// receive is posted lands in. Per-call registration (before) registered
// every large message on each side: 7,678 times in one run; per-piece
// registrations that last, 4 per rank.
func TestRDMAAllreduceRegistrations(t *testing.T) {
	lib, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	cfg := core.Config{Timeout: 60 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler), NormalSysmon: true, Mesh: mesh.Builder{}, Bulk: "rdma"}
	cfg.RDMA.Library, cfg.RDMA.Device = lib, "fake_roce0"
	comms, err := core.NewLocalQUIC(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	const count = 128 << 10 // float32: 512 KiB, halves of 256 KiB by RDMA WRITE
	bufs := make([][]byte, len(comms))
	for i := range bufs {
		bufs[i] = make([]byte, 4*count)
	}
	run := func(iter int) {
		t.Helper()
		for r, b := range bufs {
			for k := range count {
				binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(float32(r+1+(k+iter)%7)))
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, len(comms))
		for r, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = c.Allreduce(context.Background(), bufs[r], bufs[r], collective.Float32, collective.Sum)
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("allreduce %d, rank %d: %v", iter, r, err)
			}
		}
		for r, b := range bufs {
			for _, k := range []int{0, count / 2, count - 1} {
				want := float32(3 + 2*((k+iter)%7))
				if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:])); got != want {
					t.Fatalf("allreduce %d, rank %d, element %d: %v, want %v", iter, r, k, got, want)
				}
			}
		}
	}
	for _, c := range comms {
		if p := c.Paths()[1-c.Rank()]; len(p) < 4 || p[:4] != "rdma" {
			t.Fatalf("rank %d: path %q, want rdma", c.Rank(), p)
		}
	}
	before, err := ibverbs.Registrations(lib)
	if err != nil {
		t.Fatal(err)
	}
	calls := 1000
	if race.Enabled {
		calls = 200 // 90 s for 1000 under -race on 2 cores; the bound is the same
	}
	const warm = 10 // reported: how many registrations come after
	for i := range warm {
		run(i)
	}
	mid, _ := ibverbs.Registrations(lib)
	for i := warm; i < calls; i++ {
		run(i)
	}
	after, _ := ibverbs.Registrations(lib)
	// The early-arrival buffer is registered when the first message
	// arrives early, which may be after the first calls (under -race it
	// was once call 10 to 200): so the bound is on the total, which
	// per-call registration exceeds at the second call.
	t.Logf("%d allreduces of %d KiB: %d registrations in both ranks, %d after the first %d calls", calls, 4*count>>10, after-before, after-mid, warm)
	if n := after - before; n > 3*int64(len(comms)) {
		t.Errorf("%d allreduces on one buffer made %d registrations in %d ranks, want at most 3 per rank", calls, n, len(comms))
	}
}
