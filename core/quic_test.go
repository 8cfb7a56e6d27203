package core

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/internal/race"
)

func TestQUICCollectives(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms, err := testNewLocalQUIC(n, testConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			checkCollectives(t, comms, 257)
		})
	}
}

func TestQUICLargeP2P(t *testing.T) {
	size := 65<<20 + 3 // crosses transport.MaxPayload
	if testing.Short() || race.Enabled {
		size = 5 << 20 // QUIC's crypto is ~10x slower under the race detector
	}
	comms, err := testNewLocalQUIC(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i * 7)
	}
	start := time.Now()
	mustAll(t, each(comms, func(c *Comm) error {
		if c.Rank() == 0 {
			return c.Send(context.Background(), want, 1, 3)
		}
		got := make([]byte, size)
		st, err := c.Recv(context.Background(), got, 0, 3)
		if err != nil {
			return err
		}
		if st.Count != size || !bytes.Equal(got, want) {
			return fmt.Errorf("received %d bytes, content equal: %v", st.Count, bytes.Equal(got, want))
		}
		return nil
	}))
	t.Logf("%d bytes over QUIC in %v", size, time.Since(start))
}

func TestSeedRefusesWrongToken(t *testing.T) {
	seed, err := StartSeed("127.0.0.1:0", 2, []byte("right token"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err = joinSeed(ctx, seed.Addr().String(), []byte("wrong token"), -1, "127.0.0.1:1", [32]byte{1})
	if CodeOf(err) != CodeAuth {
		t.Fatalf("got %v, want CodeAuth", err)
	}
	// New with a wrong token fails the same way.
	_, err = testNew(ctx, Config{Rank: 1, WorldSize: 2, Seed: seed.Addr().String(), Token: []byte("nope"),
		BindAddr: "127.0.0.1:0", Logger: testConfig().Logger})
	if CodeOf(err) != CodeAuth {
		t.Fatalf("New: got %v, want CodeAuth", err)
	}
}

func TestSeedRankRules(t *testing.T) {
	token := []byte("t")
	seed, err := StartSeed("127.0.0.1:0", 2, token)
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := joinSeed(ctx, seed.Addr().String(), token, 5, "127.0.0.1:1", [32]byte{1}); CodeOf(err) != CodeInvalidArgument {
		t.Errorf("out of range rank: %v", err)
	}
	type res struct {
		rank int
		err  error
	}
	ch := make(chan res, 2)
	go func() {
		r, _, err := joinSeed(ctx, seed.Addr().String(), token, 1, "127.0.0.1:1", [32]byte{1})
		ch <- res{r, err}
	}()
	time.Sleep(100 * time.Millisecond)
	if _, _, err := joinSeed(ctx, seed.Addr().String(), token, 1, "127.0.0.1:2", [32]byte{2}); CodeOf(err) != CodeInvalidArgument {
		t.Errorf("duplicate rank: %v", err)
	}
	go func() {
		r, peers, err := joinSeed(ctx, seed.Addr().String(), token, -1, "127.0.0.1:3", [32]byte{3})
		if err == nil && (len(peers) != 2 || peers[1].Addr != "127.0.0.1:1") {
			err = fmt.Errorf("bad table %+v", peers)
		}
		ch <- res{r, err}
	}()
	got := map[int]bool{}
	for i := 0; i < 2; i++ {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		got[r.rank] = true
	}
	if !got[0] || !got[1] {
		t.Errorf("ranks %v, want 0 and 1", got)
	}
}

func TestConfigFromEnv(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want Config
		err  string
	}{
		{"nexar", map[string]string{"NEXAR_RANK": "1", "NEXAR_WORLD_SIZE": "4", "NEXAR_SEED": "h:1", "NEXAR_TOKEN": "s", "NEXAR_TIMEOUT": "9s"},
			Config{Rank: 1, WorldSize: 4, Seed: "h:1", Token: []byte("s"), Timeout: 9 * time.Second}, ""},
		{"torchrun", map[string]string{"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "m", "MASTER_PORT": "29500", "NEXAR_TOKEN": "s"},
			Config{Rank: 2, WorldSize: 3, Seed: "m:29500", Token: []byte("s")}, ""},
		{"slurm", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "NEXAR_SEED": "n:5", "NEXAR_TOKEN_FILE": "/tok"},
			Config{Rank: 0, WorldSize: 2, Seed: "n:5", Token: []byte("filetoken")}, ""},
		{"ompi", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "NEXAR_SEED": "n:5", "NEXAR_TOKEN": "s"},
			Config{Rank: 1, WorldSize: 2, Seed: "n:5", Token: []byte("s")}, ""},
		{"no token", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, Config{}, "NEXAR_TOKEN"},
		{"no size", map[string]string{"RANK": "0"}, Config{}, "NEXAR_WORLD_SIZE"},
		{"no seed", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "NEXAR_TOKEN": "s"}, Config{}, "NEXAR_SEED"},
		{"bad rank", map[string]string{"NEXAR_RANK": "x", "NEXAR_WORLD_SIZE": "2"}, Config{}, "NEXAR_RANK"},
		{"single", map[string]string{"WORLD_SIZE": "1"}, Config{Rank: 0, WorldSize: 1}, ""},
		{"joiner", map[string]string{"NEXAR_JOIN": "1", "NEXAR_SEED": "a:1, b:2", "NEXAR_TOKEN": "s", "NEXAR_RANK": "7"},
			Config{Rank: -1, WorldSize: 2, Seed: "a:1, b:2", Token: []byte("s"), Join: true}, ""},
		{"joiner bad list", map[string]string{"NEXAR_JOIN": "1", "NEXAR_SEED": "a:1,b", "NEXAR_TOKEN": "s"}, Config{}, `"b"`},
		{"joiner no token", map[string]string{"NEXAR_JOIN": "true", "NEXAR_SEED": "a:1"}, Config{}, "NEXAR_TOKEN"},
		{"bad join flag", map[string]string{"NEXAR_JOIN": "maybe", "WORLD_SIZE": "1"}, Config{}, "NEXAR_JOIN"},
		{"world bounds", map[string]string{"WORLD_SIZE": "1", "NEXAR_MIN_WORLD_SIZE": "2", "NEXAR_MAX_WORLD_SIZE": "9", "NEXAR_JOIN_ADDR": "0.0.0.0:7"},
			Config{Rank: 0, WorldSize: 1, MinWorldSize: 2, MaxWorldSize: 9, JoinAddr: "0.0.0.0:7"}, ""},
		{"bad max", map[string]string{"WORLD_SIZE": "1", "NEXAR_MAX_WORLD_SIZE": "0"}, Config{}, "NEXAR_MAX_WORLD_SIZE"},
		{"bad join addr", map[string]string{"WORLD_SIZE": "1", "NEXAR_JOIN_ADDR": "nowhere"}, Config{}, "NEXAR_JOIN_ADDR"},
		{"sysmon normal", map[string]string{"WORLD_SIZE": "1", "NEXAR_IDLE_SYSMON": "0"}, Config{Rank: 0, WorldSize: 1, NormalSysmon: true}, ""},
		{"sysmon idle", map[string]string{"WORLD_SIZE": "1", "NEXAR_IDLE_SYSMON": "1"}, Config{Rank: 0, WorldSize: 1}, ""},
		{"bad sysmon", map[string]string{"WORLD_SIZE": "1", "NEXAR_IDLE_SYSMON": "yes"}, Config{}, "NEXAR_IDLE_SYSMON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			read := func(string) ([]byte, error) { return []byte("filetoken\n"), nil }
			got, err := configFromLookup(lookup, read)
			if tc.err != "" {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
					t.Fatalf("got %v, want an error naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Rank != tc.want.Rank || got.WorldSize != tc.want.WorldSize || got.Seed != tc.want.Seed ||
				!bytes.Equal(got.Token, tc.want.Token) || got.Timeout != tc.want.Timeout || got.Join != tc.want.Join ||
				got.MinWorldSize != tc.want.MinWorldSize || got.MaxWorldSize != tc.want.MaxWorldSize || got.JoinAddr != tc.want.JoinAddr ||
				got.NormalSysmon != tc.want.NormalSysmon {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A stand-alone seed on rank 0's own address (as `nexar seed` on the first
// host): rank 0 finds the port taken and joins it instead of embedding one.
func TestStandaloneSeedOnRankZerosHost(t *testing.T) {
	token := []byte("standalone token")
	seed, err := StartSeed("127.0.0.1:0", 2, token)
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	comms := make([]*Comm, 2)
	errs := make(chan error, 2)
	for r := range comms {
		go func() {
			c, err := testNew(ctx, Config{Rank: r, WorldSize: 2, Seed: seed.Addr().String(), Token: token,
				BindAddr: "127.0.0.1:0", Logger: testConfig().Logger, NormalSysmon: true})
			comms[r] = c
			errs <- err
		}()
	}
	var failed error
	for range comms {
		if err := <-errs; err != nil {
			failed = err
		}
	}
	if failed != nil {
		closeAll(t, comms) // the rank that did join
		t.Fatal(failed)
	}
	defer closeAll(t, comms)
	select {
	case <-seed.Formed():
	default:
		t.Fatal("the stand-alone seed did not see the job form")
	}
	var wg sync.WaitGroup
	got := make([][]byte, 2)
	for r, c := range comms {
		wg.Go(func() {
			b := []byte{byte(r + 1), 0, 0, 0}
			if err := c.Allreduce(ctx, nil, b, collective.Int32, collective.Sum); err != nil {
				t.Error(err)
			}
			got[r] = b
		})
	}
	wg.Wait()
	for r, b := range got {
		if b[0] != 3 {
			t.Errorf("rank %d: allreduce gave %v, want 3", r, b)
		}
	}
}

// A seed port held by a stranger (no seed, wrong token) is not joined
// blindly: rank 0 fails with the join's error instead of hanging.
func TestSeedPortHeldByStranger(t *testing.T) {
	other, err := StartSeed("127.0.0.1:0", 2, []byte("another job's token"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = testNew(ctx, Config{Rank: 0, WorldSize: 2, Seed: other.Addr().String(), Token: []byte("this job's token"),
		BindAddr: "127.0.0.1:0", Logger: testConfig().Logger})
	if CodeOf(err) != CodeAuth {
		t.Fatalf("New: got %v, want CodeAuth", err)
	}
}
