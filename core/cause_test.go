package core

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// causeWorlds builds 4-rank worlds (in-memory and loopback QUIC) with cfg.
func causeWorlds(cfg Config) []struct {
	name string
	make func(t *testing.T) []*Comm
} {
	mk := func(f func(int, Config) ([]*Comm, error)) func(t *testing.T) []*Comm {
		return func(t *testing.T) []*Comm {
			t.Helper()
			comms, err := f(4, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, c := range comms {
					c.n.thaw()
				}
				closeAll(t, comms)
			})
			return comms
		}
	}
	quicCfg := cfg
	quicCfg.Bulk = "off"
	return []struct {
		name string
		make func(t *testing.T) []*Comm
	}{
		{"mem", mk(testNewLocal)},
		{"quic", mk(func(n int, _ Config) ([]*Comm, error) { return testNewLocalQUIC(n, quicCfg) })},
	}
}

// wantNamed checks that err is a CodePeerDown *Error about rank, whose
// message holds every want.
func wantNamed(t *testing.T, what string, err error, rank int, want ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("%s: %v, want a *Error naming rank %d", what, err, rank)
		return
	}
	if e.Code != CodePeerDown || e.Rank != rank {
		t.Errorf("%s: code %v rank %d (%v), want %v rank %d", what, e.Code, e.Rank, err, CodePeerDown, rank)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not mention %q", what, err, w)
		}
	}
}

// TestByeCarriesCause: rank 2 stops; rank 1 declares it dead before the
// others do and destroys its communicator at once. Ranks 0 and 3 must fail
// naming rank 2 (as reported by rank 1), not rank 1's departure, and their
// communicator must be failed (Err, hence nexar_comm_get_error, not nil).
func TestByeCarriesCause(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatTimeout = time.Minute // only rank 1 declares rank 2 dead
	for _, w := range causeWorlds(cfg) {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t)
			comms[2].n.freeze()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			reqs := make([]*Request, 4)
			for _, r := range []int{0, 1, 3} {
				reqs[r] = comms[r].IAllreduce(nil, make([]byte, 4096), collective.Float32, collective.Sum)
			}
			time.Sleep(50 * time.Millisecond)
			comms[1].n.peerDown(2, "no heartbeat for 3s", nil)
			wantNamed(t, "rank 1", reqs[1].Wait(ctx), 2, "rank 2 is unreachable")
			// Close returns once the endpoint is closed, which may wait for
			// the stopped rank; the others must fail before that.
			closed := time.Now()
			closeErr := make(chan error, 1)
			go func() { closeErr <- comms[1].Close() }()
			defer func() {
				if err := <-closeErr; err != nil {
					t.Error(err)
				}
			}()
			for _, r := range []int{0, 3} {
				err := reqs[r].Wait(ctx)
				took := time.Since(closed)
				wantNamed(t, "pending allreduce", err, 2, "rank 2 is unreachable", "no heartbeat for 3s", "reported by rank 1")
				t.Logf("rank %d failed %v after rank 1 closed: %v", r, took, err)
				if took > 2*time.Second {
					t.Errorf("rank %d failed %v after rank 1 closed, want < 2s", r, took)
				}
				wantNamed(t, "Err", comms[r].Err(), 2, "reported by rank 1")
				wantNamed(t, "next barrier", comms[r].Barrier(ctx), 2, "reported by rank 1")
			}
		})
	}
}

