package membership

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/internal/abi"
	"github.com/nexar-go/nexar/internal/identity"
)

// Lobby protocol (docs/wire-format.md): a process that wants to join a
// running job (core.Join) reaches any member's lobby over QUIC with ALPN
// lobbyALPN, opens one stream and sends a lobbyHello with its id and the
// token proof (as the seed's: HMAC-SHA256(token, exporter("nexar-join"))).
// The lobby holds it, the stream open, until the members grow (core's
// Comm.Grow): then it answers one admitMsg, proven with "nexar-seed", that
// names the seed of the grown world and the joiner's rank in it. The
// joiner then joins that seed like any rank. A joiner whose lobby goes away
// (its member died or left) tries the next address it was given.
//
// Before a grow proposes its waiting joiners (Ready), the lobby pings each
// (an admitMsg with Ping set) and proposes only those that echo the ping's
// number (4 bytes, little-endian) within the admission window: a joiner
// that is stopped or starved is left waiting for a later grow instead of
// holding the grown world's formation for the members' whole timeout.
const (
	lobbyALPN    = "nexar-lobby/2"
	lobbyVersion = 2
	// JoinIDSize is the size of a joiner's id: random, chosen once per
	// Join call, so a joiner that moves to another lobby keeps it.
	JoinIDSize = 16
)

type lobbyHello struct {
	V     int    `cbor:"v"`
	ID    []byte `cbor:"id"`
	Proof []byte `cbor:"proof"`
}

// Admission is where an admitted joiner goes: the grown world's seed and
// its rank, size and membership generation there.
type Admission struct {
	Seed string `cbor:"seed"`
	Rank int    `cbor:"rank"`
	Size int    `cbor:"size"`
	Gen  uint32 `cbor:"gen"`
	Max  int    `cbor:"max"` // the job's maximum world size
	// Topology is the running job's topology (topology.Spec.String):
	// a joiner forms the grown world with it, whatever its own setting,
	// since the seed refuses a rank whose topology differs.
	Topology string `cbor:"topo,omitempty"`
}

type admitMsg struct {
	V    int    `cbor:"v"`
	Code int    `cbor:"code,omitempty"` // non-zero: refused, Err says why
	Err  string `cbor:"err,omitempty"`
	// Ping, when non-zero, is a liveness probe, not an answer: the joiner
	// echoes the number and keeps waiting.
	Ping uint32 `cbor:"ping,omitempty"`
	Admission
	Proof []byte `cbor:"proof"`
}

// Lobby is one member's join service: it holds processes that proved the
// job's token until the members grow (Admit) or they leave. Its methods
// are safe for concurrent use.
type Lobby struct {
	*listener // done: closed by Close
	token     []byte
	log       *slog.Logger

	mu      sync.Mutex
	waiting map[string]*lobbyWaiter // by id; guarded by mu
	pings   uint32                  // the last ping number sent; guarded by mu
}

type lobbyWaiter struct {
	id    []byte
	since time.Time
	admit chan admitMsg // one slot: the answer the serving goroutine sends
	ping  chan uint32   // one slot: a probe the serving goroutine sends
	// echoed is the last ping number the joiner echoed (atomic: written
	// by the goroutine reading the joiner's stream); echo is signalled,
	// without blocking, after each.
	echoed atomic.Uint32
	echo   chan struct{}
}

// StartLobby listens on addr (UDP host:port; port 0 picks one) for joiners
// holding token.
func StartLobby(addr string, token []byte, log *slog.Logger) (*Lobby, error) {
	if log == nil {
		log = slog.Default()
	}
	if len(token) == 0 {
		return nil, errorf(abi.ErrInvalidArgument, "lobby", nil, "empty token")
	}
	ln, err := listen(addr, lobbyALPN, "lobby")
	if err != nil {
		return nil, err
	}
	l := &Lobby{listener: ln, token: append([]byte(nil), token...), log: log, waiting: make(map[string]*lobbyWaiter)}
	l.listener.serve(l.serve)
	return l, nil
}

// Addr is the address the lobby listens on.
func (l *Lobby) Addr() net.Addr { return l.listener.Addr() }

// Waiting returns the ids of the joiners waiting now, oldest first.
func (l *Lobby) Waiting() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	ws := make([]*lobbyWaiter, 0, len(l.waiting))
	for _, w := range l.waiting {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *lobbyWaiter) int { return a.since.Compare(b.since) })
	ids := make([][]byte, len(ws))
	for i, w := range ws {
		ids[i] = slices.Clone(w.id)
	}
	return ids
}

