//go:build cgo

package bulk

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport"
	trdma "github.com/nexar-go/nexar/transport/rdma"
	"github.com/nexar-go/nexar/transport/transporttest"
)

var _ RDMA = (*trdma.Device)(nil)

func fakeIBVerbs(t testing.TB) string {
	t.Helper()
	path, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// sharedRDMA lets the endpoints of one test process share a device (each
// closes it; the last Close releases it), as separate processes would each
// open their own.
type sharedRDMA struct {
	*trdma.Device
	mu   sync.Mutex
	refs int
}

func (s *sharedRDMA) Close() error {
	s.mu.Lock()
	s.refs--
	last := s.refs == 0
	s.mu.Unlock()
	if last {
		return s.Device.Close()
	}
	return nil
}

func openFakeRDMA(t testing.TB, dev string, users int) *sharedRDMA {
	t.Helper()
	d, err := trdma.Open(trdma.Options{Library: fakeIBVerbs(t), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	return &sharedRDMA{Device: d, refs: users}
}

// rdmaMesh is an n-rank mesh over QUIC whose data goes over RDMA on the
// fake device dev.
func rdmaMesh(t testing.TB, n int, opt Options, dev string, h []transport.Handler, down []transport.DownHandler) []*Endpoint {
	t.Helper()
	opt.RDMA = openFakeRDMA(t, dev, n)
	eps := mesh(t, n, opt, h, down)
	for i, e := range eps {
		for r, p := range e.Paths() {
			if r != i && !strings.HasPrefix(p, "rdma "+dev+":1") {
				t.Fatalf("rank %d: path to %d is %q, want rdma on %s", i, r, p, dev)
			}
		}
	}
	return eps
}

func TestRDMAConformance(t *testing.T) {
	for _, dev := range []string{"fake_roce0", "fake_ib0"} {
		t.Run(dev, func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
				eps := rdmaMesh(t, n, Options{Mode: ModeRDMA}, dev, h, down)
				out := make([]transport.Endpoint, n)
				for i, e := range eps {
					out[i] = e
				}
				return out
			})
		})
	}
}

func TestRDMADataPath(t *testing.T) {
	transporttest.RunDataPath(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath {
		eps := rdmaMesh(t, n, Options{Mode: ModeRDMA}, "fake_roce0", h, down)
		out := make([]transport.DataPath, n)
		for i, e := range eps {
			out[i] = e
		}
		return out
	})
}

