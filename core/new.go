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

	nquic "github.com/nexar-go/nexar/transport/quic"
)

// New joins the job described by cfg: rendezvous through the seed (run
// embedded when this is rank 0 and cfg.Seed names an address of this host
// that nothing else holds; a stand-alone seed already there is joined),
// then a QUIC mesh with every peer. It is bounded by ctx and
// cfg.ConnectTimeout.
func New(ctx context.Context, cfg Config) (*Comm, error) {
	return newQUIC(ctx, cfg, true)
}

func newQUIC(ctx context.Context, cfg Config, embed bool) (*Comm, error) {
	cfg = cfg.withDefaults()
	if cfg.WorldSize < 1 {
		return nil, invalidArg("new", "world size %d must be >= 1", cfg.WorldSize)
	}
	if cfg.Rank < -1 || cfg.Rank >= cfg.WorldSize {
		return nil, invalidArg("new", "rank %d is out of range [0, %d)", cfg.Rank, cfg.WorldSize)
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
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	if embed && cfg.Rank == 0 && isLocalAddr(ctx, cfg.Seed) {
		seed, err := StartSeed(seedBindAddr(cfg.Seed), cfg.WorldSize, cfg.Token)
		switch {
		case err == nil:
			seed.log = cfg.Logger
			closers = append(closers, seed.Close)
		case errors.Is(err, syscall.EADDRINUSE):
			// Something on this host holds the seed's port already: a
			// stand-alone `nexar seed`. Rank 0 joins it like any rank;
			// the token proof in join tells whether it is this job's.
			cfg.Logger.Debug("nexar: seed address in use; joining the seed there", "seed", cfg.Seed)
		default:
			return nil, err
		}
	}
	id, err := nquic.NewIdentity()
	if err != nil {
		cleanup()
		return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: err.Error(), Cause: err}
	}
	qn, err := nquic.Listen(id, quicOptions(cfg))
	if err != nil {
		cleanup()
		return nil, &Error{Code: CodeInternal, Op: "new", Rank: -1, Msg: fmt.Sprintf("bind %s: %v", cfg.BindAddr, err), Cause: err}
	}
	closers = append(closers, qn.Close)
	adv, err := advertiseAddr(cfg, qn.Addr())
	if err != nil {
		cleanup()
		return nil, err
	}
	rank, peers, err := join(ctx, cfg.Seed, cfg.Token, cfg.Rank, adv, id.Fingerprint)
	if err != nil {
		cleanup()
		return nil, err
	}
	nd := newNode(cfg, rank, cfg.WorldSize)
	bk, err := newBulk(cfg, rank, adv, id, peers, nd)
	if err != nil {
		cleanup()
		return nil, err
	}
	ep, err := qn.Connect(ctx, rank, peers, bk.Handler(), bk.DownHandler())
	if err != nil {
		bk.Close()
		cleanup()
		return nil, &Error{Code: CodePeerDown, Op: "new", Rank: -1, Msg: fmt.Sprintf("forming the mesh: %v", err), Cause: err}
	}
	if err := bk.Start(ctx, ep); err != nil {
		bk.Close()
		cleanup()
		return nil, &Error{Code: CodePeerDown, Op: "new", Rank: -1, Msg: fmt.Sprintf("negotiating the bulk data path: %v", err), Cause: err}
	}
	nd.closers = closers
	c := worldComm(nd, bk)
	nd.start()
	return c, nil
}

// NewLocalQUIC builds n communicators in this process connected by real
// QUIC on loopback, with an in-process seed and a random token (tests).
func NewLocalQUIC(n int, cfg Config) ([]*Comm, error) {
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
	addrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IP.IsLoopback() || ip.IP.IsUnspecified() {
			return true
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip.IP) {
				return true
			}
		}
	}
	return false
}

// seedBindAddr is where an embedded seed listens: the seed's own address
// when it is an IP literal, else every interface on its port.
func seedBindAddr(seed string) string {
	host, port, _ := net.SplitHostPort(seed)
	if ip := net.ParseIP(host); ip != nil {
		return seed
	}
	if host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return net.JoinHostPort("0.0.0.0", port)
}

// advertiseAddr is what peers dial: cfg.AdvertiseAddr, else the bound IP
// when specific, else the IP of the interface that routes to the seed.
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
		return net.JoinHostPort(host, p), nil
	}
	if !ua.IP.IsUnspecified() && ua.IP != nil {
		return net.JoinHostPort(ua.IP.String(), port), nil
	}
	// A UDP "connection" sends nothing; it only asks the kernel for a route.
	c, err := net.Dial("udp", cfg.Seed)
	if err != nil {
		return "", &Error{Code: CodeInvalidArgument, Op: "new", Rank: -1,
			Msg: fmt.Sprintf("no route to the seed %s to pick an address to advertise (set NEXAR_ADVERTISE_ADDR): %v", cfg.Seed, err), Cause: err}
	}
	defer c.Close()
	ip := c.LocalAddr().(*net.UDPAddr).IP
	return net.JoinHostPort(ip.String(), port), nil
}
