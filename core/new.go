package core

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// New joins the job described by cfg: rendezvous through the seed (run
// embedded when this is rank 0 and cfg.Seed names an address of this host
// that nothing else holds; a stand-alone seed already there is joined),
// then the mesh that cfg.Mesh builds (mesh.Builder{}: QUIC with every
// peer and the bulk path over it; New fails naming Config.Mesh when it is
// nil). It is bounded by ctx and
// cfg.ConnectTimeout; a peer that closes or is lost before the job has
// formed fails it at once with CodePeerDown naming that rank. An embedded
// seed is closed once the job has formed, so a later New with the same
// cfg (after Close) forms a new job on the same address; a rank that
// reaches the earlier job's seed waits for the next one.
func New(ctx context.Context, cfg Config) (*Comm, error) {
	if cfg.Join {
		return Join(ctx, cfg)
	}
	return newQUIC(ctx, cfg, true)
}

func newQUIC(ctx context.Context, cfg Config, embed bool) (*Comm, error) {
	return form(ctx, cfg, formOpts{embed: embed})
}

// formOpts are the parts of a formation that New does not take from a
// Config: how a grown world forms (core/grow.go).
type formOpts struct {
	embed bool                  // rank 0 may run the seed embedded
	seed  *Seed                 // a seed this rank started for this formation (grow's leader)
	gen   membership.Generation // the world's generation (0: membership.First)
	lobby *nodeLobby            // a lobby carried over from the grown communicator's node
	// seedUp: the seed runs already (a grow's: the leader started it
	// before sending its address), so one that cannot be reached is gone.
	seedUp bool
	// dataDelay (tests) holds this rank this long after its data path
	// formed, as a slow bulk negotiation does: its peers may have formed
	// and started watching it.
	dataDelay time.Duration
}

