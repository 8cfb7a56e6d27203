package mem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/mem"
	"github.com/nexar-go/nexar/transport/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.Endpoint {
		eps := make([]transport.Endpoint, n)
		for i, e := range mem.NewMesh(n, h, down) {
			eps[i] = e
		}
		return eps
	})
}

func TestDataPath(t *testing.T) {
	transporttest.RunDataPath(t, func(t *testing.T, n int, h []transport.Handler, down []transport.DownHandler) []transport.DataPath {
		return mem.NewMesh(n, h, down)
	})
}

func TestKill(t *testing.T) {
	const n = 3
	downs := make(chan [2]int, 8)
	dh := make([]transport.DownHandler, n)
	for i := range dh {
		dh[i] = func(peer int, err error) {
			var pd *transport.PeerDownError
			if !errors.As(err, &pd) || pd.Peer != peer {
				t.Errorf("rank %d: down(%d, %v): want *PeerDownError", i, peer, err)
			}
			downs <- [2]int{i, peer}
		}
	}
	eps := mem.NewMesh(n, nil, dh)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	mem.Kill(eps[1])
	mem.Kill(eps[1]) // idempotent
	got := map[[2]int]bool{}
	for range 2 {
		select {
		case d := <-downs:
			got[d] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("down notifications: got %v", got)
		}
	}
	if !got[[2]int{0, 1}] || !got[[2]int{2, 1}] {
		t.Fatalf("down notifications: got %v, want ranks 0 and 2 told about 1", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var pd *transport.PeerDownError
	if err := eps[0].Send(ctx, 1, transport.LaneData, nil, nil); !errors.As(err, &pd) {
		t.Fatalf("Send to killed rank: got %v, want *PeerDownError", err)
	}
	if err := eps[1].Send(ctx, 0, transport.LaneData, nil, nil); err == nil {
		t.Fatalf("Send from killed rank succeeded")
	}
	if err := eps[0].Send(ctx, 2, transport.LaneData, nil, nil); err != nil {
		t.Fatalf("survivors: %v", err)
	}
}
