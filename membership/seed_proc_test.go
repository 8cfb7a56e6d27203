//go:build linux

package membership

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/internal/hostid"
	"github.com/nexar-go/nexar/internal/procwatch"
	"github.com/nexar-go/nexar/internal/procwatch/procwatchtest"
)

// TestSeedWatchesJoinersOnItsMachine: a joiner on the seed's machine may
// stay silent for as long as its idle timeout allows (here an hour: a
// starved process on a host with more ranks than cores), but once its
// process exits the seed loses it at once and tells the others why. Rank
// 1 claims the process of a child that the test kills; without the watch,
// rank 0 would hear nothing for the hour.
func TestSeedWatchesJoinersOnItsMachine(t *testing.T) {
	cmd, id, reap := procwatchtest.Child(t)
	if w, err := procwatch.New(func(int, int) {}); err != nil {
		t.Skipf("no process watch here: %v", err)
	} else {
		w.Close()
	}
	claim := &procClaim{Machine: hostid.Local(), PID: id.PID, Start: id.Start, PIDNS: id.PIDNS}

	token := []byte("seed-proc-token")
	s, err := StartSeed("127.0.0.1:0", 2, token, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	links := make([]*SeedLink, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		o := JoinOptions{IdleTimeout: time.Hour}
		if r == 1 {
			o.claim = claim
		}
		wg.Go(func() {
			_, _, _, links[r], errs[r] = JoinWatchedLobby(ctx, s.Addr().String(), token, r, "127.0.0.1:1", [32]byte{byte(r)}, o)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer links[0].Finish(false)
	defer links[1].CloseSocket()
	told := make(chan string, 1)
	links[0].Watch(func(rank int, why string) { told <- strconv.Itoa(rank) + ": " + why })
	// Rank 1's link stays open and silent (it reads nothing, like a
	// stopped process): only its claimed process's exit can lose it.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	reap()
	select {
	case got := <-told:
		want := "1: its process (pid " + strconv.Itoa(cmd.Process.Pid) + ") on this host exited"
		if !strings.HasPrefix(got, want) {
			t.Fatalf("rank 0 told %q, want %q...", got, want)
		}
		t.Logf("told %v after the exit: %s", time.Since(start).Round(time.Millisecond), got)
	case <-ctx.Done():
		t.Fatal("rank 0 was never told of rank 1's exit")
	}
}