func form(ctx context.Context, cfg Config, opts formOpts) (*Comm, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if err := cfg.Tuning.Validate(); err != nil {
		return nil, invalidArg("new", "Config.Tuning: %v", err)
	}
	if err := cfg.validateMemory(); err != nil {
		return nil, err
	}
	if cfg.WorldSize < 1 {
		return nil, invalidArg("new", "world size %d must be >= 1", cfg.WorldSize)
	}
	if cfg.Rank < -1 || cfg.Rank >= cfg.WorldSize {
		return nil, invalidArg("new", "rank %d is out of range [0, %d)", cfg.Rank, cfg.WorldSize)
	}
	graph, err := topologyGraph(cfg.Topology, cfg.WorldSize)
	if err != nil {
		return nil, err
	}
	sched, err := scheduleGraph(cfg, graph, cfg.WorldSize)
	if err != nil {
		return nil, err
	}
	if cfg.Mesh == nil {
		return nil, errNoMesh()
	}
	if err := transport.CheckBulkMode(cfg.Bulk); err != nil {
		return nil, invalidArg("new", "%v", err)
	}
	if cfg.WorldSize == 1 {
		cs, err := NewLocal(1, cfg)
		if err != nil {
			return nil, err
		}
		return cs[0], nil
	}
	if len(cfg.Token) == 0 {
		return nil, invalidArg("new", "no token: every rank needs the job's secret (NEXAR_TOKEN)")
	}
	if _, _, err := net.SplitHostPort(cfg.Seed); err != nil {
		return nil, invalidArg("new", "seed address %q is not host:port", cfg.Seed)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()

	var closers []func() error
	seed := opts.seed
	var lobby *nodeLobby // started here (not carried over): closed on failure
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
		if seed != nil {
			seed.Close()
		}
		if lobby != nil && lobby.l != nil {
			lobby.l.Close()
		}
	}
	if opts.embed && cfg.Rank == 0 && isLocalAddr(ctx, cfg.Seed) {
		var err error
		seed, err = startSeed(seedBindAddr(ctx, cfg.Seed), cfg.WorldSize, cfg.Token, cfg.Logger.With("subsys", SubsysInit))
		switch {
		case err == nil:
		case errors.Is(err, syscall.EADDRINUSE):
			// Something on this host holds the seed's port already: a
			// stand-alone `nexar seed`. Rank 0 joins it like any rank;
			// the token proof in join tells whether it is this job's.
			cfg.Logger.Debug("nexar: seed address in use; joining the seed there", "seed", cfg.Seed)
		default:
			return nil, err
		}
	}
	if cfg.BindAddr, err = bindAddr(cfg); err != nil {
		cleanup()
		return nil, err
	}
	ln, err := cfg.Mesh.Listen(meshOptions(cfg, graph))
	if err != nil {
		cleanup()
		return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
	}
	closers = append(closers, ln.Close)
	adv, err := advertiseAddr(cfg, ln.Addr())
	if err != nil {
		cleanup()
		return nil, err
	}
	// Every rank keeps a lobby for processes that join later (grow.go);
	// a grown world's members bring theirs along.
	jo := joinOptions(cfg)
	if isLocalAddr(ctx, cfg.Seed) {
		// The seed runs on this machine and watches this process
		// (membership: its exit ends the formation at once), so its
		// silence, a starved process's on a host with more ranks than
		// cores, need not count as a loss for long: up to the connect
		// timeout, which bounds the formation anyway.
		jo.IdleTimeout = max(jo.IdleTimeout, min(cfg.ConnectTimeout, membership.MaxIdleTimeout))
	}
	jo.SeedUp = opts.seedUp
	jo.Log = cfg.Logger.With("subsys", SubsysInit)
	if opts.lobby != nil {
		jo.Lobby = opts.lobby.addr
	} else {
		if lobby, err = startNodeLobby(cfg, adv, seed != nil && opts.seed == nil); err != nil {
			cleanup()
			return nil, err
		}
		jo.Lobby = lobby.addr
	}
	rank, peers, lobbies, sl, err := membership.JoinWatchedLobby(ctx, cfg.Seed, cfg.Token, cfg.Rank, adv, ln.Fingerprint(), jo)
	if err != nil {
		cleanup()
		return nil, fromMembership(err)
	}
	formedOK := false
	defer func() { sl.Finish(formedOK) }()
	nd := newNode(cfg, rank, cfg.WorldSize)
	nd.sched, nd.graph = sched, graph
	if cfg.Topology.Kind == topology.OnDemand {
		od, ok := ln.(transport.OnDemand)
		if !ok {
			cleanup()
			return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: "Config.Topology is on demand, but the mesh makes no connections on demand"}
		}
		nd.onDemand = od
	}
	if opts.gen != 0 {
		nd.view.Gen = opts.gen
	}
	nd.adv, nd.lobbies = adv, lobbies
	nd.hostKeys = hostKeys(peers)
	// A peer lost while the mesh and the data path form ends formation at
	// once: nothing it has not sent yet will come. The transport tells of
	// peers it was connected to; the seed of those lost before that.
	fctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	down := func(peer int, err error) {
		lost(&peerLostError{peer: peer, err: err})
		nd.onDown(peer, err)
	}
	seedLost := make(chan *peerLostError, 1)
	sl.Watch(func(peer int, why string) {
		if peer >= 0 && peer < cfg.WorldSize && peer != rank {
			pl := &peerLostError{peer: peer, err: fmt.Errorf("the seed lost it: %s", why)}
			seedLost <- pl
			lost(pl)
		}
	})
	// lostErr is why formation ends early when a peer was lost: nothing
	// it has not sent yet will come, also when the data path formed
	// before the loss.
	lostErr := func() error {
		var pl *peerLostError
		if !errors.As(context.Cause(fctx), &pl) {
			return nil
		}
		if errors.Is(pl.err, transport.ErrPeerClosed) {
			// A peer that left on purpose while the job formed most
			// likely heard from the seed that another was lost; the
			// same notice is on its way here: name that rank.
			t := time.NewTimer(formationNoticeGrace)
			defer t.Stop()
			select {
			case first := <-seedLost:
				return first
			case <-t.C:
			case <-ctx.Done():
			}
		}
		return pl
	}
	stopBeats := func() {}
	m, err := ln.Connect(fctx, rank, peers, adv, transport.Receiver{
		Handle: nd.handle, Place: nd.place, Down: down, RelayLost: nd.relayLost,
		Forming: func(ep transport.Endpoint) { stopBeats = nd.heartbeatWhileForming(ep) },
		Formed: func() error {
			if opts.dataDelay > 0 {
				t := time.NewTimer(opts.dataDelay)
				select {
				case <-t.C:
				case <-fctx.Done():
				}
				t.Stop()
			}
			return lostErr()
		},
	})
	var pl *peerLostError
	if err != nil && !errors.As(err, &pl) {
		if lerr := lostErr(); lerr != nil {
			err = lerr
		}
	}
	if err != nil {
		stopBeats()
		cleanup()
		var se *transport.SetupError
		switch {
		case errors.As(err, &pl):
			return nil, &Error{Code: CodePeerDown, Op: "new", Rank: pl.peer, Msg: pl.Error(), Cause: pl.err}
		case errors.As(err, &se) && se.Unavailable:
			return nil, &Error{Code: CodeUnavailable, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
		case errors.As(err, &se):
			return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
		}
		return nil, &Error{Code: CodePeerDown, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
	}
	if seed != nil {
		// The seed has served its one formation once every rank reported
		// its mesh formed (or was lost): then it frees its address for the
		// next job on it (or for rank 0's lobby, which takes the address
		// over: nodeLobby.takeOver). Closing this communicator closes it
		// too, e.g. for a re-initialisation after Close.
		seed.CloseWhenSettled(cfg.ConnectTimeout)
		closers = append(closers, seed.Close)
	}
	formedOK = true
	nd.closers = closers
	if opts.lobby != nil {
		nd.lobby = opts.lobby
	} else if lobby != nil {
		nd.lobby = lobby
		if lobby.l == nil && seed != nil {
			go lobby.takeOver(seed, cfg)
		}
	}
	c := worldComm(nd, m)
	stopBeats() // nd.start's heartbeats take over
	nd.start()
	return c, nil
}

// formationNoticeGrace bounds how long a rank whose formation ended because
// a peer closed waits for the seed's notice of the loss that made it leave.
const formationNoticeGrace = time.Second

// peerLostError is why formation ended early: a peer closed or was lost.
type peerLostError struct {
	peer int
	err  error
}

func (e *peerLostError) Error() string {
	how := "was lost"
	switch {
	case errors.Is(e.err, transport.ErrPeerClosed):
		how = "closed its communicator"
	case errors.Is(e.err, transport.ErrDeclaredDown):
		// It is alive: it gave up on this rank.
		how = "declared this rank unreachable"
	}
	return fmt.Sprintf("rank %d %s while the job was forming: %v", e.peer, how, e.err)
}

// NewLocalQUIC builds n communicators in this process connected by real
// QUIC on loopback, with an in-process seed and a random token (tests).
func NewLocalQUIC(n int, cfg Config) ([]*Comm, error) { return newLocalQUICEach(n, cfg, nil) }

// newLocalQUICEach is NewLocalQUIC with each rank's config passed through
// each (when not nil) before it joins: tests give ranks different hosts.
func newLocalQUICEach(n int, cfg Config, each func(rank int, c *Config)) ([]*Comm, error) {
	if n < 1 {
		return nil, invalidArg("new", "world size %d must be >= 1", n)
	}
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	seed, err := StartSeed("127.0.0.1:0", n, token)
	if err != nil {
		return nil, err
	}
	cfg.WorldSize, cfg.Token, cfg.Seed = n, token, seed.Addr().String()
	cfg.BindAddr, cfg.AdvertiseAddr = "127.0.0.1:0", ""
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank = i
			if each != nil {
				each(i, &c)
			}
			comms[i], errs[i] = newQUIC(context.Background(), c, false)
		}()
	}
	wg.Wait()
	seed.Close()
	for _, err := range errs {
		if err != nil {
			for _, c := range comms {
				if c != nil {
					c.Close()
				}
			}
			return nil, err
		}
	}
	return comms, nil
}

