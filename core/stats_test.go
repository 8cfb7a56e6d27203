package core

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport/bulk"
)

func TestMemoryProfileResolution(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want MemoryProfile
	}{
		{"zero", Config{}, MemoryProfile{256 << 20, bulk.DefaultRingSize, bulk.DefaultRingBudget, 256 << 20}},
		{"training", Config{MemoryProfile: "training"}, MemoryProfile{1 << 30, 32 << 20, 512 << 20, 2 << 30}},
		{"inference", Config{MemoryProfile: " Inference "}, MemoryProfile{32 << 20, 1 << 20, 8 << 20, 4 << 20}},
		{"overrides", Config{MemoryProfile: "inference", MaxBufferedBytes: 5, RingSize: 128 << 10, RingBudget: 7, ScratchIdleBytes: 9},
			MemoryProfile{5, 128 << 10, 7, 9}},
		{"keep no scratch", Config{MemoryProfile: "training", ScratchIdleBytes: -1}, MemoryProfile{1 << 30, 32 << 20, 512 << 20, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = testConfig().Logger
			c := tc.cfg.withDefaults()
			got := MemoryProfile{c.MaxBufferedBytes, c.RingSize, c.RingBudget, c.ScratchIdleBytes}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			c = c.withDefaults() // New and NewLocal may both fill in
			if again := (MemoryProfile{c.MaxBufferedBytes, c.RingSize, c.RingBudget, c.ScratchIdleBytes}); again != got {
				t.Fatalf("a second withDefaults changed %+v to %+v", got, again)
			}
			if err := c.validateMemory(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if err := (Config{MemoryProfile: "huge"}).validateMemory(); err == nil || !strings.Contains(err.Error(), "training") {
		t.Fatalf("unknown profile: got %v", err)
	}
	if err := (Config{RingSize: 3 << 20}).validateMemory(); err == nil {
		t.Fatal("a ring size not a power of two was accepted")
	}
	if _, err := testNewLocal(2, Config{MemoryProfile: "huge"}); err == nil {
		t.Fatal("NewLocal accepted an unknown memory profile")
	}
}

// A Config not read by ConfigFromEnv takes the profile from the
// environment where it sets none (nexar_comm_init, nexar.Comm(...)): New
// resolves it; withDefaults alone reads no environment.
func TestMemoryProfileEnvFallback(t *testing.T) {
	t.Setenv("NEXAR_MEMORY_PROFILE", "inference")
	t.Setenv("NEXAR_RING_BUDGET", "2097152")
	c, err := Config{Logger: testConfig().Logger}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := (MemoryProfile{c.MaxBufferedBytes, c.RingSize, c.RingBudget, c.ScratchIdleBytes}), (MemoryProfile{32 << 20, 1 << 20, 2 << 20, 4 << 20}); got != want {
		t.Fatalf("env profile: got %+v, want %+v", got, want)
	}
	if c, err = (Config{Logger: testConfig().Logger, MemoryProfile: "training", RingBudget: 4 << 20}).resolve(); err != nil {
		t.Fatal(err)
	}
	if got, want := (MemoryProfile{c.MaxBufferedBytes, c.RingSize, c.RingBudget, c.ScratchIdleBytes}), (MemoryProfile{1 << 30, 32 << 20, 4 << 20, 2 << 30}); got != want {
		t.Fatalf("explicit fields: got %+v, want %+v", got, want)
	}
}

func TestMemoryProfileFromEnv(t *testing.T) {
	base := map[string]string{"WORLD_SIZE": "1"}
	read := func(string) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    MemoryProfile // after withDefaults
		wantErr string
	}{
		{"inference", map[string]string{"NEXAR_MEMORY_PROFILE": "inference"}, MemoryProfile{32 << 20, 1 << 20, 8 << 20, 4 << 20}, ""},
		{"training with overrides", map[string]string{"NEXAR_MEMORY_PROFILE": "training", "NEXAR_RING_SIZE": "65536",
			"NEXAR_MAX_BUFFERED_BYTES": "1000", "NEXAR_SCRATCH_IDLE_BYTES": "-1"}, MemoryProfile{1000, 64 << 10, 512 << 20, -1}, ""},
		{"ring budget", map[string]string{"NEXAR_RING_BUDGET": "1048576"}, MemoryProfile{256 << 20, 8 << 20, 1 << 20, 256 << 20}, ""},
		{"bad profile", map[string]string{"NEXAR_MEMORY_PROFILE": "big"}, MemoryProfile{}, "NEXAR_MEMORY_PROFILE"},
		{"bad ring", map[string]string{"NEXAR_RING_SIZE": "-4"}, MemoryProfile{}, "NEXAR_RING_SIZE"},
		{"bad scratch", map[string]string{"NEXAR_SCRATCH_IDLE_BYTES": "x"}, MemoryProfile{}, "NEXAR_SCRATCH_IDLE_BYTES"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) {
				if v, ok := tc.env[k]; ok {
					return v, true
				}
				v, ok := base[k]
				return v, ok
			}
			cfg, err := configFromLookup(lookup, read)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg.Logger = testConfig().Logger
			c := cfg.withDefaults()
			if got := (MemoryProfile{c.MaxBufferedBytes, c.RingSize, c.RingBudget, c.ScratchIdleBytes}); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// An early message is counted as buffered until it is received; traffic
// counters move on both sides.
func TestStatsBuffered(t *testing.T) {
	comms, err := testNewLocal(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := bytes.Repeat([]byte{7}, 3000)
	if err := comms[1].Send(ctx, msg, 0, 3); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for comms[0].Stats().BytesBuffered < int64(len(msg)) {
		if time.Now().After(deadline) {
			t.Fatalf("the early message never showed as buffered: %+v", comms[0].Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	buf := make([]byte, len(msg))
	if _, err := comms[0].Recv(ctx, buf, 1, 3); err != nil {
		t.Fatal(err)
	}
	s0, s1 := comms[0].Stats(), comms[1].Stats()
	if s0.BytesBuffered != 0 {
		t.Fatalf("%d bytes still buffered after the receive", s0.BytesBuffered)
	}
	if s1.MessagesSent != 1 || s1.BytesSent != int64(len(msg)) || s0.BytesReceived != int64(len(msg)) {
		t.Fatalf("traffic: sender %+v, receiver %+v", s1, s0)
	}
	if s0.RingBytes != 0 || s0.RelayedBytes != 0 {
		t.Fatalf("in-memory world reports rings or relaying: %+v", s0)
	}
}

// Shared-memory traffic creates rings (counted per process); a large
// allreduce holds scratch, kept idle within the profile's bound.
func TestStatsRingsAndScratch(t *testing.T) {
	cfg := testConfig()
	cfg.Bulk = "shm"
	cfg.MemoryProfile = "inference"
	cfg.ScratchIdleBytes = 8 << 20
	comms, err := testNewLocalQUIC(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 1 << 20 // float32s: 4 MiB, the ring algorithm with scratch
	errs := each(comms, func(c *Comm) error {
		b := make([]byte, 4*n)
		return c.Allreduce(ctx, b, b, collective.Float32, collective.Sum)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, c := range comms {
		s := c.Stats()
		if s.RingBytes <= 0 || s.RingBytes > 1<<20 {
			t.Fatalf("rank %d: ring bytes %d, want in (0, 1 MiB] (the inference ring size)", r, s.RingBytes)
		}
		if s.ScratchBytes <= 0 || s.ScratchBytes > cfg.ScratchIdleBytes {
			t.Fatalf("rank %d: scratch %d after the call, want in (0, %d]", r, s.ScratchBytes, cfg.ScratchIdleBytes)
		}
		if s.BytesSent == 0 || s.BytesReceived == 0 {
			t.Fatalf("rank %d: no traffic counted: %+v", r, s)
		}
	}
	if err := comms[0].Close(); err != nil {
		t.Fatal(err)
	}
	if s := comms[0].Stats(); s.ScratchBytes != 0 {
		t.Fatalf("scratch %d held after Close", s.ScratchBytes)
	}
}

// The inference profile releases large scratch when the call ends; the
// default keeps it for the next call.
func TestStatsScratchByProfile(t *testing.T) {
	for _, tc := range []struct {
		profile  string
		min, max int64
	}{{"inference", 0, 4 << 20}, {"default", 16 << 20, 256 << 20}} {
		t.Run(tc.profile, func(t *testing.T) {
			cfg := testConfig()
			cfg.MemoryProfile = tc.profile
			comms, err := testNewLocal(2, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs := each(comms, func(c *Comm) error {
				b := make([]byte, 32<<20)
				return c.Allreduce(ctx, b, b, collective.Float32, collective.Sum)
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for r, c := range comms {
				if s := c.Stats().ScratchBytes; s < tc.min || s > tc.max {
					t.Fatalf("rank %d: %d bytes of scratch after a 32 MiB allreduce, want [%d, %d]", r, s, tc.min, tc.max)
				}
			}
		})
	}
}
