package bulk

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// flipConn flips one bit of the first write of at least 4 KiB made after
// armed is set, at byte 1000 (past any record header), in a copy of the
// buffer: an on-path attacker altering one byte.
type flipConn struct {
	net.Conn
	armed   *atomic.Bool
	flipped *atomic.Bool
}

func (c flipConn) Write(p []byte) (int, error) {
	if len(p) >= 4<<10 && c.armed.Load() && c.flipped.CompareAndSwap(false, true) {
		q := bytes.Clone(p)
		q[1000] ^= 0x04
		return c.Conn.Write(q)
	}
	return c.Conn.Write(p)
}

// TestTamperedTCP: one byte altered on a bulk TCP connection. With TLS the
// receiver delivers nothing of the message and reports the sender down
// with an error naming it and the failed authentication; in plaintext (the
// control: the flip really happens on the wire) the altered message is
// delivered.
func TestTamperedTCP(t *testing.T) {
	for _, plain := range []bool{false, true} {
		name := "tls"
		if plain {
			name = "plaintext"
		}
		t.Run(name, func(t *testing.T) {
			var armed, flipped atomic.Bool
			got := make(chan []byte, 4)
			downs := make(chan error, 4)
			h := []transport.Handler{nil, func(_ int, lane transport.Lane, _ *transport.Header, p []byte) {
				if lane == transport.LaneData {
					got <- bytes.Clone(p)
				}
			}}
			var once sync.Once
			dh := []transport.DownHandler{nil, func(peer int, err error) { once.Do(func() { downs <- err }) }}
			eps := meshWith(t, 2, Options{Mode: ModeTCP, Plaintext: plain}, h, dh, func(i int, e *Endpoint) {
				if i == 0 {
					e.dialHook = func(ctx context.Context, addr string) (net.Conn, error) {
						var d net.Dialer
						c, err := d.DialContext(ctx, "tcp", addr)
						if err != nil {
							return nil, err
						}
						return flipConn{c, &armed, &flipped}, nil
					}
				}
			})
			defer eps[1].Close()
			defer eps[0].Close()
			if p := eps[0].Paths()[1]; !strings.HasPrefix(p, "tcp") {
				t.Fatalf("path to rank 1 is %q", p)
			}
			armed.Store(true)
			msg := make([]byte, 1<<20)
			for i := range msg {
				msg[i] = byte(i * 7)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sendErr := eps[0].Send(ctx, 1, transport.LaneData, nil, msg)
			if !flipped.Load() {
				t.Fatalf("nothing was tampered with (send: %v)", sendErr)
			}
			if plain {
				select {
				case p := <-got:
					diff := 0
					for i := range p {
						if p[i] != msg[i] {
							diff++
						}
					}
					if len(p) != len(msg) || diff != 1 {
						t.Fatalf("plaintext: delivered %d bytes, %d differ; want the message with one byte altered", len(p), diff)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("plaintext: nothing delivered")
				}
				return
			}
			select {
			case err := <-downs:
				var pd *transport.PeerDownError
				if !errors.As(err, &pd) || pd.Peer != 0 {
					t.Fatalf("down: %v, want rank 0 reported", err)
				}
				if s := err.Error(); !strings.Contains(s, "rank 0") || !strings.Contains(s, "authentication failed") {
					t.Fatalf("down error %q does not name rank 0 and the failed authentication", s)
				}
				t.Logf("reported: %v", err)
			case p := <-got:
				t.Fatalf("a tampered message was delivered (%d bytes)", len(p))
			case <-time.After(20 * time.Second):
				t.Fatal("tampering not reported")
			}
			select {
			case p := <-got:
				t.Fatalf("a tampered message was delivered (%d bytes)", len(p))
			case <-time.After(200 * time.Millisecond):
			}
		})
	}
}

// lostAnswerConn is a dialer's connection whose acceptor's answer is lost
// on the way: the answer reaches this side (so the acceptor has installed
// the channel) and the read then fails, as a read past the dialer's
// authTimeout does on a lossy link.
type lostAnswerConn struct{ net.Conn }

func (c lostAnswerConn) Read(p []byte) (int, error) {
	if _, err := c.Conn.Read(p); err != nil {
		return 0, err
	}
	return 0, errors.New("i/o timeout (the answer was lost)")
}

// TestTCPAnswerLost: a dialer that gives up on its TCP connections after the
// acceptor accepted them (the answer came too late) keeps its data on the
// inner path; the acceptor, whose channel then ends before its first frame,
// does not take that for the dialer's loss (tests/netns TestLossyLink saw
// it: "receive from rank 1 over tcp x2 ...: EOF"), and the data arrives.
func TestTCPAnswerLost(t *testing.T) {
	got := make(chan []byte, 4)
	downs := make(chan error, 4)
	h := []transport.Handler{nil, func(_ int, lane transport.Lane, _ *transport.Header, p []byte) {
		if lane == transport.LaneData {
			got <- bytes.Clone(p)
		}
	}}
	dh := []transport.DownHandler{nil, func(peer int, err error) { downs <- err }}
	// Two connections: the acceptor installs the channel once the second
	// is accepted, whose answer is then lost.
	var dials atomic.Int32
	eps := meshWith(t, 2, Options{Mode: ModeTCP, Plaintext: true, Conns: 2}, h, dh, func(i int, e *Endpoint) {
		if i == 0 {
			e.dialHook = func(ctx context.Context, addr string) (net.Conn, error) {
				var d net.Dialer
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil || dials.Add(1) != 2 {
					return c, err
				}
				return lostAnswerConn{c}, nil
			}
		}
	})
	defer eps[1].Close()
	defer eps[0].Close()
	if p := eps[0].Paths()[1]; strings.HasPrefix(p, "tcp") {
		t.Fatalf("rank 0's path to rank 1 is %q although every answer was lost", p)
	}
	msg := bytes.Repeat([]byte("nexar"), 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := eps[0].Send(ctx, 1, transport.LaneData, nil, msg); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if !bytes.Equal(p, msg) {
			t.Fatalf("delivered %d bytes, not the message", len(p))
		}
	case err := <-downs:
		t.Fatalf("rank 1 reported rank 0 down: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("nothing delivered")
	}
	select {
	case err := <-downs:
		t.Fatalf("rank 1 reported rank 0 down: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
}
