package core

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/transport"
	nquic "github.com/nexar-go/nexar/transport/quic"
)

func freeSeedAddr(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

func randomToken(t *testing.T) []byte {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// A peer that leaves while rank 0 is still forming the job (here: it joins
// the seed and the QUIC mesh, then closes before answering the bulk
// negotiation) must fail rank 0's New at once with CodePeerDown naming it,
// not after the connect timeout.
func TestNewFailsFastWhenPeerLeavesDuringFormation(t *testing.T) {
	seed, token := freeSeedAddr(t), randomToken(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		c   *Comm
		err error
		d   time.Duration
	}
	res := make(chan result, 1)
	go func() {
		cfg := testConfig()
		cfg.Rank, cfg.WorldSize, cfg.Seed, cfg.Token = 0, 2, seed, token
		cfg.ConnectTimeout = 20 * time.Second
		start := time.Now()
		c, err := testNew(ctx, cfg)
		res <- result{c, err, time.Since(start)}
	}()

	// Rank 1 by hand: rendezvous and mesh, then gone.
	id, err := nquic.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	qn, err := nquic.Listen(id, nquic.Options{BindAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	rank, peers, err := joinSeed(ctx, seed, token, 1, qn.Addr().String(), id.Fingerprint)
	if err != nil || rank != 1 {
		qn.Close()
		t.Fatalf("join: rank %d, %v", rank, err)
	}
	ep, err := qn.Connect(ctx, 1, peers, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	ep.Close()

	r := <-res
	if r.c != nil {
		r.c.Close()
	}
	since := time.Since(left)
	t.Logf("rank 0's New returned %v after rank 1 left (%v in all): %v", since.Round(time.Millisecond), r.d.Round(time.Millisecond), r.err)
	if r.err == nil {
		t.Fatalf("New succeeded although rank 1 left during formation")
	}
	if CodeOf(r.err) != CodePeerDown || !strings.Contains(r.err.Error(), "rank 1") {
		t.Errorf("got %v (code %v), want CodePeerDown naming rank 1", r.err, CodeOf(r.err))
	}
	var e *Error
	if errors.As(r.err, &e) && e.Rank != 1 {
		t.Errorf("error's Rank is %d, want 1", e.Rank)
	}
	if since > 3*time.Second {
		t.Errorf("New failed %v after rank 1 left, want well under the connect timeout (< 3 s)", since)
	}
}

// Init, close, init again with the same configuration (as destroy and init
// with the same MASTER_ADDR/MASTER_PORT): the second world must form and
// work, also when one rank gets there before the other has closed the first.
func TestNewAgainOnSameSeed(t *testing.T) {
	seed, token := freeSeedAddr(t), randomToken(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfgFor := func(r int) Config {
		cfg := testConfig()
		cfg.Rank, cfg.WorldSize, cfg.Seed, cfg.Token = r, 2, seed, token
		cfg.BindAddr = "127.0.0.1:0"
		cfg.ConnectTimeout = 20 * time.Second
		return cfg
	}
	use := func(c *Comm, v int32) error {
		send := []byte{byte(v), 0, 0, 0}
		recv := make([]byte, 4)
		if err := c.Allreduce(ctx, send, recv, collective.Int32, collective.Sum); err != nil {
			return err
		}
		if recv[0] != byte(2*v) {
			return fmt.Errorf("allreduce gave %d, want %d", recv[0], 2*v)
		}
		return nil
	}
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			errs <- func() error {
				for world := 1; world <= 3; world++ {
					start := time.Now()
					c, err := testNew(ctx, cfgFor(r))
					if err != nil {
						return fmt.Errorf("rank %d, world %d: %w", r, world, err)
					}
					err = use(c, int32(world))
					if r == 0 {
						// Rank 1 is already on its way into the next world.
						time.Sleep(300 * time.Millisecond)
					}
					c.Close()
					if err != nil {
						return fmt.Errorf("rank %d, world %d: %w", r, world, err)
					}
					t.Logf("rank %d: world %d formed and used in %v", r, world, time.Since(start).Round(time.Millisecond))
				}
				return nil
			}()
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A joiner that reaches the seed of an earlier job that has already formed
// (the previous world on the same address, not closed yet) waits for the
// next seed there instead of failing.
func TestJoinWaitsPastAFormedSeed(t *testing.T) {
	addr, token := freeSeedAddr(t), randomToken(t)
	old, err := StartSeed(addr, 1, token)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := joinSeed(ctx, addr, token, 0, "127.0.0.1:1", [32]byte{1}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, peers, err := joinSeed(ctx, addr, token, 0, "127.0.0.1:2", [32]byte{2})
		if err == nil && (len(peers) != 1 || peers[0].Addr != "127.0.0.1:2") {
			err = fmt.Errorf("peer table %+v is not the new job's", peers)
		}
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("join returned while only the formed seed was there: %v", err)
	default:
	}
	old.Close()
	next, err := StartSeed(addr, 1, token)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// With no next seed, the joiner gives up at its deadline with an error
	// that says what it found.
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	defer scancel()
	_, _, err = joinSeed(sctx, addr, token, 0, "127.0.0.1:3", [32]byte{3})
	if CodeOf(err) != CodeTimeout || !strings.Contains(err.Error(), "already formed") {
		t.Fatalf("got %v, want CodeTimeout saying the job had already formed", err)
	}
}

func TestBindAddrChoice(t *testing.T) {
	var lan net.IP // a non-loopback IPv4 address of this host, if any
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			lan = n.IP
			break
		}
	}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"loopback seed", Config{Seed: "127.0.0.1:29400"}, "127.0.0.1:0"},
		{"localhost seed", Config{Seed: "localhost:29400"}, "127.0.0.1:0"},
		{"explicit", Config{Seed: "127.0.0.1:29400", BindAddr: "0.0.0.0:7"}, "0.0.0.0:7"},
		{"foreign advertise", Config{Seed: "127.0.0.1:29400", AdvertiseAddr: "203.0.113.7:5000"}, "127.0.0.1:0"},
	}
	if lan != nil {
		cases = append(cases,
			struct {
				name string
				cfg  Config
				want string
			}{"seed on this host's LAN address", Config{Seed: net.JoinHostPort(lan.String(), "29400")}, net.JoinHostPort(lan.String(), "0")},
			struct {
				name string
				cfg  Config
				want string
			}{"local advertise", Config{Seed: "127.0.0.1:29400", AdvertiseAddr: lan.String()}, net.JoinHostPort(lan.String(), "0")})
	} else {
		t.Log("no non-loopback IPv4 address: LAN cases skipped")
	}
	for seed, want := range map[string]string{"127.0.0.1:5": "127.0.0.1:5", "localhost:5": "127.0.0.1:5"} {
		if got := seedBindAddr(context.Background(), seed); got != want {
			t.Errorf("seedBindAddr(%q) = %q, want %q", seed, got, want)
		}
	}
	for _, tc := range cases {
		got, err := bindAddr(tc.cfg)
		if err != nil || got != tc.want {
			t.Errorf("%s: bindAddr = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// procSockets maps the inode of every socket this process holds to its
// /proc/net table ("udp", "tcp", ...), local address and state.
type procSocket struct {
	table, local, state string
}

func procSockets(t *testing.T) map[string]procSocket {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	out := map[string]procSocket{}
	for _, table := range []string{"udp", "udp6", "tcp", "tcp6"} {
		b, err := os.ReadFile("/proc/net/" + table)
		if err != nil {
			continue
		}
		for i, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if i == 0 || len(f) < 10 || !mine[f[9]] {
				continue
			}
			out[f[9]] = procSocket{table: table, local: f[1], state: f[3]}
		}
	}
	return out
}

// With no bind address, a job's sockets are on the address that reaches
// the seed (here loopback), not on every interface, and a job whose ranks
// all share this host's memory has no TCP listener.
func TestNewBindsNoWildcard(t *testing.T) {
	if _, err := os.Stat("/proc/net/udp"); err != nil {
		t.Skip("no /proc/net/udp to read the sockets from")
	}
	before := procSockets(t)
	seed, token := freeSeedAddr(t), randomToken(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	comms := make([]*Comm, 2)
	errs := make(chan error, 2)
	for r := range comms {
		go func() {
			cfg := testConfig()
			cfg.Rank, cfg.WorldSize, cfg.Seed, cfg.Token = r, 2, seed, token
			c, err := testNew(ctx, cfg)
			comms[r] = c
			errs <- err
		}()
	}
	for range comms {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	defer closeAll(t, comms)
	if t.Failed() {
		return
	}
	allSHM := true
	for _, c := range comms {
		for r, p := range c.Paths() {
			if r != c.Rank() && !strings.HasPrefix(p, "shm") {
				allSHM = false
			}
		}
	}
	n := 0
	for ino, s := range procSockets(t) {
		if _, ok := before[ino]; ok {
			continue
		}
		n++
		host := s.local[:strings.IndexByte(s.local, ':')]
		if strings.Trim(host, "0") == "" {
			t.Errorf("a %s socket is bound to every interface (%s)", s.table, s.local)
		}
		if strings.HasPrefix(s.table, "tcp") && s.state == "0A" && allSHM {
			t.Errorf("a TCP listener (%s) exists although every peer is on this host's shared memory", s.local)
		}
	}
	if n < 2 {
		t.Errorf("found %d new sockets, want at least the two ranks' mesh sockets", n)
	}
	if !allSHM {
		t.Logf("not every path is shared memory (%v): TCP listener not checked", comms[0].Paths())
	}
}

// TestRankLostBetweenJoinAndMesh: a rank that joined the seed and then died
// before it connected to anyone (killed, or its process crashed) ends the
// others' formation once the seed notices (its connection closed, or silent
// for its link's idle timeout), with an error naming it; before, they
// waited for the connect timeout (60 s here, 30 min under torch). A joiner
// that asked for a longer idle timeout (as New does when HeartbeatTimeout
// is longer) is given that long, not the default.
func TestRankLostBetweenJoinAndMesh(t *testing.T) {
	for _, tc := range []struct {
		name    string
		die     func(l *membership.SeedLink)
		idle    time.Duration // rank 2's JoinOptions.IdleTimeout
		atLeast time.Duration
		bound   time.Duration
	}{
		{"crashed", (*membership.SeedLink).SimulateCrash, 0, 0, 3 * time.Second},
		{"silent", (*membership.SeedLink).SimulateSilence, 0, 0, membership.IdleTimeout + 5*time.Second},
		{"silent_longer_idle", (*membership.SeedLink).SimulateSilence, 9 * time.Second, 7 * time.Second, 9*time.Second + 5*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			token := randomToken(t)
			seed, err := StartSeed("127.0.0.1:0", 3, token)
			if err != nil {
				t.Fatal(err)
			}
			defer seed.Close()
			addr := seed.Addr().String()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			type res struct {
				c   *Comm
				err error
				at  time.Time
			}
			out := make(chan res, 2)
			for r := range 2 {
				go func() {
					cfg := testConfig()
					cfg.Rank, cfg.WorldSize, cfg.Seed, cfg.Token = r, 3, addr, token
					cfg.ConnectTimeout = 60 * time.Second
					c, err := testNew(ctx, cfg)
					out <- res{c, err, time.Now()}
				}()
			}
			_, _, l, err := membership.JoinWatched(ctx, addr, token, 2, "127.0.0.1:1", [32]byte{9}, membership.JoinOptions{IdleTimeout: tc.idle})
			if err != nil {
				t.Fatal(err)
			}
			died := time.Now()
			tc.die(l)
			for range 2 {
				r := <-out
				if r.c != nil {
					r.c.Close()
					t.Fatal("formation succeeded without rank 2")
				}
				took := r.at.Sub(died)
				t.Logf("failed %v after rank 2 died: %v", took.Round(time.Millisecond), r.err)
				var e *Error
				if !errors.As(r.err, &e) || e.Code != CodePeerDown || e.Rank != 2 || !strings.Contains(e.Msg, "rank 2") {
					t.Errorf("got %v, want a CodePeerDown error naming rank 2", r.err)
				}
				if took > tc.bound || took < tc.atLeast {
					t.Errorf("formation failed %v after rank 2 died, want in [%v, %v]", took, tc.atLeast, tc.bound)
				}
				if tc.idle > 0 && !strings.Contains(e.Msg, "silent for "+tc.idle.String()) {
					t.Errorf("got %q, want it to say rank 2 was silent for %v", e.Msg, tc.idle)
				}
			}
			l.CloseSocket()
		})
	}
}

// joinSeed is membership.Join with core's errors, as New sees them.
func joinSeed(ctx context.Context, addr string, token []byte, rank int, advertise string, fp [32]byte) (int, []nquic.Peer, error) {
	r, peers, err := membership.Join(ctx, addr, token, rank, advertise, fp)
	return r, peers, fromMembership(err)
}

// A rank whose data path forms late (a TCP connect on a lossy link, whose
// SYN is retried after 1 s) is not declared unreachable by the peers that
// formed first and watch it: it heartbeats while it forms. The CI run that
// found this failed with "rank 0 is unreachable: no heartbeat for 3s" on
// the rank that formed first.
func TestSlowFormerKeepsHeartbeating(t *testing.T) {
	const n, slow = 3, 2
	token := randomToken(t)
	seed, err := StartSeed("127.0.0.1:0", n, token)
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, 600*time.Millisecond
	cfg.WorldSize, cfg.Token, cfg.Seed = n, token, seed.Addr().String()
	cfg.BindAddr, cfg.ConnectTimeout = "127.0.0.1:0", 30*time.Second
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := cfg
			c.Rank = i
			var o formOpts
			if i == slow {
				o.dataDelay = 4 * c.HeartbeatTimeout
			}
			comms[i], errs[i] = testForm(context.Background(), c, o)
		})
	}
	wg.Wait()
	defer each(comms, func(c *Comm) error {
		if c != nil {
			c.Close()
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	errs = each(comms, func(c *Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		buf := f32s(float32(c.Rank() + 1))
		if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
			return err
		}
		if got := getF32(buf, 0); got != n*(n+1)/2 {
			return fmt.Errorf("sum %v, want %d", got, n*(n+1)/2)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// A formation that ends because a peer gave up on this rank says so; it
// does not call that live peer lost.
func TestPeerLostErrorSaysWho(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&transport.PeerDownError{Peer: 1, Cause: fmt.Errorf("rank 1 declared rank 2 down: no heartbeat for 3s: %w", transport.ErrDeclaredDown)},
			"rank 1 declared this rank unreachable while the job was forming"},
		{&transport.PeerDownError{Peer: 1, Cause: transport.ErrPeerClosed}, "rank 1 closed its communicator while the job was forming"},
		{errors.New("the seed lost it: crashed"), "rank 1 was lost while the job was forming"},
	} {
		if got := (&peerLostError{peer: 1, err: tc.err}).Error(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("got %q, want it to start %q", got, tc.want)
		}
	}
}
