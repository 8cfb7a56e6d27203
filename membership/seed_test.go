package membership

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// A member told of a loss fails its formation and reports it; the others
// must hear of the first loss before they hear of that member's, or they
// name a live rank. Rank 1 joins first, so the seed tells it of rank 2's
// crash first; it reports its failure at once, during the gap the test
// puts after each notice, and rank 0's first notice must still name
// rank 2. Before the seed ordered its notices, rank 0 was told "rank 1 was
// lost: its formation of the mesh failed" (core's
// TestRankLostBetweenJoinAndMesh, once, under load).
func TestSeedNoticesInCausalOrder(t *testing.T) {
	token := []byte("seed-order-token")
	s, err := StartSeed("127.0.0.1:0", 3, token, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.noticeGap = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	links := make([]*SeedLink, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i, r := range []int{1, 0, 2} { // join order
		wg.Go(func() {
			_, _, links[r], errs[r] = JoinWatched(ctx, s.Addr().String(), token, r, "127.0.0.1:1", [32]byte{byte(r)})
		})
		for deadline := time.Now().Add(10 * time.Second); ; {
			s.mu.Lock()
			joined := len(s.members)
			s.mu.Unlock()
			if joined == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d members joined, want %d", joined, i+1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer links[0].Finish(false)
	first := make(chan int, 1)
	links[0].Watch(func(rank int, why string) {
		t.Logf("rank 0 told: rank %d lost: %s", rank, why)
		first <- rank
	})
	links[1].Watch(func(int, string) { links[1].Finish(false) })
	links[2].SimulateCrash()
	defer links[2].CloseSocket()
	select {
	case r := <-first:
		if r != 2 {
			t.Fatalf("rank 0's first notice names rank %d, want the crashed rank 2", r)
		}
	case <-ctx.Done():
		t.Fatal("rank 0 was never told of a loss")
	}
}