// TestRDMAChoice: under auto, ranks of one host keep shared memory, ranks
// of different hosts take RDMA where both have a device, and TCP where
// one has none.
func TestRDMAChoice(t *testing.T) {
	tests := []struct {
		name    string
		hosts   []string
		devices []bool
		want    [][]string // want[i][r]: prefix of the path from i to r
	}{
		{"one host", []string{"h", "h"}, []bool{true, true}, [][]string{{"loopback", "shm"}, {"shm", "loopback"}}},
		{"two hosts", []string{"a", "b"}, []bool{true, true}, [][]string{{"loopback", "rdma fake_roce0:1 roce v2"}, {"rdma fake_roce0:1 roce v2", "loopback"}}},
		{"one without a device", []string{"a", "b"}, []bool{true, false}, [][]string{{"loopback", "tcp"}, {"tcp", "loopback"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := 0
			for _, d := range tt.devices {
				if d {
					devs++
				}
			}
			shared := openFakeRDMA(t, "", devs)
			eps := meshWithOpts(t, 2, func(i int, o *Options) {
				o.Mode, o.HostID = ModeAuto, tt.hosts[i]
				if tt.devices[i] {
					o.RDMA = shared
				}
			})
			for i, e := range eps {
				if tt.hosts[0] == tt.hosts[1] {
					waitPaths(t, eps, "")
				}
				for r, p := range e.Paths() {
					if !strings.HasPrefix(p, tt.want[i][r]) {
						t.Errorf("rank %d: path to %d is %q, want %q", i, r, p, tt.want[i][r])
					}
				}
			}
		})
	}
}

// meshWithOpts is mesh with each rank's options edited by set.
func meshWithOpts(t testing.TB, n int, set func(int, *Options)) []*Endpoint {
	t.Helper()
	var mu sync.Mutex
	eps := meshWith(t, n, Options{}, nil, nil, func(i int, e *Endpoint) {
		mu.Lock()
		defer mu.Unlock()
		set(i, &e.opt)
	})
	t.Cleanup(func() {
		for _, e := range eps {
			e.Close()
		}
	})
	return eps
}

// TestRDMAChannelLost: the receiving end's queue pair goes into error
// while its process lives on (a fatal NIC error): the sender's next
// message is dropped and fails at the NIC (transport retries exhausted),
// and the sender reports the peer down, naming it, as core's PeerDown flow
// needs; nothing hangs and nothing leaks.
func TestRDMAChannelLost(t *testing.T) {
	lib := fakeIBVerbs(t)
	base, err := ibverbs.Live(lib)
	if err != nil && !strings.Contains(err.Error(), "not loaded") {
		t.Fatal(err)
	}
	downs := make(chan error, 4)
	eps := rdmaMesh(t, 2, Options{Mode: ModeRDMA}, "fake_ib0", nil, []transport.DownHandler{func(peer int, err error) {
		if peer == 1 {
			downs <- err
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var h transport.Header
	if err := eps[0].Send(ctx, 1, transport.LaneData, &h, []byte("first")); err != nil {
		t.Fatal(err)
	}
	breakInbound(t, eps[1], 0)
	start := time.Now()
	var sendErr error
	for sendErr == nil && time.Since(start) < 20*time.Second {
		sendErr = eps[0].Send(ctx, 1, transport.LaneData, &h, bytes.Repeat([]byte{1}, 100<<10))
	}
	var pd *transport.PeerDownError
	if !errors.As(sendErr, &pd) || pd.Peer != 1 || !strings.Contains(sendErr.Error(), "rank 1") {
		t.Fatalf("send after the channel was lost: %v, want a PeerDownError naming rank 1", sendErr)
	}
	expectDown(t, downs, start, 10*time.Second)
	for _, e := range eps {
		e.Close()
	}
	if base.QPs >= 0 {
		if after, err := ibverbs.Live(lib); err == nil && (after.QPs != base.QPs || after.MRs != base.MRs || after.CQs != base.CQs) {
			t.Errorf("live objects after close: %+v, before %+v", after, base)
		}
	}
}

// breakInbound puts e's receiving end of the RDMA channel from rank from
// into the error state, as a fatal NIC error does, once e accepted it.
func breakInbound(t *testing.T, e *Endpoint, from int) {
	t.Helper()
	var in RDMAEnd
	for deadline := time.Now().Add(10 * time.Second); in == nil; time.Sleep(time.Millisecond) {
		e.mu.Lock()
		in, _ = rdmaChannel(e.in[from])
		e.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("rank %d has no inbound channel from rank %d", e.self, from)
		}
	}
	if err := in.(interface{ Break() error }).Break(); err != nil {
		t.Fatal(err)
	}
}

// TestRDMASendFailsUnwatched: the receiving end's queue pair goes into
// error, and the sender hands one short message to the NIC (Send returns
// once it is posted) and sends nothing more: the failed delivery, which no
// later send and no reader would tell, reports the peer down, naming it.
func TestRDMASendFailsUnwatched(t *testing.T) {
	downs := make(chan error, 4)
	eps := rdmaMesh(t, 2, Options{Mode: ModeRDMA}, "fake_ib0", nil, []transport.DownHandler{func(peer int, err error) {
		if peer == 1 {
			downs <- err
		}
	}})
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var h transport.Header
	if err := eps[0].Send(ctx, 1, transport.LaneData, &h, []byte("first")); err != nil {
		t.Fatal(err)
	}
	breakInbound(t, eps[1], 0)
	start := time.Now()
	if err := eps[0].Send(ctx, 1, transport.LaneData, &h, []byte("second")); err != nil {
		t.Fatalf("a short send is posted and returns before delivery: %v", err)
	}
	expectDown(t, downs, start, 20*time.Second)
}

// expectDown waits (within d) for the DownHandler's notice of rank 1,
// which must name the rank and the path.
func expectDown(t *testing.T, downs <-chan error, start time.Time, d time.Duration) {
	t.Helper()
	select {
	case err := <-downs:
		if !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "rdma") {
			t.Errorf("down notice %q does not name the rank and the path", err)
		}
		t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(d):
		t.Fatal("rank 1 was never reported down")
	}
}
