package membership

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/quic-go/quic-go"

	"github.com/nexar-go/nexar/internal/abi"
	"github.com/nexar-go/nexar/internal/hostid"
	"github.com/nexar-go/nexar/internal/identity"
	"github.com/nexar-go/nexar/internal/procwatch"
	"github.com/nexar-go/nexar/transport"
)

// Rendezvous protocol (docs/wire-format.md): over QUIC with ALPN rdvALPN,
// the joiner opens one bidirectional stream and sends a joinMsg, the seed
// answers with one welcomeMsg once every rank has joined. The joiner then
// keeps the connection while it forms the mesh and ends it with a
// reportMsg; a member whose connection ends without one was lost during
// formation, and the seed tells every member still forming (noticeMsg), so
// that they stop waiting for it. Frames are a
// 4-byte big-endian length and a CBOR body. Both sides prove the token
// bound to this TLS session: HMAC-SHA256(token, exporter(label)), label
// "nexar-join" for the joiner and "nexar-seed" for the seed, so neither a
// stranger nor a fake seed (nor a relay between the two) gets through.
const (
	rdvALPN      = "nexar-rdv/1"
	rdvVersion   = 2
	maxJoinFrame = 4 << 10
	maxWelcome   = 16 << 20
	labelJoin    = "nexar-join"
	labelSeed    = "nexar-seed"
)

type joinMsg struct {
	V     int    `cbor:"v"`
	Rank  int    `cbor:"rank"` // requested rank or -1
	Addr  string `cbor:"addr"` // host:port of the joiner's mesh node
	FP    []byte `cbor:"fp"`   // SHA-256 of the mesh node's certificate
	Proof []byte `cbor:"proof"`
	Lobby string `cbor:"lobby,omitempty"` // host:port of the joiner's lobby (Lobby), if it runs one
	// Topo is the joiner's topology (topology.Spec.String; "" or absent:
	// the full mesh). Every joiner must send the same.
	Topo string `cbor:"topo,omitempty"`
	// Idle is the idle timeout (ms) of the joiner's connection to the
	// seed, for the seed's messages; absent: IdleTimeout.
	Idle int64 `cbor:"idle,omitempty"`
	// Host names the joiner's host (JoinOptions.Host); absent: unknown.
	Host string `cbor:"host,omitempty"`
	// Proc is the joiner's process, so that a seed on its machine can
	// watch it (procClaim); absent: not told.
	Proc *procClaim `cbor:"proc,omitempty"`
}

// procClaim is the process this joiner claims: its own (selfClaim).
func (o JoinOptions) procClaim() *procClaim {
	if o.claim != nil {
		return o.claim
	}
	return selfClaim()
}

// selfClaim is this process's procClaim, nil where it cannot be told.
func selfClaim() *procClaim {
	id, ok := procwatch.Self()
	if !ok {
		return nil
	}
	return &procClaim{Machine: hostid.Local(), PID: id.PID, Start: id.Start, PIDNS: id.PIDNS}
}

// procClaim identifies the joiner's process: the machine it runs on
// (internal/hostid.Local: machine, boot, host name, network namespace)
// and its pid, start time and pid namespace (internal/procwatch.ID).
type procClaim struct {
	Machine string `cbor:"machine"`
	PID     int    `cbor:"pid"`
	Start   uint64 `cbor:"start"`
	PIDNS   string `cbor:"pidns"`
}

type peerMsg struct {
	Rank  int    `cbor:"rank"`
	Addr  string `cbor:"addr"`
	FP    []byte `cbor:"fp"`
	Lobby string `cbor:"lobby,omitempty"`
	Host  string `cbor:"host,omitempty"`
}

type welcomeMsg struct {
	V    int    `cbor:"v"`
	Code int    `cbor:"code,omitempty"` // non-zero: refused, Err says why
	Err  string `cbor:"err,omitempty"`
	// Formed marks a refusal because this seed's job has already formed:
	// the joiner may be early for the next job on the same address (its
	// seed starts once this one's rank 0 closes it), so it tries again.
	Formed bool      `cbor:"formed,omitempty"`
	Rank   int       `cbor:"rank"`
	Size   int       `cbor:"size"`
	Peers  []peerMsg `cbor:"peers"`
	Proof  []byte    `cbor:"proof"`
}

// reportMsg ends a member's formation: OK false when it failed (it then
// reports its own error to its caller; the others learn of it on the mesh).
type reportMsg struct {
	OK bool `cbor:"ok"`
}

// noticeMsg tells a member still forming that rank Lost was lost during
// formation, and why.
type noticeMsg struct {
	Lost int    `cbor:"lost"`
	Why  string `cbor:"why"`
}

