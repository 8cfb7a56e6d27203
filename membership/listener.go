package membership

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/internal/abi"
	"github.com/nexar-go/nexar/internal/identity"
)

// listener is the QUIC service socket of a seed or a lobby: the clients
// prove the token instead of a certificate. It owns its UDP socket (rather
// than quic.ListenAddr) so that close releases the address before it
// returns: quic-go would keep a socket it made itself until its last
// connection is gone, and the next job on the same address must be able to
// bind it at once.
type listener struct {
	ln   *quic.Listener
	tr   *quic.Transport
	udp  *net.UDPConn
	done chan struct{} // closed by close
	wg   sync.WaitGroup
	once sync.Once
}

// listen binds addr for ALPN alpn; errors are op's.
func listen(addr, alpn, op string) (*listener, error) {
	id, err := identity.New()
	if err != nil {
		return nil, errorf(abi.ErrInternal, op, err, "%v", err)
	}
	tc := identity.ServerTLSConfig(id, func([32]byte) error { return nil }) // clients prove the token instead
	tc.NextProtos = []string{alpn}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, errorf(abi.ErrInvalidArgument, op, err, "listen on %s: %v", addr, err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, errorf(abi.ErrInternal, op, err, "listen on %s: %v", addr, err)
	}
	tr := &quic.Transport{Conn: udp}
	ln, err := tr.Listen(tc, &quic.Config{HandshakeIdleTimeout: 10 * time.Second, MaxIdleTimeout: MaxIdleTimeout, KeepAlivePeriod: rdvKeepAlive})
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, errorf(abi.ErrInternal, op, err, "listen on %s: %v", addr, err)
	}
	return &listener{ln: ln, tr: tr, udp: udp, done: make(chan struct{})}, nil
}

// Addr is the address the listener is bound to.
func (l *listener) Addr() net.Addr { return l.ln.Addr() }

// serve accepts connections until close, each served by serve on a
// goroutine of its own that close waits for.
func (l *listener) serve(serve func(*quic.Conn)) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-l.done; cancel() }()
		for {
			conn, err := l.ln.Accept(ctx)
			if err != nil {
				return
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				serve(conn)
			}()
		}
	}()
}

// close stops accepting, runs before (once done is closed, while the
// serving goroutines may still run), waits for them, and releases the
// socket. Idempotent.
func (l *listener) close(before func()) {
	l.once.Do(func() {
		close(l.done)
		if before != nil {
			before()
		}
		l.ln.Close()
		l.wg.Wait()
		l.tr.Close()
		l.udp.Close()
	})
}
