package membership

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the loggers' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A joiner that cannot reach the seed says so, with the address, within
// the first log interval, and fails at its deadline naming the address and
// what to set.
func TestJoinLogsWhileTheSeedIsUnreachable(t *testing.T) {
	var logs syncBuffer
	pc, err := net.ListenPacket("udp", "127.0.0.1:0") // a port with no seed behind it
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), WaitLogFirst+2*time.Second)
	defer cancel()
	_, _, _, _, err = JoinWatchedLobby(ctx, addr, []byte("tok"), 0, "127.0.0.1:1", [32]byte{}, JoinOptions{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	var me *Error
	if !errors.As(err, &me) || !strings.Contains(me.Msg, "cannot reach the seed at "+addr) || !strings.Contains(me.Msg, "NEXAR_ADVERTISE_ADDR") {
		t.Fatalf("err = %v, want a timeout naming %s and NEXAR_ADVERTISE_ADDR", err, addr)
	}
	if l := logs.String(); !strings.Contains(l, "waiting for the seed") || !strings.Contains(l, "seed="+addr) {
		t.Fatalf("the joiner did not log its wait for %s:\n%s", addr, l)
	}
}

// While one of two ranks has joined, the seed logs which rank it waits for
// and the joiner that it waits for the others.
func TestSeedAndJoinerLogWhomTheyWaitFor(t *testing.T) {
	var seedLogs, joinLogs syncBuffer
	token := []byte("wait-log-token")
	s, err := StartSeed("127.0.0.1:0", 2, token, slog.New(slog.NewTextHandler(&seedLogs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), WaitLogFirst+3*time.Second)
	defer cancel()
	_, _, _, _, err = JoinWatchedLobby(ctx, s.Addr().String(), token, 0, "127.0.0.1:7", [32]byte{1},
		JoinOptions{Log: slog.New(slog.NewTextHandler(&joinLogs, nil))})
	if err == nil || !strings.Contains(err.Error(), "not every rank joined") {
		t.Fatalf("err = %v, want not every rank joined", err)
	}
	if l := joinLogs.String(); !strings.Contains(l, "waiting for the other ranks") || !strings.Contains(l, "seed="+s.Addr().String()) {
		t.Fatalf("the joiner did not log its wait for the others:\n%s", l)
	}
	if l := seedLogs.String(); !strings.Contains(l, "waiting for ranks to join") || !strings.Contains(l, "missing=1") ||
		!strings.Contains(l, "127.0.0.1:7") {
		t.Fatalf("the seed did not log that it waits for rank 1:\n%s", l)
	}
}

// A member advertising loopback is refused when a member joined from
// another host: it could not dial it. On one host, loopback is fine.
func TestUnreachableMember(t *testing.T) {
	lo := net.ParseIP("127.0.0.1")
	other := net.ParseIP("192.0.2.7") // TEST-NET-1: never this host's
	m := func(rank int, addr string, from net.IP) *member { return &member{rank: rank, addr: addr, from: from} }
	if why := unreachableMember([]*member{m(0, "127.0.0.1:5", lo), m(1, "127.0.0.1:6", lo)}); why != "" {
		t.Fatalf("one host: %s", why)
	}
	if why := unreachableMember([]*member{m(0, "10.0.0.1:5", lo), m(1, "192.0.2.7:6", other)}); why != "" {
		t.Fatalf("routable addresses: %s", why)
	}
	for _, adv := range []string{"127.0.0.1:5", "[::1]:5", "169.254.3.4:5"} {
		why := unreachableMember([]*member{m(1, "192.0.2.7:6", other), m(0, adv, lo)})
		for _, want := range []string{"rank 0 advertises " + adv, "ranks 1 joined from other hosts (192.0.2.7)", "NEXAR_ADVERTISE_ADDR"} {
			if !strings.Contains(why, want) {
				t.Fatalf("advertising %s: %q lacks %q", adv, why, want)
			}
		}
	}
}