// IdleTimeout bounds how long a silent rendezvous connection is kept
// unless the joiner asks for longer (JoinOptions.IdleTimeout): it is how
// long the seed takes to notice a member that died (a process that is
// killed closes nothing) while the others form the mesh. Listeners accept
// up to MaxIdleTimeout; QUIC takes the smaller of the two ends' values, so
// the dialer's choice holds.
const (
	IdleTimeout    = 5 * time.Second
	MaxIdleTimeout = 5 * time.Minute
	rdvKeepAlive   = time.Second
)

var rdvDec = func() cbor.DecMode {
	dm, err := cbor.DecOptions{
		MaxArrayElements: 1 << 20,
		MaxMapPairs:      64,
		MaxNestedLevels:  8,
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return dm
}()

func writeFrame(w io.Writer, v any) error {
	b, err := cbor.Marshal(v)
	if err != nil {
		return err
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// readFrameCtx is readFrame on st bounded by ctx: by its deadline, and by
// its cancellation, which moves the read deadline to now and so ends a
// read blocked waiting for the peer (a joiner told to stop, a grow
// abandoned while its members wait for the seed's table).
func readFrameCtx(ctx context.Context, st *quic.Stream, max int, v any) error {
	if dl, ok := ctx.Deadline(); ok {
		st.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()
	return readFrame(st, max, v)
}

func readFrame(r io.Reader, max int, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > uint32(max) {
		return fmt.Errorf("frame of %d bytes exceeds the limit of %d", size, max)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return rdvDec.Unmarshal(b, v)
}

func proof(token []byte, cs func(label string, context []byte, length int) ([]byte, error), label string) ([]byte, error) {
	ekm, err := cs(label, nil, 32)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, token)
	m.Write(ekm)
	return m.Sum(nil), nil
}

// Seed is the rendezvous service of one job: it admits WorldSize joiners
// that prove the token, assigns ranks and sends each the peer table. It is
// not on the data path. Its methods are safe for concurrent use.
type Seed struct {
	*listener // done: closed by Close
	size      int
	token     []byte
	log       *slog.Logger
	formed    chan struct{}
	life      context.Context // cancelled by Close, with done closed
	end       context.CancelFunc

	// mu guards the following fields.
	mu         sync.Mutex
	members    []*member     // in join order
	firstJoin  time.Time     // when the first of members joined
	table      []peerMsg     // by rank, set when formed
	settled    int           // members that reported or were lost
	allSettled chan struct{} // closed when settled reaches size
	// mismatch is closed, with why set, when a joiner's topology differs
	// from the first joiner's: every joiner is then refused.
	mismatch chan struct{}
	why      string

	// procs watches the processes of members on this machine (nil until
	// the first; procsErr says why it could not start), by member key.
	procs    *procwatch.Watch
	procsErr error
	nextKey  int
	procKeys map[int]*member
	// self is this seed's own process claim (machine, pid namespace),
	// read once: a joiner is watched only where it matches. nil off Linux.
	self *procClaim

	// tell orders the notices of losses (lost): a member told of a loss
	// fails its formation and reports that, and the notice of its own
	// loss must not reach a member before the loss that caused it, or
	// that member names a live rank instead of the lost one.
	tell sync.Mutex
	// noticeGap (tests) is a pause after each notice written, which
	// widens the window in which another loss is reported.
	noticeGap time.Duration
}

type member struct {
	want  int // requested rank or -1
	rank  int // assigned
	addr  string
	lobby string
	host  string // its host's name (joinMsg.Host)
	fp    []byte
	topo  string        // its topology ("": full mesh)
	from  net.IP        // the address it joined from
	idle  time.Duration // its rendezvous connection's idle timeout
	gone  chan struct{}
	conn  *quic.Conn

	// exited is the pid of its process once the seed saw it exit (its
	// process watched: on this machine), else 0.
	exited atomic.Int64

	// After the welcome, until it reports: st carries notices to it.
	wmu     sync.Mutex
	st      *quic.Stream
	settled bool // reported, or lost (guarded by Seed.mu)
}

// StartSeed listens on addr (UDP host:port) for worldSize joiners holding
// token. It serves one formation; later joiners are refused. log (nil:
// slog.Default()) receives its debug messages.
func StartSeed(addr string, worldSize int, token []byte, log *slog.Logger) (*Seed, error) {
	if log == nil {
		log = slog.Default()
	}
	if worldSize < 1 {
		return nil, errorf(abi.ErrInvalidArgument, "seed", nil, "world size %d must be >= 1", worldSize)
	}
	if len(token) == 0 {
		return nil, errorf(abi.ErrInvalidArgument, "seed", nil, "empty token")
	}
	l, err := listen(addr, rdvALPN, "seed")
	if err != nil {
		return nil, err
	}
	s := &Seed{listener: l, size: worldSize, token: append([]byte(nil), token...), log: log,
		formed: make(chan struct{}), allSettled: make(chan struct{}), mismatch: make(chan struct{})}
	s.life, s.end = context.WithCancel(context.Background())
	if procwatch.Supported {
		s.self = selfClaim()
	}
	s.listener.serve(s.serve)
	go s.logWaits()
	return s, nil
}

// Addr is the address the seed listens on.
func (s *Seed) Addr() net.Addr { return s.listener.Addr() }

// Formed is closed once every rank has joined.
func (s *Seed) Formed() <-chan struct{} { return s.formed }

// Settled is closed once every rank has reported the end of its mesh
// formation or was lost during it: the seed has nothing more to do.
func (s *Seed) Settled() <-chan struct{} { return s.allSettled }

// CloseWhenSettled closes the seed once it is Settled, or after at most d.
// It returns at once.
func (s *Seed) CloseWhenSettled(d time.Duration) {
	go func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-s.allSettled:
		case <-t.C:
		case <-s.done:
		}
		s.Close()
	}()
}

// Close stops the seed and releases its socket and goroutines; the address
// is free again when it returns.
func (s *Seed) Close() error {
	s.close(s.end)
	s.mu.Lock()
	w := s.procs
	s.mu.Unlock()
	if w != nil {
		w.Close()
	}
	return nil
}

func (s *Seed) serve(conn *quic.Conn) {
	defer conn.CloseWithError(0, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop := context.AfterFunc(s.life, cancel)
	defer stop()
	st, err := conn.AcceptStream(ctx)
	if err != nil {
		return
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var j joinMsg
	refuse := func(code int, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		s.log.Warn("nexar seed: refused joiner", "remote", conn.RemoteAddr().String(), "why", msg)
		_ = writeFrame(st, welcomeMsg{V: rdvVersion, Code: code, Err: msg})
		st.Close()
		s.linger(conn)
	}
	if err := readFrame(st, maxJoinFrame, &j); err != nil {
		refuse(abi.ErrInvalidArgument, "bad join message: %v", err)
		return
	}
	if j.V != rdvVersion {
		refuse(abi.ErrInvalidArgument, "unsupported rendezvous version %d (this seed speaks %d)", j.V, rdvVersion)
		return
	}
	tls := conn.ConnectionState().TLS
	want, err := proof(s.token, tls.ExportKeyingMaterial, labelJoin)
	if err != nil || !hmac.Equal(want, j.Proof) {
		refuse(abi.ErrAuth, "wrong token")
		return
	}
	if len(j.FP) != 32 {
		refuse(abi.ErrInvalidArgument, "certificate fingerprint has %d bytes, want 32", len(j.FP))
		return
	}
	if _, _, err := net.SplitHostPort(j.Addr); err != nil {
		refuse(abi.ErrInvalidArgument, "advertised address %q: %v", j.Addr, err)
		return
	}
	if j.Lobby != "" {
		if _, _, err := net.SplitHostPort(j.Lobby); err != nil {
			refuse(abi.ErrInvalidArgument, "lobby address %q: %v", j.Lobby, err)
			return
		}
	}
	m := &member{want: j.Rank, addr: j.Addr, lobby: j.Lobby, host: j.Host, fp: j.FP, topo: j.Topo, idle: IdleTimeout, gone: make(chan struct{})}
	if ua, ok := conn.RemoteAddr().(*net.UDPAddr); ok {
		m.from = ua.IP
	}
	if j.Idle > 0 {
		m.idle = min(time.Duration(j.Idle)*time.Millisecond, MaxIdleTimeout)
	}
	m.conn = conn
	if err := s.add(m); errors.Is(err, errFormed) {
		s.log.Debug("nexar seed: joiner came after formation", "remote", conn.RemoteAddr().String())
		_ = writeFrame(st, welcomeMsg{V: rdvVersion, Code: abi.ErrInvalidArgument, Err: err.Error(), Formed: true})
		st.Close()
		s.linger(conn)
		return
	} else if err != nil {
		refuse(abi.ErrInvalidArgument, "%v", err)
		return
	}
	s.watchProc(m, j.Proc)
	select {
	case <-s.formed:
	case <-s.mismatch:
		s.remove(m)
		s.mu.Lock()
		why := s.why
		s.mu.Unlock()
		refuse(abi.ErrInvalidArgument, "%s", why)
		return
	case <-conn.Context().Done():
		s.remove(m)
		return
	case <-s.done:
		return
	}
	s.mu.Lock()
	w := welcomeMsg{V: rdvVersion, Rank: m.rank, Size: s.size, Peers: s.table}
	s.mu.Unlock()
	w.Proof, err = proof(s.token, tls.ExportKeyingMaterial, labelSeed)
	if err != nil {
		return
	}
	m.wmu.Lock()
	st.SetWriteDeadline(time.Now().Add(max(10*time.Second, m.idle))) // the silence the joiner tolerates
	err = writeFrame(st, w)
	if err == nil {
		m.st = st
	}
	m.wmu.Unlock()
	if err != nil {
		s.lost(m, fmt.Sprintf("its connection to the seed failed: %v", err))
		return
	}
	s.watch(conn, st, m)
}

// watch waits for m's report of its mesh formation; a connection that ends
// first means m was lost while the others formed the mesh.
func (s *Seed) watch(conn *quic.Conn, st *quic.Stream, m *member) {
	stop := context.AfterFunc(s.life, func() { conn.CloseWithError(0, "seed closed") })
	defer stop()
	st.SetReadDeadline(time.Time{}) // the connection's idle timeout bounds it
	var rep reportMsg
	if err := readFrame(st, maxJoinFrame, &rep); err != nil {
		select {
		case <-s.done:
			return
		default:
		}
		why := "its connection to the seed ended"
		if pid := m.exited.Load(); pid != 0 {
			s.lost(m, fmt.Sprintf("its process (pid %d) on this host exited before it reported the mesh formed", pid))
			return
		}
		if isTimeout(err) {
			why = fmt.Sprintf("it was silent for %v", m.idle)
		}
		s.lost(m, fmt.Sprintf("%s before it reported the mesh formed: %v", why, err))
		return
	}
	if !rep.OK {
		// Its formation failed: the others will not complete theirs with
		// it, so they are told at once rather than when its connection ends.
		s.lost(m, "its formation of the mesh failed")
		st.Close()
		s.linger(conn)
		return
	}
	s.settle(m)
	st.Close()
	s.linger(conn)
}

// watchProc watches m's process when it runs on this machine, in this
// seed's pid namespace: its exit then ends m's connection at once (and m
// is lost, or removed before the formation), instead of at its idle
// timeout, which a joiner on the seed's machine may make long (core:
// a starved but live process is not lost for its silence). A claim that
// cannot be watched leaves m to its idle timeout, as before.
func (s *Seed) watchProc(m *member, c *procClaim) {
	if c == nil || s.self == nil || c.Machine != s.self.Machine || c.PIDNS != s.self.PIDNS {
		return
	}
	s.mu.Lock()
	if s.procs == nil && s.procsErr == nil {
		s.procs, s.procsErr = procwatch.New(s.procExited)
		if s.procsErr != nil {
			s.log.Debug("nexar seed: cannot watch joiners' processes", "err", s.procsErr)
		}
	}
	w := s.procs
	key := s.nextKey
	s.nextKey++
	if w != nil {
		if s.procKeys == nil {
			s.procKeys = map[int]*member{}
		}
		s.procKeys[key] = m
	}
	s.mu.Unlock()
	if w == nil {
		return
	}
	if err := w.Add(key, procwatch.ID{PID: c.PID, Start: c.Start, PIDNS: c.PIDNS}); err != nil {
		s.log.Debug("nexar seed: cannot watch a joiner's process", "pid", c.PID, "err", err)
		s.mu.Lock()
		delete(s.procKeys, key)
		s.mu.Unlock()
	}
}

// procExited ends the connection of the member whose process exited.
func (s *Seed) procExited(key, pid int) {
	s.mu.Lock()
	m := s.procKeys[key]
	delete(s.procKeys, key)
	s.mu.Unlock()
	if m == nil {
		return
	}
	m.exited.Store(int64(pid))
	m.conn.CloseWithError(0, "process exited")
}

// settle records that m reported or was lost; false if it had already.
func (s *Seed) settle(m *member) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.settled {
		return false
	}
	m.settled = true
	s.settled++
	if s.settled == s.size {
		close(s.allSettled)
	}
	return true
}

// lost tells every member still forming that m was lost, and why.
func (s *Seed) lost(m *member, why string) {
	if !s.settle(m) {
		return
	}
	s.log.Warn("nexar seed: rank lost during formation", "rank", m.rank, "why", why)
	s.tell.Lock()
	defer s.tell.Unlock()
	s.mu.Lock()
	var tell []*member
	for _, o := range s.members {
		if o != m && !o.settled {
			tell = append(tell, o)
		}
	}
	s.mu.Unlock()
	for _, o := range tell {
		o.wmu.Lock()
		if o.st != nil {
			o.st.SetWriteDeadline(time.Now().Add(2 * time.Second))
			_ = writeFrame(o.st, noticeMsg{Lost: m.rank, Why: why})
		}
		o.wmu.Unlock()
		if s.noticeGap > 0 {
			time.Sleep(s.noticeGap)
		}
	}
}

// linger gives the peer a moment to read what was written before the
// connection is closed: until it closes (it does once it read a refusal),
// at most 5 s. Not cut short by Close, which waits for it: closing the
// connection first would discard the refusal unread, and the joiner would
// see only "Application error 0x0" (seen when rank 0, refused itself,
// closed its embedded seed while another host's rank was being refused).
func (s *Seed) linger(conn *quic.Conn) {
	select {
	case <-conn.Context().Done():
	case <-time.After(5 * time.Second):
	}
}

var errFormed = errors.New("the job is already formed")

func joiner(want int) string {
	if want < 0 {
		return "a rank without a requested rank"
	}
	return fmt.Sprintf("rank %d", want)
}

func topoName(t string) string {
	if t == "" {
		return `"full"`
	}
	return strconv.Quote(t)
}

func (s *Seed) add(m *member) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.formed:
		return fmt.Errorf("%w (%d ranks)", errFormed, s.size)
	default:
	}
	if m.want < -1 || m.want >= s.size {
		return fmt.Errorf("rank %d is out of range [0, %d)", m.want, s.size)
	}
	for _, o := range s.members {
		if m.want >= 0 && o.want == m.want {
			return fmt.Errorf("rank %d has already joined", m.want)
		}
	}
	if s.why != "" {
		return errors.New(s.why)
	}
	if len(s.members) > 0 && s.members[0].topo != m.topo {
		s.why = fmt.Sprintf("topology mismatch: %s joined with topology %s, %s with %s (every rank must use the same NEXAR_TOPOLOGY)",
			joiner(s.members[0].want), topoName(s.members[0].topo), joiner(m.want), topoName(m.topo))
		close(s.mismatch)
		return errors.New(s.why)
	}
	if len(s.members) == 0 {
		s.firstJoin = time.Now()
	}
	s.members = append(s.members, m)
	if len(s.members) < s.size {
		return nil
	}
	// Everyone is here: explicit ranks first, then join order.
	taken := make([]bool, s.size)
	for _, o := range s.members {
		if o.want >= 0 {
			o.rank, taken[o.want] = o.want, true
		}
	}
	next := 0
	for _, o := range s.members {
		if o.want < 0 {
			for taken[next] {
				next++
			}
			o.rank, taken[next] = next, true
		}
	}
	if why := unreachableMember(s.members); why != "" {
		s.why = why
		close(s.mismatch)
		return errors.New(why)
	}
	s.table = make([]peerMsg, s.size)
	for _, o := range s.members {
		s.table[o.rank] = peerMsg{Rank: o.rank, Addr: o.addr, FP: o.fp, Lobby: o.lobby, Host: o.host}
	}
	close(s.formed)
	return nil
}

// unreachableMember names a member that advertises a loopback or
// link-local address while members on another host would have to dial it
// ("" if there is none): formation would wait for the connect timeout. A
// member's host is told by the address it joined from: loopback or one of
// this host's addresses is the seed's host, any other is a host of its own.
func unreachableMember(members []*member) string {
	local, _ := net.InterfaceAddrs()
	hostOf := func(m *member) string {
		if m.from == nil || m.from.IsLoopback() {
			return ""
		}
		for _, a := range local {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(m.from) {
				return ""
			}
		}
		return m.from.String()
	}
	byRank := append([]*member(nil), members...)
	sort.Slice(byRank, func(i, j int) bool { return byRank[i].rank < byRank[j].rank })
	for _, m := range byRank {
		host, _, err := net.SplitHostPort(m.addr)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !(ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
			continue
		}
		var others []string
		from := map[string]bool{}
		for _, o := range byRank {
			if h := hostOf(o); h != hostOf(m) {
				others = append(others, strconv.Itoa(o.rank))
				from[o.from.String()] = true
			}
		}
		if len(others) == 0 {
			continue
		}
		addrs := make([]string, 0, len(from))
		for a := range from {
			addrs = append(addrs, a)
		}
		sort.Strings(addrs)
		return fmt.Sprintf("rank %d advertises %s, a loopback or link-local address, but ranks %s joined from other hosts (%s) "+
			"and cannot dial it: set NEXAR_ADVERTISE_ADDR (or NEXAR_BIND_ADDR) on rank %d's host to an address they reach, "+
			"or name the seed by an address that is not loopback there (its host name may resolve to 127.0.1.1)",
			m.rank, m.addr, strings.Join(others[:min(len(others), 16)], ", "), strings.Join(addrs[:min(len(addrs), 8)], ", "), m.rank)
	}
	return ""
}

// logWaits logs, while some ranks have joined and others have not, how many
// joined and which are missing: WaitLogFirst after the first joined, then
// every WaitLogEvery, until the job forms or the seed closes.
func (s *Seed) logWaits() {
	t := time.NewTicker(time.Second) // the granularity of the intervals
	defer t.Stop()
	var logged time.Time
	for {
		select {
		case <-t.C:
		case <-s.formed:
			return
		case <-s.mismatch:
			return
		case <-s.done:
			return
		}
		s.mu.Lock()
		n, first := len(s.members), s.firstJoin
		taken := make([]bool, s.size)
		var from []string
		auto := false
		for _, m := range s.members {
			if m.want >= 0 {
				taken[m.want] = true
			} else {
				auto = true
			}
			if len(from) < 8 {
				from = append(from, m.addr)
			}
		}
		s.mu.Unlock()
		now := time.Now()
		if n == 0 || now.Sub(first) < WaitLogFirst || (!logged.IsZero() && now.Sub(logged) < WaitLogEvery) {
			continue
		}
		var missing []string
		for r, ok := range taken {
			if !ok && len(missing) < 16 {
				missing = append(missing, strconv.Itoa(r))
			}
		}
		if auto {
			missing = []string{fmt.Sprintf("%d ranks (assigned at formation)", s.size-n)}
		}
		s.log.Warn("nexar seed: waiting for ranks to join", "addr", s.Addr().String(), "joined", n, "world_size", s.size,
			"missing", strings.Join(missing, ","), "joined_advertising", strings.Join(from, ","),
			"waited", now.Sub(first).Round(time.Second))
		logged = now
	}
}

func (s *Seed) remove(m *member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, o := range s.members {
		if o == m {
			s.members = append(s.members[:i], s.members[i+1:]...)
			return
		}
	}
}

// Join registers with the seed at addr and returns this rank's number and
// the peer table. It retries until ctx ends while the seed is not up yet, or
// while the seed there is an earlier job's that has already formed (this
// rank is early for the next job on the same address).
func Join(ctx context.Context, addr string, token []byte, rank int, advertise string, fp [32]byte) (int, []transport.Peer, error) {
	r, peers, sl, err := JoinWatched(ctx, addr, token, rank, advertise, fp)
	if sl != nil {
		sl.Finish(true)
	}
	return r, peers, err
}

// JoinOptions is what a joiner tells the seed beyond its address, and
// what every joiner must agree on.
type JoinOptions struct {
	// Topology is the joiner's topology (topology.Spec.String; "" is the
	// full mesh). A joiner whose topology differs from the first
	// joiner's fails the formation for every rank, with an error naming
	// both values.
	Topology string
	// Lobby is the host:port of this rank's lobby (core's grow), "" for
	// none; every member learns every member's (JoinWatchedLobby).
	Lobby string
	// SeedUp says the seed runs already (a grow's, started before its
	// address was handed out): a seed that cannot be reached is gone, so
	// the join fails at once instead of retrying until its deadline.
	SeedUp bool
	// IdleTimeout is how long the connection to the seed may stay silent
	// before either end declares the other lost (0: IdleTimeout; at most
	// MaxIdleTimeout). Longer suits a world of many ranks on few cores,
	// where a busy joiner may not be scheduled for seconds.
	IdleTimeout time.Duration
	// Host names this rank's host, for the members' host-aware schedules
	// (transport.Peer.Host); "" says nothing.
	Host string
	// claim (tests) is sent as this joiner's process instead of its own.
	claim *procClaim
	// Log (nil: slog.Default()) receives the waits: a joiner that has not
	// reached the seed, or waits for the other ranks, says so after
	// WaitLogFirst and every WaitLogEvery after, at Warn level.
	Log *slog.Logger
}

// A wait for the seed or for the other ranks is logged after WaitLogFirst,
// then every WaitLogEvery, by the joiner (which seed, at which address) and
// by the seed (which ranks, from where).
const (
	WaitLogFirst = 5 * time.Second
	WaitLogEvery = 30 * time.Second
)

func (o JoinOptions) log() *slog.Logger {
	if o.Log == nil {
		return slog.Default()
	}
	return o.Log
}

// logWhile logs msg (with args and the time waited) after WaitLogFirst and
// every WaitLogEvery until the returned stop is called.
func logWhile(log *slog.Logger, msg string, args ...any) (stop func()) {
	start := time.Now()
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTimer(WaitLogFirst)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			log.Warn(msg, append(args, "waited", time.Since(start).Round(time.Second))...)
			t.Reset(WaitLogEvery)
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

func (o JoinOptions) idle() time.Duration {
	if o.IdleTimeout <= 0 {
		return IdleTimeout
	}
	return min(o.IdleTimeout, MaxIdleTimeout)
}

// SeedLink is a joiner's connection to the seed after the welcome, kept
// while it forms the mesh: Watch reports members the seed lost meanwhile,
// Finish reports the outcome and lets the connection go.
type SeedLink struct {
	conn *quic.Conn
	st   *quic.Stream
	sock *dialSocket
	once sync.Once
}

// Watch calls lost (from a goroutine of its own, at most once) if the seed
// reports a member lost during formation. It ends with Finish.
func (l *SeedLink) Watch(lost func(rank int, why string)) {
	go func() {
		var n noticeMsg
		if err := readFrame(l.st, maxJoinFrame, &n); err == nil {
			lost(n.Lost, n.Why)
		}
	}()
}

// Finish reports the end of this rank's formation to the seed and closes
// the connection in the background, once the seed had a moment to read it
// (at most 2 s). Safe to call more than once.
func (l *SeedLink) Finish(ok bool) {
	l.once.Do(func() {
		l.st.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_ = writeFrame(l.st, reportMsg{OK: ok})
		l.st.Close()
		go func() {
			t := time.NewTimer(2 * time.Second)
			defer t.Stop()
			select {
			case <-l.conn.Context().Done():
			case <-t.C:
			}
			l.conn.CloseWithError(0, "")
			l.sock.close()
		}()
	})
}

// JoinWatched is Join that keeps the connection to the seed (see SeedLink).
//
// The options carry what every rank must agree on (JoinOptions).
func JoinWatched(ctx context.Context, addr string, token []byte, rank int, advertise string, fp [32]byte, opts ...JoinOptions) (int, []transport.Peer, *SeedLink, error) {
	var o JoinOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	r, peers, _, sl, err := JoinWatchedLobby(ctx, addr, token, rank, advertise, fp, o)
	return r, peers, sl, err
}

// JoinWatchedLobby is JoinWatched that also returns every member's lobby
// address (JoinOptions.Lobby), by rank ("" for a member without one).
func JoinWatchedLobby(ctx context.Context, addr string, token []byte, rank int, advertise string, fp [32]byte, o JoinOptions) (int, []transport.Peer, []string, *SeedLink, error) {
	id, err := identity.New()
	if err != nil {
		return 0, nil, nil, nil, err
	}
	tc := identity.ClientTLSConfig(id, func([32]byte) error { return nil }) // the seed proves the token instead
	tc.NextProtos = []string{rdvALPN}
	backoff := 100 * time.Millisecond
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
		return true
	}
	start, logged := time.Now(), time.Time{}
	for {
		var conn *quic.Conn
		var sock *dialSocket
		for {
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			sock, err = newDialSocket(addr)
			if err == nil {
				conn, err = sock.tr.Dial(actx, sock.raddr, tc, &quic.Config{HandshakeIdleTimeout: 3 * time.Second, MaxIdleTimeout: o.idle(), KeepAlivePeriod: rdvKeepAlive})
				if err != nil {
					sock.close()
				}
			}
			cancel()
			if err == nil {
				break
			}
			if o.SeedUp {
				return 0, nil, nil, nil, errorf(abi.ErrPeerDown, "rendezvous", err, "the seed at %s is gone: %v", addr, err)
			}
			if now := time.Now(); now.Sub(start) >= WaitLogFirst && now.Sub(logged) >= WaitLogEvery {
				o.log().Warn("nexar: rendezvous: waiting for the seed, not reached yet", "rank", rank, "seed", addr,
					"waited", now.Sub(start).Round(time.Second), "err", err)
				logged = now
			}
			if !wait() {
				return 0, nil, nil, nil, errorf(abi.ErrTimeout, "rendezvous", err, "cannot reach the seed at %s after %v: %v (%s)",
					addr, time.Since(start).Round(time.Second), err, unreachableHint(addr))
			}
		}
		r, peers, lobbies, st, formed, err := joinOnce(ctx, conn, addr, token, rank, advertise, fp, o)
		if err == nil {
			return r, peers, lobbies, &SeedLink{conn: conn, st: st, sock: sock}, nil
		}
		conn.CloseWithError(0, "")
		sock.close()
		if seedBusy(err) {
			if !wait() {
				return 0, nil, nil, nil, err
			}
			continue
		}
		if !formed {
			return r, peers, nil, nil, err
		}
		if !wait() {
			return 0, nil, nil, nil, errorf(abi.ErrTimeout, "rendezvous", err, "the seed at %s serves a job that had already formed, and no new one started there in time "+
				"(an earlier job on this address still runs, or this process is one rank too many): %v", addr, err)
		}
	}
}

// seedBusy reports whether err is the seed's refusal of a connection it
// had no room for: quic-go refuses a handshake that completes while its
// listener's accept queue is full (hundreds of ranks joining at once).
// Worth another try, as a failed dial is.
func seedBusy(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused
}

// joinOnce is one attempt of Join on conn; formed reports that the seed
// refused because its job has already formed. On success it returns the
// stream, which the seed keeps until this rank reports (SeedLink).
func joinOnce(ctx context.Context, conn *quic.Conn, addr string, token []byte, rank int, advertise string, fp [32]byte, o JoinOptions) (int, []transport.Peer, []string, *quic.Stream, bool, error) {
	fail := func(code int, format string, args ...any) (int, []transport.Peer, []string, *quic.Stream, bool, error) {
		return 0, nil, nil, nil, false, errorf(code, "rendezvous", nil, format, args...)
	}
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return 0, nil, nil, nil, false, errorf(abi.ErrInternal, "rendezvous", err, "seed %s: %v", addr, err)
	}
	tls := conn.ConnectionState().TLS
	p, err := proof(token, tls.ExportKeyingMaterial, labelJoin)
	if err != nil {
		return fail(abi.ErrInternal, "%v", err)
	}
	if err := writeFrame(st, joinMsg{V: rdvVersion, Rank: rank, Addr: advertise, FP: fp[:], Proof: p, Lobby: o.Lobby, Topo: o.Topology, Idle: o.idle().Milliseconds(), Host: o.Host, Proc: o.procClaim()}); err != nil {
		return fail(abi.ErrInternal, "seed %s: %v", addr, err)
	}
	var w welcomeMsg
	stop := logWhile(o.log(), "nexar: rendezvous: joined the seed, waiting for the other ranks to join (the seed logs which)",
		"rank", rank, "seed", addr, "advertised", advertise)
	err = readFrameCtx(ctx, st, maxWelcome, &w)
	stop()
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fail(abi.ErrTimeout, "seed %s: stopped waiting for the peer table: %v", addr, context.Cause(ctx))
		}
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || isTimeout(err) {
			return fail(abi.ErrTimeout, "seed %s: not every rank joined in time (the seed's log names the missing ranks): %v", addr, err)
		}
		return 0, nil, nil, nil, false, errorf(abi.ErrInternal, "rendezvous", err, "seed %s: reading the peer table: %v", addr, err)
	}
	if w.V != rdvVersion {
		return fail(abi.ErrInvalidArgument, "seed %s speaks rendezvous version %d, want %d", addr, w.V, rdvVersion)
	}
	if w.Code != 0 {
		code := w.Code
		if code <= abi.Success || code >= abi.NumResults {
			code = abi.ErrInternal
		}
		r, peers, _, _, _, err := fail(code, "seed %s refused: %s", addr, w.Err[:min(len(w.Err), 512)])
		return r, peers, nil, nil, w.Formed, err
	}
	want, err := proof(token, tls.ExportKeyingMaterial, labelSeed)
	if err != nil || !hmac.Equal(want, w.Proof) {
		return fail(abi.ErrAuth, "seed %s did not prove the token: not our seed", addr)
	}
	if w.Size < 1 || len(w.Peers) != w.Size || w.Rank < 0 || w.Rank >= w.Size {
		return fail(abi.ErrInternal, "seed %s sent an inconsistent peer table", addr)
	}
	peers := make([]transport.Peer, w.Size)
	lobbies := make([]string, w.Size)
	for i, pm := range w.Peers {
		if pm.Rank != i || len(pm.FP) != 32 {
			return fail(abi.ErrInternal, "seed %s sent a bad peer table row %d", addr, i)
		}
		peers[i] = transport.Peer{Rank: i, Addr: pm.Addr, Host: pm.Host}
		copy(peers[i].Fingerprint[:], pm.FP)
		lobbies[i] = pm.Lobby
	}
	st.SetReadDeadline(time.Time{})
	return w.Rank, peers, lobbies, st, false, nil
}

