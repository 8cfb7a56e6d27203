//go:build linux

package bulk

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/internal/procwatch"
	"github.com/nexar-go/nexar/internal/procwatch/procwatchtest"
	"github.com/nexar-go/nexar/transport"
)

// child is procwatchtest.Child without its reap.
func child(t *testing.T) (*exec.Cmd, procwatch.ID) {
	cmd, id, _ := procwatchtest.Child(t)
	return cmd, id
}

// TestLocalPeerExitReported: rank 1 of a two-rank mesh claims the identity
// of a child process (as if it ran there). When that process is killed,
// rank 0's DownHandler hears of rank 1's death at once, the cause saying
// the process exited, with no data ever sent (the rings are made on first
// use; the process is learnt at formation).
func TestLocalPeerExitReported(t *testing.T) {
	c, id := child(t)
	downs := make(chan error, 4)
	eps := meshWith(t, 2, Options{Mode: ModeSHM}, nil,
		[]transport.DownHandler{func(peer int, err error) { downs <- err }, nil},
		func(i int, e *Endpoint) {
			if i == 1 {
				e.me = id
			}
		})
	defer eps[0].Close()
	defer eps[1].Close()
	if eps[0].watch == nil || !eps[0].watch.Watching(1) {
		t.Skipf("rank 0 does not watch rank 1's process (%v)", eps[0].watchErr)
	}
	c.Process.Kill()
	select {
	case err := <-downs:
		var pd *transport.PeerDownError
		if !errors.As(err, &pd) || pd.Peer != 1 || !strings.Contains(err.Error(), "exited") ||
			!strings.Contains(err.Error(), strconv.Itoa(id.PID)) {
			t.Fatalf("down: %v, want peer 1's process %d exited", err, id.PID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the local peer's death was not reported")
	}
}

// TestLocalPeerExitAfterCloseIsDeparture: rank 1 closes gracefully, then
// its process exits: rank 0 hears of a departure, never of a death.
func TestLocalPeerExitAfterCloseIsDeparture(t *testing.T) {
	c, id := child(t)
	var mu sync.Mutex
	var downs []error
	eps := meshWith(t, 2, Options{Mode: ModeSHM}, nil,
		[]transport.DownHandler{func(peer int, err error) {
			mu.Lock()
			downs = append(downs, err)
			mu.Unlock()
		}, nil},
		func(i int, e *Endpoint) {
			if i == 1 {
				e.me = id
			}
		})
	defer eps[0].Close()
	if eps[0].watch == nil || !eps[0].watch.Watching(1) {
		t.Skipf("rank 0 does not watch rank 1's process (%v)", eps[0].watchErr)
	}
	eps[1].Close()
	eps[0].mu.Lock()
	departing := eps[0].departing[1]
	eps[0].mu.Unlock()
	if !departing {
		t.Fatal("rank 1's Close returned before rank 0 had its goodbye")
	}
	c.Process.Kill()
	for deadline := time.Now().Add(30 * time.Second); eps[0].watch.Watching(1); {
		if time.Now().After(deadline) {
			t.Fatal("exit not seen")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Close waits for the watch goroutine, which has taken rank 1's exit
	// and so reports it (or not) before it stops.
	eps[0].Close()
	mu.Lock()
	defer mu.Unlock()
	for _, err := range downs {
		if !errors.Is(err, transport.ErrPeerClosed) {
			t.Errorf("down after a graceful close: %v", err)
		}
	}
}

// TestLocalPeerExitDrainsRing: what a local peer wrote into its ring before
// its process died is delivered before its death is reported. Rank 0's
// handler holds the first message while rank 1's process is killed; the
// second, still in the ring, must come before the down.
func TestLocalPeerExitDrainsRing(t *testing.T) {
	c, id := child(t)
	var mu sync.Mutex
	var got []string
	first := make(chan struct{})
	release := make(chan struct{})
	downed := make(chan error, 1)
	h := func(_ int, lane transport.Lane, _ *transport.Header, p []byte) {
		if lane != transport.LaneData {
			return
		}
		mu.Lock()
		got = append(got, string(p))
		n := len(got)
		mu.Unlock()
		if n == 1 {
			close(first)
			<-release
		}
	}
	eps := meshWith(t, 2, Options{Mode: ModeSHM}, []transport.Handler{h, nil},
		[]transport.DownHandler{func(peer int, err error) {
			mu.Lock()
			got = append(got, "down")
			mu.Unlock()
			downed <- err
		}, nil},
		func(i int, e *Endpoint) {
			switch i {
			case 0:
				e.drainMax = time.Minute // this test's order, not the bound
			case 1:
				e.me = id
			}
		})
	defer eps[0].Close()
	defer eps[1].Close()
	if eps[0].watch == nil || !eps[0].watch.Watching(1) {
		t.Skipf("rank 0 does not watch rank 1's process (%v)", eps[0].watchErr)
	}
	for _, m := range []string{"one", "two"} {
		if err := eps[1].Send(t.Context(), 0, transport.LaneData, nil, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if !eps[1].SharedMemory(0) {
		t.Skip("no shared-memory ring")
	}
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing delivered")
	}
	c.Process.Kill()
	for deadline := time.Now().Add(30 * time.Second); eps[0].watch.Watching(1); {
		if time.Now().After(deadline) {
			t.Fatal("exit not seen")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	select {
	case err := <-downed:
		if !strings.Contains(err.Error(), "exited") {
			t.Fatalf("down: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the death was not reported")
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ",") != "one,two,down" {
		t.Fatalf("rank 0 saw %v, want one, two, then down", got)
	}
}
