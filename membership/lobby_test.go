package membership

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/internal/abi"
)

func waitWaiting(t *testing.T, l *Lobby, n int) [][]byte {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids := l.Waiting()
		if len(ids) == n {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("lobby has %d waiting, want %d", len(ids), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLobbyAdmits(t *testing.T) {
	token := []byte("lobby-token")
	l, err := StartLobby("127.0.0.1:0", token, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		a   Admission
		err error
	}
	got := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a, err := AwaitAdmission(ctx, []string{l.Addr().String()}, token)
		got <- res{a, err}
	}()
	ids := waitWaiting(t, l, 1)
	want := Admission{Seed: "127.0.0.1:4242", Rank: 3, Size: 4, Gen: 7}
	if !l.Admit(ids[0], want) {
		t.Fatal("Admit: the joiner is not waiting")
	}
	r := <-got
	if r.err != nil || r.a != want {
		t.Fatalf("AwaitAdmission = %+v, %v; want %+v", r.a, r.err, want)
	}
	if l.Admit(ids[0], want) {
		t.Fatal("Admit of a joiner admitted already succeeded")
	}
	waitWaiting(t, l, 0)
}

func TestLobbyWrongToken(t *testing.T) {
	l, err := StartLobby("127.0.0.1:0", []byte("right"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = AwaitAdmission(ctx, []string{l.Addr().String()}, []byte("wrong"))
	var me *Error
	if !errors.As(err, &me) || me.Code != abi.ErrAuth {
		t.Fatalf("wrong token: %v, want an auth error", err)
	}
	if n := len(l.Waiting()); n != 0 {
		t.Fatalf("a joiner with the wrong token waits in the lobby (%d)", n)
	}
}

// TestLobbyMovesOn: a joiner whose lobby closes (its member died) waits at
// the next address, with the same id, and is admitted there.
func TestLobbyMovesOn(t *testing.T) {
	token := []byte("lobby-token")
	l1, err := StartLobby("127.0.0.1:0", token, nil)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := StartLobby("127.0.0.1:0", token, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	got := make(chan error, 1)
	var adm Admission
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		adm, err = AwaitAdmission(ctx, []string{l1.Addr().String(), l2.Addr().String()}, token)
		got <- err
	}()
	id1 := waitWaiting(t, l1, 1)
	l1.Close()
	id2 := waitWaiting(t, l2, 1)
	if string(id1[0]) != string(id2[0]) {
		t.Fatal("the joiner changed its id moving to the next lobby")
	}
	want := Admission{Seed: "127.0.0.1:1", Rank: 1, Size: 2, Gen: 2}
	l2.Admit(id2[0], want)
	if err := <-got; err != nil || adm != want {
		t.Fatalf("AwaitAdmission = %+v, %v", adm, err)
	}
}

func TestLobbyDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := AwaitAdmission(ctx, []string{"127.0.0.1:1"}, []byte("t"))
	var me *Error
	if !errors.As(err, &me) || me.Code != abi.ErrTimeout {
		t.Fatalf("no lobby: %v, want a timeout", err)
	}
}

// TestLobbyReadyLeavesAStoppedJoiner: of two waiting joiners, one reads
// nothing (as a SIGSTOPped process); Ready returns the other within the
// admission window and leaves the stopped one waiting, and once it
// resumes it answers the next Ready.
func TestLobbyReadyLeavesAStoppedJoiner(t *testing.T) {
	token := []byte("lobby-token")
	l, err := StartLobby("127.0.0.1:0", token, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resume := make(chan struct{})
	stopped := make(chan Admission, 1)
	go func() {
		a, _ := AwaitAdmissionPaused(ctx, []string{l.Addr().String()}, token, resume)
		stopped <- a
	}()
	first := waitWaiting(t, l, 1)[0]
	// A second stopped joiner: the window must close for it too, not
	// only for the first one silent (Ready's ctx here is 30 s).
	go func() { _, _ = AwaitAdmissionPaused(ctx, []string{l.Addr().String()}, token, make(chan struct{})) }()
	waitWaiting(t, l, 2)
	go func() { _, _ = AwaitAdmission(ctx, []string{l.Addr().String()}, token) }()
	waitWaiting(t, l, 3)
	got := make(chan [][]byte, 1)
	go func() { got <- l.Ready(ctx, 300*time.Millisecond) }()
	var ready [][]byte
	select {
	case ready = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("Ready with two stopped joiners did not end at its window")
	}
	if len(ready) != 1 || string(ready[0]) == string(first) {
		t.Fatalf("Ready returned %d joiners (the first stopped one among them: %v), want only the live one", len(ready), len(ready) > 0 && string(ready[0]) == string(first))
	}
	if n := len(l.Waiting()); n != 3 {
		t.Fatalf("%d joiners waiting after Ready, want all three", n)
	}
	close(resume)
	if ready = l.Ready(ctx, 300*time.Millisecond); len(ready) != 2 || string(ready[0]) != string(first) {
		t.Fatalf("after the first stopped joiner resumed, Ready returned %d joiners, want it and the live one, oldest first", len(ready))
	}
	want := Admission{Seed: "127.0.0.1:4242", Rank: 2, Size: 3, Gen: 2, Topology: "kregular:2"}
	if !l.Admit(first, want) {
		t.Fatal("Admit: the resumed joiner is not waiting")
	}
	if a := <-stopped; a != want {
		t.Fatalf("the resumed joiner got %+v, want %+v", a, want)
	}
}

// TestLobbyDialsConcurrently: the first address swallows the handshake (a
// socket that reads and never answers) and the dial bound is an hour, so a
// joiner that tried addresses in turn would never get past it; it waits at
// the second lobby instead, dialled after the stagger.
func TestLobbyDialsConcurrently(t *testing.T) {
	hole, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	var got atomic.Int64
	go func() {
		b := make([]byte, 2048)
		for {
			n, _, err := hole.ReadFrom(b)
			if err != nil {
				return
			}
			got.Add(int64(n))
		}
	}()
	token := []byte("lobby-token")
	l, err := StartLobby("127.0.0.1:0", token, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := make(chan error, 1)
	var adm Admission
	go func() {
		var err error
		adm, err = awaitAdmission(ctx, []string{hole.LocalAddr().String(), l.Addr().String()}, token, awaitOpts{handshake: time.Hour})
		res <- err
	}()
	ids := waitWaiting(t, l, 1)
	if got.Load() == 0 {
		t.Fatal("the first address was never dialled")
	}
	want := Admission{Seed: "127.0.0.1:1", Rank: 1, Size: 2, Gen: 2}
	l.Admit(ids[0], want)
	if err := <-res; err != nil || adm != want {
		t.Fatalf("AwaitAdmission = %+v, %v", adm, err)
	}
}
