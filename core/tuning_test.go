package core

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/nexar-go/nexar/collective"
)

// TestTuningPerComm runs an allreduce whose chunk size and algorithm come
// from Config.Tuning (small chunks, forced ring), and checks the result.
func TestTuningPerComm(t *testing.T) {
	cfg := testConfig()
	cfg.Tuning = collective.Tuning{ChunkSize: 256, Force: collective.Forced{Allreduce: collective.AlgoRing}}
	comms, err := testNewLocal(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	const n = 1000
	bufs := make([][]byte, len(comms))
	for r := range bufs {
		bufs[r] = make([]byte, 8*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint64(bufs[r][8*i:], uint64(r+i))
		}
	}
	mustAll(t, each(comms, func(c *Comm) error {
		return c.Allreduce(context.Background(), nil, bufs[c.Rank()], collective.Int64, collective.Sum)
	}))
	for r := range bufs {
		for i := 0; i < n; i++ {
			if got, want := binary.LittleEndian.Uint64(bufs[r][8*i:]), uint64(3*i+3); got != want {
				t.Fatalf("rank %d element %d = %d, want %d", r, i, got, want)
			}
		}
	}
	if got := comms[0].cfg.Tuning.ChunkSize; got != 256 {
		t.Fatalf("chunk size %d reached the comm, want 256", got)
	}
}

// TestTuningMismatch gives one rank another chunk size, or another
// algorithm threshold. Such ranks number steps differently or run different
// schedules (a hang, or a confusing length error); now every rank's call
// fails as mismatched, naming the tuning.
func TestTuningMismatch(t *testing.T) {
	for _, tc := range []struct {
		size   int
		change func(*collective.Tuning)
	}{
		{0, func(t *collective.Tuning) { t.ChunkSize = 4096 }},
		{64 << 10, func(t *collective.Tuning) { t.ChunkSize = 4096 }},
		{64 << 10, func(t *collective.Tuning) { t.AllreduceRingThreshold = 1 }},
	} {
		size := tc.size
		comms, err := testNewLocal(3, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		odd := comms[2]
		tc.change(&odd.cfg.Tuning)
		odd.tuningDigest = odd.cfg.Tuning.Digest()
		if odd.tuningDigest == comms[0].tuningDigest {
			t.Fatal("different chunk sizes, same digest")
		}
		errs := each(comms, func(c *Comm) error {
			return c.Allreduce(context.Background(), nil, make([]byte, size), collective.Float32, collective.Sum)
		})
		for r, err := range errs {
			if CodeOf(err) != CodeMismatch || !strings.Contains(err.Error(), "tuning") {
				t.Errorf("size %d: rank %d: %v, want a mismatch naming the tuning", size, r, err)
			}
		}
		closeAll(t, comms)
	}
}

func TestTuningInvalid(t *testing.T) {
	cfg := testConfig()
	cfg.Tuning.ChunkSize = 1 << 30
	_, err := testNewLocal(2, cfg)
	if CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), "chunk size") {
		t.Fatalf("NewLocal with a 1 GiB chunk: %v, want an invalid argument naming the chunk size", err)
	}
}
