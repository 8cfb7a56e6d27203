package core

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/topology"
)

// This file is growth (docs/fault-tolerance.md): processes started later join a running
// job. Each rank of a world of more than one runs a lobby
// (membership.Lobby) where such processes (Join) wait, having proven the
// job's token. The members call Grow at a point of their choosing:
//
//  1. An agreement on the communicator (as Shrink's) decides, besides the
//     failed members, which joiners come in: each member contributes the
//     ids of those waiting in its lobby, and the decision is their union,
//     cut to MaxWorldSize in a fixed order. Survivors keep their order;
//     joiners follow in the decided order.
//  2. The lowest surviving member (the leader; never a dead rank 0) starts
//     a seed for the grown world and sends its address to the others
//     (ctlGrow). Each member tells its own admitted joiners where to go.
//  3. Everyone forms a new mesh through that seed, as New does, and a
//     first agreement on it confirms that every member formed it: a
//     member or joiner lost meanwhile fails the grow for all of them, and
//     the members carry on with the communicator they had.
//
// The grown world is a new mesh (new connections), in the next membership
// generation. The lobby passes to it, so its address stays the same.

// nodeLobby is a rank's lobby and the address it announced. l is nil
// until rank 0 takes over the embedded seed's address (takeOver).
type nodeLobby struct {
	addr string
	done chan struct{}

	mu     sync.Mutex
	l      *membership.Lobby
	closed bool
}

// get returns the lobby's listener; nil for none (also on a nil lb).
func (lb *nodeLobby) get() *membership.Lobby {
	if lb == nil {
		return nil
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.l
}

func (lb *nodeLobby) close() {
	lb.mu.Lock()
	l := lb.l
	if !lb.closed {
		lb.closed = true
		close(lb.done)
	}
	lb.mu.Unlock()
	if l != nil {
		l.Close()
	}
}

// startNodeLobby starts this rank's lobby: on cfg.JoinAddr, else on a free
// port of its bind IP; announced with the advertised host. Rank 0 with the
// embedded seed (takeSeed) announces the seed's address and listens there
// once the seed is done (takeOver).
func startNodeLobby(cfg Config, adv string, takeSeed bool) (*nodeLobby, error) {
	lb := &nodeLobby{done: make(chan struct{})}
	if takeSeed && cfg.JoinAddr == "" {
		lb.addr = cfg.Seed
		return lb, nil
	}
	addr := cfg.JoinAddr
	if addr == "" {
		host, _, _ := net.SplitHostPort(cfg.BindAddr)
		addr = net.JoinHostPort(host, "0")
	}
	l, err := membership.StartLobby(addr, cfg.Token, cfg.Logger.With("subsys", SubsysInit))
	if err != nil {
		return nil, withOp(fromMembership(err), "new")
	}
	host, _, _ := net.SplitHostPort(adv)
	if h, _, err := net.SplitHostPort(cfg.JoinAddr); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			host = h
		}
	}
	lb.l = l
	lb.addr = net.JoinHostPort(host, strconv.Itoa(l.Addr().(*net.UDPAddr).Port))
	return lb, nil
}

