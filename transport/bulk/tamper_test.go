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