// Ready pings the joiners waiting now and returns, oldest first, the ids
// of those that answered within window (or before ctx ends): the joiners
// a grow can admit without waiting on a stopped or starved process. The
// others stay waiting. With nobody waiting it returns at once.
func (l *Lobby) Ready(ctx context.Context, window time.Duration) [][]byte {
	l.mu.Lock()
	ws := make([]*lobbyWaiter, 0, len(l.waiting))
	for _, w := range l.waiting {
		ws = append(ws, w)
	}
	l.pings++
	n := l.pings
	l.mu.Unlock()
	if len(ws) == 0 {
		return nil
	}
	slices.SortFunc(ws, func(a, b *lobbyWaiter) int { return a.since.Compare(b.since) })
	for _, w := range ws {
		select {
		case w.ping <- n:
		default: // a probe is queued already: it is answered with an older number
			select {
			case <-w.ping:
			default:
			}
			select {
			case w.ping <- n:
			default:
			}
		}
	}
	// One deadline for all: a timer's channel fires once, and the waiters
	// after the first silent one must see the window closed too.
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	answered := func(w *lobbyWaiter) bool { return w.echoed.Load() == n }
wait:
	for _, w := range ws {
		for !answered(w) {
			select {
			case <-w.echo:
			case <-wctx.Done():
				break wait
			case <-l.done:
				break wait
			}
		}
	}
	var ids [][]byte
	for _, w := range ws {
		if answered(w) {
			ids = append(ids, slices.Clone(w.id))
		} else {
			l.log.Warn("nexar lobby: a waiting joiner did not answer within the admission window; it waits for a later grow", "window", window)
		}
	}
	return ids
}

// Admit sends joiner id its admission; false if it is not waiting here
// (any more). The answer is written by the goroutine serving the joiner.
func (l *Lobby) Admit(id []byte, a Admission) bool {
	l.mu.Lock()
	w := l.waiting[string(id)]
	delete(l.waiting, string(id))
	l.mu.Unlock()
	if w == nil {
		return false
	}
	w.admit <- admitMsg{V: lobbyVersion, Admission: a}
	return true
}

// Close stops the lobby; waiting joiners are told it closed and try their
// next address.
func (l *Lobby) Close() error {
	l.close(nil)
	return nil
}