// takeOver listens on the embedded seed's address once the seed has served
// the formation and closed, so that joiners reach the job through the seed.
func (lb *nodeLobby) takeOver(seed *Seed, cfg Config) {
	select {
	case <-seed.Settled():
	case <-time.After(cfg.ConnectTimeout):
	case <-lb.done:
		return
	}
	addr := seed.Addr().String()
	seed.Close()
	for try := 0; ; try++ {
		l, err := membership.StartLobby(addr, cfg.Token, cfg.Logger.With("subsys", SubsysInit))
		if err == nil {
			lb.mu.Lock()
			if lb.closed {
				lb.mu.Unlock()
				l.Close()
				return
			}
			lb.l = l
			lb.mu.Unlock()
			return
		}
		if try == 50 {
			cfg.Logger.Warn("nexar: the lobby cannot take over the seed's address; joiners must use another member's", "addr", addr, "err", err)
			return
		}
		select {
		case <-lb.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// JoinAddrs returns the lobby addresses of c's members, by rank ("" for a
// member without one): where processes started later (Join) reach the
// job. Safe for concurrent use.
func (c *Comm) JoinAddrs() []string {
	out := make([]string, c.size)
	for r, w := range c.world {
		if w < len(c.n.lobbies) {
			out[r] = c.n.lobbies[w]
		}
	}
	return out
}

// joinRecord is a member's contribution to a grow's agreement for one
// joiner in its lobby: the member's rank, then the joiner's id.
func joinRecord(member int, id []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(member))
	return append(b, id...)
}

type joiner struct {
	member int
	id     []byte
}

// admitted reads the joiners a grow's decision names, in its order,
// without those of failed members or repeated ids, at most room.
func admitted(d *membership.Decision, size, room int) []joiner {
	var js []joiner
	for _, b := range d.Extra {
		if len(b) != 4+membership.JoinIDSize {
			continue
		}
		m := int(binary.BigEndian.Uint32(b))
		id := b[4:]
		if m >= size || slices.Contains(d.Failed, m) ||
			slices.ContainsFunc(js, func(j joiner) bool { return bytes.Equal(j.id, id) }) {
			continue
		}
		js = append(js, joiner{m, id})
	}
	return js[:min(len(js), max(room, 0))]
}

// Grow admits the processes waiting to join the job (Join) and returns a
// communicator of c's live members, in c's order, followed by the joiners
// (ULFM has no such call; it is torchft's reconfiguration of a group at a
// step the members choose). Every live member of c must call it, at the
// same point in their sequence of agreements (Agree, Shrink, Grow). It
// agrees on the failed members and the joiners (at most MaxWorldSize
// members in all), forms the grown world's mesh and confirms it; if a
// member or joiner fails meanwhile, every member gets an error and keeps
// c. With nobody waiting, the result is the survivors' communicator on the
// existing connections, like Shrink's but without revoking c. Members of
// c that failed are left out either way. Only joiners that answer their
// lobby's ping within admissionWindow (2 s) are proposed; a stopped or
// starved one stays waiting for a later grow. It works on a failed or revoked
// communicator, and on a healthy one under every policy. The deadline is
// ctx's, else Config.Timeout. c stays to be closed.
func (c *Comm) Grow(ctx context.Context) (*Comm, error) {
	const op = "grow"
	if ctx == nil {
		ctx = context.Background()
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	c.n.mu.Lock()
	lb := c.n.lobby
	c.n.mu.Unlock()
	var extra [][]byte
	if l := lb.get(); l != nil {
		for _, id := range l.Ready(ctx, admissionWindow) {
			extra = append(extra, joinRecord(c.rank, id))
		}
	}
	d, k, err := c.agree(ctx, op, ^uint64(0), extra, true)
	if err != nil {
		return nil, err
	}
	world, me := c.survivors(d.Failed)
	js := admitted(d, c.size, c.n.maxWorld-len(world))
	if len(js) == 0 {
		return c.successorComm(op, k, me, world)
	}
	n := len(world) + len(js)
	gen := c.gen + 1
	leader, _ := c.rankOfWorld(world[0]) // the lowest survivor
	bindHost, _, _ := net.SplitHostPort(c.n.cfg.BindAddr)
	advHost, _, _ := net.SplitHostPort(c.n.adv)
	var seed *Seed
	var seedAddr string
	if c.rank == leader {
		seed, err = startSeed(net.JoinHostPort(bindHost, "0"), n, c.cfg.Token, c.n.log.With("subsys", SubsysInit))
		if err == nil {
			seedAddr = net.JoinHostPort(advHost, strconv.Itoa(seed.Addr().(*net.UDPAddr).Port))
		}
		c.sendControl(ctlGrow, k, []byte(seedAddr), -1)
		if err != nil {
			return nil, withOp(err, op)
		}
	} else if seedAddr, err = c.awaitGrowSeed(ctx, k, leader); err != nil {
		return nil, err
	}
	// A member that dies while the grown world forms is seen here at once
	// (on the existing connections), and so is a joiner that left before
	// its admission (ctlGrowAbort): formation ends then, rather than when
	// the grown world's seed gives up on the missing member.
	fctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	defer c.watchGrow(k, lost)()
	c.mu.Lock()
	hook := c.rec.afterGrowAgreement
	c.mu.Unlock()
	if hook != nil {
		hook()
	}
	if l := lb.get(); l != nil {
		for i, j := range js {
			r := len(world) + i
			if j.member == c.rank && !l.Admit(j.id, membership.Admission{Seed: seedAddr, Rank: r, Size: n, Gen: uint32(gen), Max: c.n.maxWorld, Topology: c.n.cfg.Topology.String()}) {
				c.sendControl(ctlGrowAbort, k, binary.LittleEndian.AppendUint32(nil, uint32(r)), -1)
				c.abandonGrow(k, joinerLeft(r, c.rank))
			}
		}
	}
	cfg := c.n.cfg
	cfg.Rank, cfg.WorldSize, cfg.Seed, cfg.Join = me, n, seedAddr, false
	cfg.BindAddr, cfg.AdvertiseAddr = net.JoinHostPort(bindHost, "0"), advHost
	cfg.MaxWorldSize, cfg.MinWorldSize = c.n.maxWorld, c.n.minWorld
	cfg.OnFailure = c.FailurePolicy()
	for r, w := range world {
		if r != me {
			stop := context.AfterFunc(c.n.downSig[w].ctx, func() {
				r, _ := c.rankOfWorld(w)
				lost(newError(CodePeerDown, op, r, "rank %d failed while the grown world formed", r))
			})
			defer stop()
		}
	}
	nc, err := form(fctx, cfg, formOpts{seed: seed, gen: gen, lobby: lb, seedUp: true})
	if err != nil {
		// Why a grow was abandoned (a joiner left, a member died) is sent
		// before its seed closes, but on other connections: give it a
		// moment to arrive, so that every member names the cause rather
		// than the seed's going away.
		t := time.NewTimer(growCauseGrace)
		select {
		case <-fctx.Done():
		case <-t.C:
		}
		t.Stop()
		if cause := context.Cause(fctx); cause != nil && ctx.Err() == nil {
			err = cause // a member died: name it
		}
		return nil, withOp(err, op)
	}
	if err := nc.confirmGrow(ctx); err != nil {
		nc.n.mu.Lock()
		nc.n.lobby = nil // still c's node's
		nc.n.mu.Unlock()
		nc.Close()
		return nil, err
	}
	c.n.mu.Lock()
	if c.n.lobby == lb {
		c.n.lobby = nil // the grown world's node has it now
	}
	c.n.mu.Unlock()
	return nc, nil
}

// admissionWindow is how long a grow waits for its lobby's joiners to
// answer a ping before it proposes them: one that does not (a stopped or
// starved process) waits for a later grow, instead of holding the grown
// world's formation, and every member's grow, until the timeout.
const admissionWindow = 2 * time.Second

// confirmGrow is the grown world's first agreement: every member formed it.
func (c *Comm) confirmGrow(ctx context.Context) error {
	d, _, err := c.agree(ctx, "grow", 1, nil, true)
	if err != nil {
		return err
	}
	if len(d.Failed) > 0 {
		return newError(CodePeerDown, "grow", d.Failed[0],
			"rank(s) %v of the grown communicator failed while it formed; the members keep the communicator they had", d.Failed)
	}
	return nil
}

// growCauseGrace bounds how long a member whose formation of the grown
// world failed waits for the reason (ctlGrowAbort, a member's death).
const growCauseGrace = time.Second

// growEnd is how a grow in formation is ended early: by the first reason
// that comes (err), through the formation's cancel once it is watched.
type growEnd struct {
	err    error
	cancel context.CancelCauseFunc
}

// joinerLeft is the error of a grow abandoned because the joiner that was
// to be rank r of the grown world had left member m's lobby.
func joinerLeft(r, m int) *Error {
	return newError(CodePeerDown, "grow", r,
		"the joiner that was to be rank %d of the grown world left rank %d's lobby before it was admitted; the grow is abandoned and the members keep the communicator they had", r, m)
}

// watchGrow makes grow k's abandonment cancel its formation (at once if
// it was abandoned already); the returned function ends the watch.
func (c *Comm) watchGrow(k uint64, cancel context.CancelCauseFunc) (unwatch func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec.growEnds == nil {
		c.rec.growEnds = make(map[uint64]*growEnd)
	}
	e := c.rec.growEnds[k]
	if e == nil {
		e = &growEnd{}
		c.rec.growEnds[k] = e
	}
	e.cancel = cancel
	if e.err != nil {
		cancel(e.err)
	}
	return func() {
		c.mu.Lock()
		delete(c.rec.growEnds, k)
		c.mu.Unlock()
	}
}

// abandonGrow ends grow k's formation with err (the first reason wins);
// a grow not watched yet takes it when it is.
func (c *Comm) abandonGrow(k uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec.growEnds == nil {
		c.rec.growEnds = make(map[uint64]*growEnd)
	}
	e := c.rec.growEnds[k]
	if e == nil {
		if len(c.rec.growEnds) > maxAgreeAhead {
			return
		}
		e = &growEnd{}
		c.rec.growEnds[k] = e
	}
	if e.err != nil {
		return
	}
	e.err = err
	if e.cancel != nil {
		e.cancel(err)
	}
}

// growAbortMessage is a ctlGrowAbort from member src for grow k.
func (c *Comm) growAbortMessage(src int, k uint64, payload []byte) {
	if len(payload) != 4 {
		return
	}
	c.abandonGrow(k, joinerLeft(int(binary.LittleEndian.Uint32(payload)), src))
}

// growSeed is a ctlGrow message: its sender and the seed address it
// names ("" when the sender could not start a seed).
type growSeed struct {
	from int
	addr string
}

// growMessage takes the leader's seed address for grow k.
func (c *Comm) growMessage(src int, k uint64, payload []byte) {
	if len(payload) > 512 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec.growSeeds == nil {
		c.rec.growSeeds = make(map[uint64]growSeed)
		c.rec.growWake = make(chan struct{}, 1)
	}
	if len(c.rec.growSeeds) > maxAgreeAhead {
		return
	}
	c.rec.growSeeds[k] = growSeed{src, string(payload)}
	select {
	case c.rec.growWake <- struct{}{}:
	default:
	}
}

// awaitGrowSeed waits for the leader of grow k to send its seed's address.
// A message from another rank is dropped. The leader's failure is polled
// (every 20 ms): the wait has no channel for it.
func (c *Comm) awaitGrowSeed(ctx context.Context, k uint64, leader int) (string, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c.mu.Lock()
		m, ok := c.rec.growSeeds[k]
		if ok {
			delete(c.rec.growSeeds, k)
		}
		wake := c.rec.growWake
		c.mu.Unlock()
		switch {
		case ok && m.from != leader:
			continue
		case ok && m.addr == "":
			return "", newError(CodeInternal, "grow", leader, "rank %d, the grow's leader, could not start the grown world's seed", leader)
		case ok:
			if _, _, err := net.SplitHostPort(m.addr); err != nil {
				return "", newError(CodeInternal, "grow", leader, "rank %d sent a bad seed address %q", leader, m.addr)
			}
			return m.addr, nil
		case c.peerIsDown(leader):
			return "", newError(CodePeerDown, "grow", leader, "rank %d, the grow's leader, failed before it started the grown world", leader)
		}
		select {
		case <-wake: // nil until the first message: the ticker polls
		case <-tick.C:
		case <-ctx.Done():
			return "", &Error{Code: CodeTimeout, Op: "grow", Rank: leader, Cause: ctx.Err(),
				Msg: fmt.Sprintf("rank %d, the grow's leader, sent no seed address in time", leader)}
		case <-c.rec.stop:
			return "", newError(CodeClosed, "grow", c.rank, "communicator is closed")
		}
	}
}

// Join makes this process a member of a running job (cfg.Token's): it
// waits in a member's lobby, through cfg.Seed (a comma-separated list of
// host:port: the seed's address, where rank 0's lobby listens once the job
// has formed, or any member's, Comm.JoinAddrs), until the members Grow, and
// returns its communicator in the grown world. cfg.Rank and cfg.WorldSize
// are ignored: the members decide. The wait is bounded by ctx and
// cfg.Timeout; a grow that fails after admitting this process sends it
// back to wait.
func Join(ctx context.Context, cfg Config) (*Comm, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if len(cfg.Token) == 0 {
		return nil, invalidArg("join", "no token: a joiner needs the job's secret (NEXAR_TOKEN)")
	}
	var addrs []string
	for _, a := range strings.Split(cfg.Seed, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, invalidArg("join", "lobby address %q is not host:port", a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, invalidArg("join", "no address to join through: set the seed (NEXAR_SEED) to the seed's or a member's lobby address")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	for {
		adm, err := membership.AwaitAdmission(ctx, addrs, cfg.Token)
		if err != nil {
			return nil, withOp(fromMembership(err), "join")
		}
		jc := cfg
		jc.Rank, jc.WorldSize, jc.Seed, jc.Join = adm.Rank, adm.Size, adm.Seed, false
		jc.MaxWorldSize = max(adm.Max, adm.Size)
		if adm.Topology != "" {
			spec, err := topology.Parse(adm.Topology)
			if err != nil {
				return nil, newError(CodeInternal, "join", -1, "the members sent a topology this build cannot parse: %v", err)
			}
			if spec != cfg.Topology && cfg.Topology != (topology.Spec{}) {
				cfg.Logger.Warn("nexar: joining with the running job's topology, not this process's", "job", adm.Topology, "own", cfg.Topology.String())
			}
			jc.Topology = spec
		}
		c, err := form(ctx, jc, formOpts{gen: membership.Generation(adm.Gen), seedUp: true})
		if err == nil {
			if err = c.confirmGrow(ctx); err == nil {
				return c, nil
			}
			c.Close()
		}
		if ctx.Err() != nil {
			return nil, withOp(err, "join")
		}
		var e *Error
		if errors.As(err, &e) && (e.Code == CodeAuth || e.Code == CodeInvalidArgument) {
			return nil, withOp(err, "join")
		}
		cfg.Logger.Warn("nexar: the grow that admitted this process failed; waiting again", "err", err)
	}
}