// dialSocket is the UDP socket a joiner reaches the seed from: bound to the
// address that routes to the seed, not to every interface, and closed with
// the connection (the connection outlives the welcome: SeedLink).
type dialSocket struct {
	udp   *net.UDPConn
	tr    *quic.Transport
	raddr *net.UDPAddr
}

func newDialSocket(seed string) (*dialSocket, error) {
	raddr, err := net.ResolveUDPAddr("udp", seed)
	if err != nil {
		return nil, err
	}
	laddr := &net.UDPAddr{}
	if ip, err := RouteTo(seed); err == nil {
		laddr.IP = ip
	}
	udp, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, err
	}
	return &dialSocket{udp: udp, tr: &quic.Transport{Conn: udp}, raddr: raddr}, nil
}

func (d *dialSocket) close() {
	if d != nil {
		d.tr.Close()
		d.udp.Close()
	}
}

// unreachableHint says what to set when the seed at addr cannot be reached.
func unreachableHint(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && (ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
		return "a loopback or link-local seed is reachable from its own host only: on a job across hosts, " +
			"set NEXAR_ADVERTISE_ADDR on rank 0's host to an address the others reach"
	}
	return "check that this host reaches it: NEXAR_SEED, or MASTER_ADDR, or rank 0's NEXAR_ADVERTISE_ADDR names it"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// RouteTo is the IP of the interface this host would send from to reach
// hostport. A UDP "connection" sends nothing; it only asks the kernel for a
// route.
func RouteTo(hostport string) (net.IP, error) {
	c, err := net.Dial("udp", hostport)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}