// TestResumedRankLearnsItWasDeclaredDead: a rank stopped past the heartbeat
// timeout (SIGSTOP) and then resumed must be told that the others declared
// it unreachable, not that a healthy peer is.
//
// Its first call may instead succeed, with the right sum: everything it
// needed was already waiting for it (the survivors sent their part before
// they gave up on it), and the notice travels on another lane, so it can
// be handled after the data. That is the non-uniform outcome ULFM allows
// (a collective may succeed at some ranks and fail at others); the call
// after it must fail, saying this rank was declared unreachable.
func TestResumedRankLearnsItWasDeclaredDead(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
	for _, w := range causeWorlds(cfg) {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			comms[2].n.freeze()
			const n = 1024
			input := func(r int) []byte {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(r + 1)
				}
				return f32s(v...)
			}
			reqs := make([]*Request, 4)
			for _, r := range []int{0, 1, 3} {
				reqs[r] = comms[r].IAllreduce(nil, input(r), collective.Float32, collective.Sum)
			}
			for _, r := range []int{0, 1, 3} {
				wantNamed(t, "survivor", reqs[r].Wait(ctx), 2, "rank 2 is unreachable", "no heartbeat")
			}
			time.Sleep(cfg.HeartbeatTimeout) // stopped well past the timeout
			thawed := time.Now()
			comms[2].n.thaw()
			buf := input(2)
			err := comms[2].Allreduce(ctx, nil, buf, collective.Float32, collective.Sum)
			took := time.Since(thawed)
			if err == nil {
				// Every part had arrived before the survivors gave up: the
				// sum must be whole, and the next call must fail.
				for i := 0; i < n; i++ {
					if got := getF32(buf, i); got != 1+2+3+4 {
						t.Fatalf("resumed rank's allreduce succeeded with element %d = %v, want 10", i, got)
					}
				}
				t.Logf("resumed rank's first allreduce completed %v after it resumed, with the right sum", took)
				err = comms[2].Barrier(ctx)
				took = time.Since(thawed)
			}
			t.Logf("resumed rank failed %v after it resumed: %v", took, err)
			wantNamed(t, "resumed rank", err, 2, "this rank (2) was declared unreachable by rank", "no heartbeat")
			if took > 2*time.Second {
				t.Errorf("resumed rank failed %v after it resumed, want < 2s", took)
			}
			wantNamed(t, "resumed rank Err", comms[2].Err(), 2, "this rank (2) was declared unreachable")
			// It must stay so: no healthy peer is blamed later.
			time.Sleep(2 * cfg.HeartbeatTimeout)
			wantNamed(t, "resumed rank later", comms[2].Barrier(ctx), 2, "this rank (2) was declared unreachable")
		})
	}
}

// TestResumedRankLosesConnectionFirst: a rank resumed after a stop past the
// heartbeat timeout may see a connection drop (e.g. QUIC's idle timer
// firing at once) before it reads the notice that it was declared
// unreachable; it must still not blame the healthy peer.
func TestResumedRankLosesConnectionFirst(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
	comms, err := testNewLocal(4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	defer comms[2].n.thaw()
	comms[2].n.freeze()
	time.Sleep(cfg.HeartbeatTimeout + 500*time.Millisecond)
	// On resume, before anything is read or the monitor runs.
	comms[2].n.onDown(0, errors.New("quic: idle timeout"))
	wantNamed(t, "resumed rank", comms[2].Err(), 2, "this rank (2) was stopped or stalled", "lost rank 0", "idle timeout")
	comms[2].n.thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wantNamed(t, "resumed rank later", comms[2].Barrier(ctx), 2, "this rank (2) was stopped or stalled")
	t.Logf("resumed rank: %v", comms[2].Err())
}

// TestAbortBlamesNamedRank: rank 2 fails because rank 3 died and tells the
// others; they must blame rank 3, the rank its failure names, not the
// messenger (a CI failure: "rank 0 blames rank 2, want rank 3"). An abort
// naming no rank, and a mismatch, blame the sender.
func TestAbortBlamesNamedRank(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cause    *Error
		wantRank int
		wantMsg  string
	}{
		{"names dead rank", &Error{Code: CodePeerDown, Rank: 3, Msg: "rank 3 is unreachable"}, 3, "rank 2 failed: rank 3 is unreachable"},
		{"names none", &Error{Code: CodeTimeout, Rank: -1, Msg: "deadline"}, 2, "rank 2 failed: deadline"},
		{"mismatch", &Error{Code: CodeMismatch, Rank: 1, Msg: "rank 2 called x but rank 1 called y"}, 2, "rank 2 called x but rank 1 called y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, err := testNewLocal(4, Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			comms[0].control(2, header{kind: kindControl, sub: ctlAbort, comm: comms[0].id}, encodeCause(tc.cause))
			var e *Error
			if !errors.As(comms[0].Err(), &e) {
				t.Fatalf("Err() = %v, want a *Error", comms[0].Err())
			}
			if e.Code != tc.cause.Code || e.Rank != tc.wantRank || !strings.Contains(e.Msg, tc.wantMsg) {
				t.Errorf("got code %v rank %d %q, want code %v rank %d containing %q", e.Code, e.Rank, e.Msg, tc.cause.Code, tc.wantRank, tc.wantMsg)
			}
		})
	}
}