// isLocalAddr reports whether host:port names this host (loopback, an
// unspecified address, or an address of one of its interfaces).
func isLocalAddr(ctx context.Context, hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if ip.IP.IsUnspecified() || isLocalIP(ip.IP) {
			return true
		}
	}
	return false
}

// isLocalIP reports whether ip is a loopback address or an address of one of
// this host's interfaces.
func isLocalIP(ip net.IP) bool {
	if ip.IsLoopback() {
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// bindAddr is where this rank's mesh node listens (and its bulk TCP
// listener, if it needs one): cfg.BindAddr when set, else one address of
// this host with a free port, never every interface: the advertised IP
// when it is one of this host's, else the IP of the interface that routes
// to the seed (loopback for a seed on loopback, so a local job is reachable
// from this host only).
func bindAddr(cfg Config) (string, error) {
	if cfg.BindAddr != "" {
		return cfg.BindAddr, nil
	}
	if cfg.AdvertiseAddr != "" {
		host, _, err := net.SplitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			host = cfg.AdvertiseAddr
		}
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && isLocalIP(ip) {
			return net.JoinHostPort(ip.String(), "0"), nil
		}
	}
	ip, err := membership.RouteTo(cfg.Seed)
	if err != nil {
		return "", &Error{Code: CodeInvalidArgument, Op: "new", Rank: -1,
			Msg: fmt.Sprintf("no route to the seed %s to pick an address to listen on (set NEXAR_BIND_ADDR): %v", cfg.Seed, err), Cause: err}
	}
	return net.JoinHostPort(ip.String(), "0"), nil
}

// seedBindAddr is where an embedded seed listens: the seed's own address
// when it is an IP literal; for a host name, the first address it resolves
// to that is one of this host's and not loopback (127.0.0.1 for
// "localhost"). Only a name that resolves to nothing but loopback here
// (e.g. 127.0.1.1 from /etc/hosts), while other hosts may resolve it to this
// host's network address, gets every interface on the port.
//
// SeedListenAddr is the same rule for a stand-alone seed (nexar seed).
func SeedListenAddr(seed string) string { return seedBindAddr(context.Background(), seed) }

func seedBindAddr(ctx context.Context, seed string) string {
	host, port, _ := net.SplitHostPort(seed)
	if ip := net.ParseIP(host); ip != nil {
		return seed
	}
	if host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	ips, _ := net.DefaultResolver.LookupIPAddr(ctx, host)
	for _, ip := range ips {
		if !ip.IP.IsLoopback() && !ip.IP.IsUnspecified() && isLocalIP(ip.IP) {
			return net.JoinHostPort(ip.IP.String(), port)
		}
	}
	return net.JoinHostPort("0.0.0.0", port)
}

// advertiseAddr is what peers dial: cfg.AdvertiseAddr, else the bound IP
// when specific, else the IP of the interface that routes to the seed.
// Never a loopback or link-local host while the seed is not loopback (ranks
// on other hosts may join it): that is an error at once, naming the
// variable, instead of a formation that waits out the connect timeout.
func advertiseAddr(cfg Config, bound net.Addr) (string, error) {
	ua, ok := bound.(*net.UDPAddr)
	if !ok {
		return "", &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: fmt.Sprintf("unexpected local address %v", bound)}
	}
	port := strconv.Itoa(ua.Port)
	if cfg.AdvertiseAddr != "" {
		host, p, err := net.SplitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			host, p = cfg.AdvertiseAddr, ""
		}
		if p == "" || p == "0" {
			p = port
		}
		if err := localOnly(cfg, host, "NEXAR_ADVERTISE_ADDR is "+cfg.AdvertiseAddr); err != nil {
			return "", err
		}
		return net.JoinHostPort(host, p), nil
	}
	if !ua.IP.IsUnspecified() && ua.IP != nil {
		if err := localOnly(cfg, ua.IP.String(), "this rank listens on "+ua.IP.String()+" (NEXAR_BIND_ADDR or the route to the seed)"); err != nil {
			return "", err
		}
		return net.JoinHostPort(ua.IP.String(), port), nil
	}
	ip, err := membership.RouteTo(cfg.Seed)
	if err != nil {
		return "", &Error{Code: CodeInvalidArgument, Op: "new", Rank: -1,
			Msg: fmt.Sprintf("no route to the seed %s to pick an address to advertise (set NEXAR_ADVERTISE_ADDR): %v", cfg.Seed, err), Cause: err}
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// localOnly is an error when host, the address this rank would advertise
// (what says so), is loopback or link-local while the seed is not loopback
// here: a rank on another host could not dial it.
func localOnly(cfg Config, host, what string) error {
	ip := net.ParseIP(host)
	if ip == nil || !(ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
		return nil
	}
	sh, _, err := net.SplitHostPort(cfg.Seed)
	if err != nil {
		return nil
	}
	var seedIPs []net.IP
	if sip := net.ParseIP(sh); sip != nil {
		seedIPs = []net.IP{sip}
	} else if sh != "localhost" {
		addrs, _ := net.LookupIP(sh)
		seedIPs = addrs
	}
	for _, sip := range seedIPs {
		if !sip.IsLoopback() && !sip.IsUnspecified() && !sip.IsLinkLocalUnicast() {
			return &Error{Code: CodeInvalidArgument, Op: "new", Rank: cfg.Rank,
				Msg: fmt.Sprintf("%s, a loopback or link-local address, but the seed %s is not loopback: ranks on other hosts "+
					"could not dial this rank; set NEXAR_ADVERTISE_ADDR (and NEXAR_BIND_ADDR) to an address of this host they reach",
					what, cfg.Seed)}
		}
	}
	return nil
}