func (l *Lobby) serve(conn *quic.Conn) {
	defer conn.CloseWithError(0, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := conn.AcceptStream(ctx)
	cancel()
	if err != nil {
		return
	}
	cs := conn.ConnectionState().TLS
	answer := func(m admitMsg) {
		m.V = lobbyVersion
		if m.Code == 0 {
			p, err := proof(l.token, cs.ExportKeyingMaterial, labelSeed)
			if err != nil {
				return
			}
			m.Proof = p
		}
		st.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = writeFrame(st, m)
		st.Close()
		select { // let the joiner read it before the connection closes
		case <-conn.Context().Done():
		case <-time.After(2 * time.Second):
		case <-l.done:
		}
	}
	refuse := func(code int, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		l.log.Warn("nexar lobby: refused joiner", "remote", conn.RemoteAddr().String(), "why", msg)
		answer(admitMsg{Code: code, Err: msg})
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h lobbyHello
	if err := readFrame(st, maxJoinFrame, &h); err != nil {
		refuse(abi.ErrInvalidArgument, "bad lobby message: %v", err)
		return
	}
	if h.V != lobbyVersion {
		refuse(abi.ErrInvalidArgument, "unsupported lobby version %d (this lobby speaks %d)", h.V, lobbyVersion)
		return
	}
	want, err := proof(l.token, cs.ExportKeyingMaterial, labelJoin)
	if err != nil || !hmac.Equal(want, h.Proof) {
		refuse(abi.ErrAuth, "wrong token")
		return
	}
	if len(h.ID) != JoinIDSize {
		refuse(abi.ErrInvalidArgument, "joiner id of %d bytes, want %d", len(h.ID), JoinIDSize)
		return
	}
	w := &lobbyWaiter{id: slices.Clone(h.ID), since: time.Now(), admit: make(chan admitMsg, 1),
		ping: make(chan uint32, 1), echo: make(chan struct{}, 1)}
	l.mu.Lock()
	if _, dup := l.waiting[string(h.ID)]; dup || len(l.waiting) >= MaxExtra {
		l.mu.Unlock()
		refuse(abi.ErrInvalidArgument, "the lobby is full (%d waiting) or this id waits already", MaxExtra)
		return
	}
	l.waiting[string(h.ID)] = w
	l.mu.Unlock()
	// Only ping echoes come back; a read that ends means the joiner left.
	st.SetReadDeadline(time.Time{})
	left := make(chan struct{})
	go func() {
		defer close(left)
		var b [4]byte
		for {
			if _, err := io.ReadFull(st, b[:]); err != nil {
				return
			}
			w.echoed.Store(binary.LittleEndian.Uint32(b[:]))
			select {
			case w.echo <- struct{}{}:
			default:
			}
		}
	}()
wait:
	for {
		select {
		case m := <-w.admit:
			answer(m)
			break wait
		case n := <-w.ping:
			st.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if err := writeFrame(st, admitMsg{V: lobbyVersion, Ping: n}); err != nil {
				break wait
			}
		case <-left:
			break wait
		case <-conn.Context().Done():
			break wait
		case <-l.done:
			break wait
		}
	}
	l.mu.Lock()
	if l.waiting[string(h.ID)] == w {
		delete(l.waiting, string(h.ID))
	}
	l.mu.Unlock()
}

// ErrLobbyGone is why a joiner's wait at one lobby ended without an
// answer: the member went away. The joiner tries its next address.
var ErrLobbyGone = errors.New("the lobby went away")

// AwaitAdmission waits, up to ctx's deadline, in the lobby of a member of
// a running job until the members grow and admit this process. addrs are
// dialled happy-eyeballs style (RFC 8305): the first at once, each next
// one lobbyDialStagger later or as soon as the one before fails, and the
// first to answer is where this process waits, with the same id
// throughout, so a dead address costs at most the stagger, not a
// handshake timeout. A lobby that goes away while this process waits (its
// member died or left) is dialled last in the next round.
func AwaitAdmission(ctx context.Context, addrs []string, token []byte) (Admission, error) {
	return awaitAdmission(ctx, addrs, token, awaitOpts{})
}

// awaitOpts are test hooks: resume, when not nil, makes the joiner read
// nothing from its lobby until it is closed, as a stopped process;
// handshake, when not zero, replaces the 3 s bound on a lobby's handshake.
type awaitOpts struct {
	resume    <-chan struct{}
	handshake time.Duration
}

// lobbyDialStagger is how long a joiner's dial of one lobby has to itself
// before the next address is dialled too.
const lobbyDialStagger = 250 * time.Millisecond

func awaitAdmission(ctx context.Context, addrs []string, token []byte, o awaitOpts) (Admission, error) {
	if len(addrs) == 0 {
		return Admission{}, errorf(abi.ErrInvalidArgument, "join", nil, "no lobby address to join through")
	}
	order := make([]string, len(addrs))
	for i, a := range addrs {
		order[i] = strings.TrimSpace(a)
	}
	id := make([]byte, JoinIDSize)
	if _, err := rand.Read(id); err != nil {
		return Admission{}, errorf(abi.ErrInternal, "join", err, "%v", err)
	}
	ident, err := identity.New()
	if err != nil {
		return Admission{}, errorf(abi.ErrInternal, "join", err, "%v", err)
	}
	tc := identity.ClientTLSConfig(ident, func([32]byte) error { return nil }) // the lobby proves the token instead
	tc.NextProtos = []string{lobbyALPN}
	var tried []string
	backoff := 100 * time.Millisecond
	for {
		lc, fails := dialFirst(ctx, order, tc, cmp.Or(o.handshake, 3*time.Second))
		tried = append(tried, fails...)
		if lc != nil {
			a, err := awaitOn(ctx, lc, token, id, o)
			lc.close()
			if err == nil {
				return a, nil
			}
			var me *Error
			if errors.As(err, &me) && me.Code != abi.ErrTimeout {
				return Admission{}, err // refused: a wrong token stays wrong
			}
			tried = append(tried, fmt.Sprintf("%s: %v", lc.addr, err))
			// The lobby that went away is tried last next time.
			order = append(slices.DeleteFunc(order, func(a string) bool { return a == lc.addr }), lc.addr)
		}
		if len(tried) > len(order) {
			tried = tried[len(tried)-len(order):]
		}
		if ctx.Err() != nil {
			return Admission{}, errorf(abi.ErrTimeout, "join", ctx.Err(), "not admitted to the job in time (%v); last tries: %s", ctx.Err(), strings.Join(tried, "; "))
		}
		// Also after a lobby that went away: one that takes connections
		// and drops them must not make this a busy loop.
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// lobbyConn is a joiner's connection to one lobby.
type lobbyConn struct {
	addr string
	sock *dialSocket
	conn *quic.Conn
}

func (lc *lobbyConn) close() {
	lc.conn.CloseWithError(0, "")
	lc.sock.close()
}

// dialLobby connects to the lobby at addr, the handshake bounded by hs.
func dialLobby(ctx context.Context, addr string, tc *tls.Config, hs time.Duration) (*lobbyConn, error) {
	sock, err := newDialSocket(addr)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, hs)
	conn, err := sock.tr.Dial(actx, sock.raddr, tc, &quic.Config{HandshakeIdleTimeout: hs, MaxIdleTimeout: IdleTimeout, KeepAlivePeriod: rdvKeepAlive})
	cancel()
	if err != nil {
		sock.close()
		return nil, err
	}
	return &lobbyConn{addr: addr, sock: sock, conn: conn}, nil
}

// dialFirst dials addrs in order, staggered (lobbyDialStagger, or at once
// after a failure), and returns the first connection made (the others are
// closed) and, when none was, each address's error.
func dialFirst(ctx context.Context, addrs []string, tc *tls.Config, hs time.Duration) (*lobbyConn, []string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		lc   *lobbyConn
		addr string
		err  error
	}
	out := make(chan result, len(addrs))
	next, pending := 0, 0
	start := func() {
		a := addrs[next]
		next++
		pending++
		go func() {
			lc, err := dialLobby(ctx, a, tc, hs)
			out <- result{lc, a, err}
		}()
	}
	start()
	stagger := time.NewTimer(lobbyDialStagger)
	defer stagger.Stop()
	var won *lobbyConn
	var fails []string
	for pending > 0 {
		select {
		case r := <-out:
			pending--
			switch {
			case r.err == nil && won == nil:
				won = r.lc
				cancel() // the dials still going end now
			case r.err == nil:
				r.lc.close()
			case won == nil:
				fails = append(fails, fmt.Sprintf("%s: %v", r.addr, r.err))
				if next < len(addrs) {
					start()
					stagger.Reset(lobbyDialStagger)
				}
			}
		case <-stagger.C:
			if won == nil && next < len(addrs) {
				start()
				stagger.Reset(lobbyDialStagger)
			}
		}
	}
	return won, fails
}

// awaitOn waits at one lobby. Errors of code ErrTimeout mean "try the
// next address"; others are final.
func awaitOn(ctx context.Context, lc *lobbyConn, token, id []byte, o awaitOpts) (Admission, error) {
	retry := func(err error) (Admission, error) {
		return Admission{}, errorf(abi.ErrTimeout, "join", err, "%v", err)
	}
	addr, conn := lc.addr, lc.conn
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return retry(err)
	}
	cs := conn.ConnectionState().TLS
	p, err := proof(token, cs.ExportKeyingMaterial, labelJoin)
	if err != nil {
		return Admission{}, errorf(abi.ErrInternal, "join", err, "%v", err)
	}
	if err := writeFrame(st, lobbyHello{V: lobbyVersion, ID: id, Proof: p}); err != nil {
		return retry(err)
	}
	var m admitMsg
	for {
		if o.resume != nil {
			select {
			case <-o.resume:
			case <-ctx.Done():
			}
		}
		m = admitMsg{}
		if err := readFrameCtx(ctx, st, maxJoinFrame, &m); err != nil {
			if ctx.Err() != nil {
				return Admission{}, errorf(abi.ErrTimeout, "join", ctx.Err(), "lobby %s: not admitted: %v", addr, ctx.Err())
			}
			return retry(fmt.Errorf("%w: %v", ErrLobbyGone, err))
		}
		if m.V != lobbyVersion || m.Ping == 0 {
			break
		}
		st.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := st.Write(binary.LittleEndian.AppendUint32(nil, m.Ping)); err != nil {
			return retry(fmt.Errorf("%w: %v", ErrLobbyGone, err))
		}
	}
	if m.V != lobbyVersion {
		return Admission{}, errorf(abi.ErrInvalidArgument, "join", nil, "lobby %s speaks version %d, want %d", addr, m.V, lobbyVersion)
	}
	if m.Code != 0 {
		code := m.Code
		if code <= abi.Success || code >= abi.NumResults || code == abi.ErrTimeout {
			code = abi.ErrInternal
		}
		return Admission{}, errorf(code, "join", nil, "lobby %s refused: %s", addr, m.Err[:min(len(m.Err), 512)])
	}
	want, err := proof(token, cs.ExportKeyingMaterial, labelSeed)
	if err != nil || !hmac.Equal(want, m.Proof) {
		return Admission{}, errorf(abi.ErrAuth, "join", nil, "lobby %s did not prove the token: not our job", addr)
	}
	if _, _, err := net.SplitHostPort(m.Seed); err != nil || m.Size < 1 || m.Rank < 0 || m.Rank >= m.Size {
		return Admission{}, errorf(abi.ErrInternal, "join", nil, "lobby %s sent a bad admission %+v", addr, m.Admission)
	}
	return m.Admission, nil
}
