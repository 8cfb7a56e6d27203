package bulk

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// The negotiator's transcripts: each feeds rank 0 of a pair a sequence of
// events (Start, the peer's messages, the outcomes of the IO it asked
// for, deadlines) and checks the actions each one emits, in order, as
// raft's interaction tests and membership's agreement tests do.

var nonce32 = bytes.Repeat([]byte{9}, 32)

// negCfg is rank 0's configuration in a pair on host "A": shared memory
// and TLS over TCP allowed, no RDMA device, a cross-memory attach probe.
func negCfg() negConfig {
	return negConfig{self: 0, size: 2, talks: []bool{false, true}, host: "A",
		me:  procClaim{Host: "A", PID: 100, Start: 7, PIDNS: "pid:[1]"},
		shm: true, tcp: true, conns: 2, ringSize: 8 << 20, ringBudget: 64 << 20,
		dataProbe: probe{PID: 100, Addr: 0x1000, Data: make([]byte, 16)}, testRemote: true}
}

type negStep struct {
	ev   event
	want []string
}

func hello(host string, shm, tcp, rdma bool) evRecv {
	return evRecv{1, helloMsg{Proc: procClaim{Host: host}, SHM: shm, TCP: tcp, RDMA: rdma}}
}

func offerFrom(m offerMsg) evRecv   { return evRecv{1, m} }
func resultFrom(m resultMsg) evRecv { return evRecv{1, m} }

var (
	shmOffer    = offerMsg{Kind: pathSHM, Ring: ringSpec{Path: "/dev/shm/b", Cookie: []byte{1}, Size: 1 << 20}}
	tcpOffer1   = offerMsg{Kind: pathTCP, Dial: dialSpec{Addr: "10.0.0.2:6000", Nonce: nonce32, Conns: 2, TLS: true}}
	rpcShmOffer = offerMsg{RPC: true, Kind: pathSHM, Ring: ringSpec{Path: "/dev/shm/q", Cookie: []byte{1}, Size: 1 << 16, Bell: "/dev/shm/q.bell"}}
	goodProbe   = probe{PID: 101, Addr: 0x2000, Data: make([]byte, 16)}
	errDenied   = errors.New("denied")
)

const helloA = "send 1 hello{host=A shm=true tcp=true rdma=false}"

func TestNegotiatorTranscripts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   func(*negConfig)
		steps []negStep
	}{{
		name: "same host: ring on first use, both directions",
		steps: []negStep{
			{evStart{}, []string{helloA}},
			{hello("A", true, true, false), []string{"send 1 offer{shm-lazy}"}},
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"later 1", "ready"}},
			{evConnect{1}, []string{"send 1 want{size=8388608 tcp=true}"}},
			{evConnect{1}, nil}, // asked already: later sends wait on the first
			{offerFrom(shmOffer), []string{"open-ring 1 /dev/shm/b"}},
			{evAttached{peer: 1, kind: pathSHM, ch: "ring"}, []string{"install 1 ring (lazy)", "send 1 result{shm ok probe}"}},
			// The peer's first message asks this rank for its ring.
			{evRecv{1, wantMsg{Size: 1 << 20, TCP: true}}, []string{"make-ring 1 size=1048576"}},
			{evRingMade{peer: 1, ring: ringSpec{Path: "/dev/shm/a", Size: 1 << 20}}, []string{"send 1 offer{shm /dev/shm/a size=1048576}"}},
			{resultFrom(resultMsg{Kind: pathSHM, OK: true, Probe: goodProbe}), []string{"test-remote 1 pid=101"}},
			{resultFrom(resultMsg{Kind: pathSHM, OK: true, Probe: goodProbe}), []string{"note 1 result for a shm channel not offered; ignored"}},
		},
	}, {
		name: "other host: TCP both ways",
		steps: []negStep{
			{evStart{}, []string{helloA}},
			{hello("B", true, true, false), []string{"arm-tcp 1 conns=2"}},
			{evTCPArmed{peer: 1, dial: dialSpec{Addr: "10.0.0.1:5000", Nonce: nonce32, Conns: 2, TLS: true}}, []string{"send 1 offer{tcp 10.0.0.1:5000 x2 tls=true}"}},
			{offerFrom(tcpOffer1), []string{"dial 1 10.0.0.2:6000 x2"}},
			{offerFrom(tcpOffer1), []string{"note 1 offer of tcp while attaching to another; ignored"}},
			{evAttached{peer: 1, kind: pathTCP, ch: "tcp"}, []string{"install 1 tcp", "ready"}},
			{offerFrom(tcpOffer1), []string{"note 1 offer of tcp after the path was fixed; ignored"}},
		},
	}, {
		name: "duplicate hello and a want nobody was offered",
		steps: []negStep{
			{hello("B", false, false, false), []string{"send 1 offer{quic}"}},
			{hello("B", false, false, false), []string{"note 1 duplicate hello; ignored"}},
			{evRecv{1, wantMsg{Size: 1 << 20}}, []string{"note 1 want without a shm-lazy offer; ignored"}},
		},
	}, {
		name: "plaintext here, TLS offered: refused, data on QUIC",
		cfg:  func(c *negConfig) { c.plaintext = true },
		steps: []negStep{
			{evStart{}, []string{helloA}},
			{offerFrom(tcpOffer1), []string{"note 1 TCP channel refused; data stays on QUIC: peer offers TLS=true, this rank wants TLS=false", "install 1 quic", "ready"}},
		},
	}, {
		name: "TCP offer with a short nonce: refused",
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathTCP, Dial: dialSpec{Addr: "x:1", Nonce: []byte{1}, Conns: 2, TLS: true}}),
				[]string{"note 1 TCP channel refused; data stays on QUIC: offer of 2 connections, 1-byte nonce", "install 1 quic", "ready"}},
		},
	}, {
		name: "TCP dial fails: data on QUIC",
		steps: []negStep{
			{offerFrom(tcpOffer1), []string{"dial 1 10.0.0.2:6000 x2"}},
			{evAttached{peer: 1, kind: pathTCP, err: errDenied}, []string{"note 1 TCP channel failed; data stays on QUIC: denied", "install 1 quic", "ready"}},
		},
	}, {
		name: "ring refused both ways: the sender cannot open it, the receiver offers TCP",
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"later 1", "ready"}},
			{evConnect{1}, []string{"send 1 want{size=8388608 tcp=true}"}},
			{offerFrom(shmOffer), []string{"open-ring 1 /dev/shm/b"}},
			{evAttached{peer: 1, kind: pathSHM, err: errDenied}, []string{"note 1 cannot attach to the shm channel; asking for another path: denied", `send 1 result{shm err="denied" tcp=true}`}},
			{offerFrom(tcpOffer1), []string{"dial 1 10.0.0.2:6000 x2"}},
			{evAttached{peer: 1, kind: pathTCP, ch: "tcp"}, []string{"install 1 tcp (lazy)"}},
			// This rank's ring, which the peer cannot open either.
			{hello("A", true, true, false), []string{"send 1 offer{shm-lazy}"}},
			{evRecv{1, wantMsg{Size: 1 << 20, TCP: true}}, []string{"make-ring 1 size=1048576"}},
			{evRingMade{peer: 1, ring: ringSpec{Path: "/dev/shm/a", Size: 1 << 20}}, []string{"send 1 offer{shm /dev/shm/a size=1048576}"}},
			{resultFrom(resultMsg{Kind: pathSHM, Err: "denied", TCP: true}), []string{"note 1 peer could not attach to the shm channel: denied", "drop-inbound 1 shm", "arm-tcp 1 conns=2"}},
			{evTCPArmed{peer: 1, err: errors.New("no TCP listener")}, []string{"note 1 no TCP offer: no TCP listener", "send 1 offer{quic}"}},
		},
	}, {
		name: "ring budget spent: TCP instead, or QUIC where the peer cannot dial",
		steps: []negStep{
			{hello("A", true, false, false), []string{"send 1 offer{shm-lazy}"}},
			{evRecv{1, wantMsg{Size: 1 << 20}}, []string{"make-ring 1 size=1048576"}},
			{evRingMade{peer: 1, err: errors.New("budget spent")}, []string{"note 1 no shared-memory ring: budget spent", "send 1 offer{quic}"}},
		},
	}, {
		name: "RDMA between hosts, refused by the sender, then TCP",
		cfg:  func(c *negConfig) { c.rdma = true },
		steps: []negStep{
			{evStart{}, []string{"send 1 hello{host=A shm=true tcp=true rdma=true}"}},
			{hello("B", true, true, true), []string{"listen-rdma 1"}},
			{evRDMAListening{peer: 1, qp: []byte{1}}, []string{"send 1 offer{rdma}"}},
			{resultFrom(resultMsg{Kind: pathRDMA, Err: "no device", TCP: true}), []string{"note 1 peer could not attach to the rdma channel: no device", "drop-inbound 1 rdma", "arm-tcp 1 conns=2"}},
			{offerFrom(offerMsg{Kind: pathRDMA, QP: []byte{2}}), []string{"dial-rdma 1"}},
			{evAttached{peer: 1, kind: pathRDMA, ch: "rdma", qp: []byte{3}}, []string{"install 1 rdma", "ready", "send 1 result{rdma ok}"}},
		},
	}, {
		name: "RDMA on one host only in rdma mode; a failed listen falls back",
		cfg:  func(c *negConfig) { c.rdma, c.rdmaOnly, c.shm = true, true, false },
		steps: []negStep{
			{hello("A", true, true, true), []string{"listen-rdma 1"}},
			{evRDMAListening{peer: 1, err: errDenied}, []string{"note 1 no RDMA channel; trying the next path: denied", "arm-tcp 1 conns=2"}},
			{resultFrom(resultMsg{Kind: pathRDMA, OK: true}), []string{"note 1 result for a rdma channel not offered; ignored"}},
		},
	}, {
		name: "RDMA dial fails: the sender asks for another path",
		cfg:  func(c *negConfig) { c.tcp = false },
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathRDMA, QP: []byte{2}}), []string{"dial-rdma 1"}},
			{evAttached{peer: 1, kind: pathRDMA, err: errDenied}, []string{"note 1 cannot attach to the rdma channel; asking for another path: denied", `send 1 result{rdma err="denied" tcp=false}`}},
			{offerFrom(offerMsg{Kind: pathQUIC}), []string{"install 1 quic", "ready"}},
		},
	}, {
		name: "stale: an offer after Start gave up, and an attach that finished after",
		steps: []negStep{
			{evStart{}, []string{helloA}},
			{offerFrom(tcpOffer1), []string{"dial 1 10.0.0.2:6000 x2"}},
			{evStartTimeout{}, []string{"note 1 no answer from peer; its data stays on QUIC"}},
			{evAttached{peer: 1, kind: pathTCP, ch: "tcp"}, []string{"discard 1"}},
			{offerFrom(shmOffer), []string{"note 1 offer of shm after the path was fixed; ignored", `send 1 result{shm err="too late" tcp=false}`}},
		},
	}, {
		name: "a lazy peer's offer nobody asked for, and a second shm-lazy",
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"later 1", "ready"}},
			{offerFrom(shmOffer), []string{"note 1 offer of shm nobody asked for; ignored"}},
			{evConnect{1}, []string{"send 1 want{size=8388608 tcp=true}"}},
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"note 1 offer of shm-lazy nobody asked for; ignored"}},
		},
	}, {
		name: "a want that cannot be sent: data on QUIC",
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"later 1", "ready"}},
			{evConnect{1}, []string{"send 1 want{size=8388608 tcp=true}"}},
			{evSendFailed{1, msgWant}, []string{"install 1 quic (lazy)"}},
			{evSendFailed{1, msgWant}, nil},
		},
	}, {
		name: "local peers share the budget: the ring asked for shrinks",
		cfg:  func(c *negConfig) { c.size, c.talks, c.ringBudget = 4, []bool{false, true, true, true}, 16<<20 },
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"later 1"}},
			{evRecv{2, offerMsg{Kind: pathSHMLazy}}, []string{"later 2"}},
			{evRecv{3, offerMsg{Kind: pathSHMLazy}}, []string{"later 3", "ready"}},
			{evConnect{1}, []string{"send 1 want{size=4194304 tcp=true}"}},
		},
	}, {
		name: "RPC to a local peer: ring with its doorbell",
		steps: []negStep{
			{evRPCConnect{1}, []string{"send 1 rpcwant{host=A shm=true tcp=true}", "timer 1"}},
			{evRPCConnect{1}, nil},
			{offerFrom(rpcShmOffer), []string{"open-ring 1 rpc /dev/shm/q"}},
			{evAttached{peer: 1, rpc: true, kind: pathSHM, ch: "rpc ring"}, []string{"install 1 rpc rpc ring", "send 1 rpcresult{shm ok}"}},
			{evRPCTimeout{1}, nil}, // decided before the deadline
			// The peer's first call to this rank.
			{evRecv{1, rpcWantMsg{Host: "A", SHM: true, TCP: true}}, []string{"make-ring 1 rpc size=0"}},
			{evRingMade{peer: 1, rpc: true, ring: ringSpec{Path: "/dev/shm/p", Size: 1 << 16, Bell: "/dev/shm/p.bell"}}, []string{"send 1 rpcoffer{shm /dev/shm/p size=65536}"}},
			{resultFrom(resultMsg{RPC: true, Kind: pathSHM, OK: true, Probe: goodProbe}), []string{"unlink-bell 1", "test-remote 1 rpc pid=101"}},
			{evRecv{1, rpcWantMsg{Host: "A", SHM: true}}, []string{"note 1 duplicate rpcwant; ignored"}},
		},
	}, {
		name: "RPC: a ring the caller did not take, and a peer on another host",
		steps: []negStep{
			{evRecv{1, rpcWantMsg{Host: "A", SHM: true, TCP: true}}, []string{"make-ring 1 rpc size=0"}},
			{evRingMade{peer: 1, rpc: true, ring: ringSpec{Path: "/dev/shm/p", Size: 1 << 16, Bell: "/dev/shm/p.bell"}}, []string{"send 1 rpcoffer{shm /dev/shm/p size=65536}"}},
			{resultFrom(resultMsg{RPC: true, Kind: pathSHM, Err: "too late"}), []string{"unlink-bell 1", "note 1 peer did not take the RPC ring: too late", "drop-inbound 1 rpc shm"}},
			{resultFrom(resultMsg{RPC: true, Kind: pathSHM, OK: true}), []string{"note 1 rpcresult for a shm channel not offered; ignored"}},
		},
	}, {
		name: "RPC over TCP between hosts",
		steps: []negStep{
			{evRecv{1, rpcWantMsg{Host: "B", SHM: true, TCP: true}}, []string{"arm-tcp 1 rpc conns=1"}},
			{evTCPArmed{peer: 1, rpc: true, dial: dialSpec{Addr: "10.0.0.1:5000", Nonce: nonce32, Conns: 1, TLS: true}}, []string{"send 1 rpcoffer{tcp 10.0.0.1:5000 x1 tls=true}"}},
			{evRPCConnect{1}, []string{"send 1 rpcwant{host=A shm=true tcp=true}", "timer 1"}},
			{offerFrom(offerMsg{RPC: true, Kind: pathTCP, Dial: dialSpec{Addr: "10.0.0.2:6000", Nonce: nonce32, Conns: 1, TLS: true}}), []string{"dial 1 rpc 10.0.0.2:6000 x1"}},
			{evAttached{peer: 1, rpc: true, kind: pathTCP, err: errDenied}, []string{"note 1 cannot attach to the RPC tcp channel; RPC stays on QUIC: denied", "install 1 rpc quic"}},
		},
	}, {
		name: "RPC: no offer by the deadline, then a late one",
		steps: []negStep{
			{evRPCConnect{1}, []string{"send 1 rpcwant{host=A shm=true tcp=true}", "timer 1"}},
			{evRPCTimeout{1}, []string{"note 1 no RPC channel offer from peer; its RPC stays on QUIC", "install 1 rpc quic"}},
			{offerFrom(rpcShmOffer), []string{"note 1 rpcoffer of shm nobody waits for; ignored", `send 1 rpcresult{shm err="too late" tcp=false}`}},
		},
	}, {
		name: "RPC: the deadline passes while the ring is opened",
		steps: []negStep{
			{evRPCConnect{1}, []string{"send 1 rpcwant{host=A shm=true tcp=true}", "timer 1"}},
			{offerFrom(rpcShmOffer), []string{"open-ring 1 rpc /dev/shm/q"}},
			{evRPCTimeout{1}, []string{"note 1 no RPC channel offer from peer; its RPC stays on QUIC", "install 1 rpc quic"}},
			{evAttached{peer: 1, rpc: true, kind: pathSHM, ch: "rpc ring"}, []string{"discard 1", `send 1 rpcresult{shm err="too late" tcp=false}`}},
		},
	}, {
		name: "RPC: plaintext mismatch, and an rpcwant that cannot be sent",
		cfg:  func(c *negConfig) { c.plaintext = true },
		steps: []negStep{
			{evRPCConnect{1}, []string{"send 1 rpcwant{host=A shm=true tcp=true}", "timer 1"}},
			{offerFrom(offerMsg{RPC: true, Kind: pathTCP, Dial: dialSpec{Addr: "x:1", Nonce: nonce32, Conns: 1, TLS: true}}),
				[]string{"note 1 RPC TCP channel refused; RPC stays on QUIC: peer offers TLS=true, this rank wants TLS=false", "install 1 rpc quic"}},
			{evSendFailed{1, msgRPCWant}, nil},
		},
	}, {
		name: "peer down: waiting sends and calls go to QUIC, later channels are closed",
		steps: []negStep{
			{offerFrom(offerMsg{Kind: pathSHMLazy}), []string{"later 1", "ready"}},
			{evConnect{1}, []string{"send 1 want{size=8388608 tcp=true}"}},
			{offerFrom(shmOffer), []string{"open-ring 1 /dev/shm/b"}},
			{evRPCConnect{1}, []string{"send 1 rpcwant{host=A shm=true tcp=true}", "timer 1"}},
			{evPeerDown{1}, []string{"install 1 quic (lazy)", "install 1 rpc quic"}},
			{evAttached{peer: 1, kind: pathSHM, ch: "ring"}, []string{"discard 1"}},
			{evRPCConnect{1}, nil},
		},
	}, {
		name: "a rank this one does not talk to",
		cfg:  func(c *negConfig) { c.talks = []bool{false, false} },
		steps: []negStep{
			{evStart{}, nil},
			{hello("A", true, true, false), []string{"note 1 hello from a rank this one does not talk to; ignored"}},
			{evRecv{1, rpcWantMsg{Host: "A", SHM: true}}, []string{"note 1 rpcwant from a rank this one does not talk to; ignored"}},
		},
	}, {
		name: "closing: nothing more is made",
		steps: []negStep{
			{offerFrom(tcpOffer1), []string{"dial 1 10.0.0.2:6000 x2"}},
			{evClose{}, nil},
			{hello("A", true, true, false), nil},
			{evAttached{peer: 1, kind: pathTCP, ch: "tcp"}, []string{"discard 1"}},
			{evRPCConnect{1}, nil},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := negCfg()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			n := newNegotiator(cfg)
			for i, s := range tc.steps {
				got := actionStrings(n.step(s.ev))
				if !slices.Equal(got, s.want) {
					t.Fatalf("step %d (%T):\n got  %q\n want %q", i, s.ev, got, s.want)
				}
			}
		})
	}
}

func actionStrings(acts []action) []string {
	var s []string
	for _, a := range acts {
		s = append(s, a.String())
	}
	return s
}

// pairSim runs two negotiators against each other: messages in flight
// are delivered in a random order (the endpoint takes each in a goroutine
// of its own), and the IO each asks for succeeds at once.
type pairSim struct {
	n    [2]*negotiator
	log  [2][]string // every action each emitted
	q    []evRecv    // in flight; from is the sender, to the other
	to   []int
	rng  *rand.Rand
	host [2]string
}

func newPairSim(seed uint64, sameHost bool) *pairSim {
	s := &pairSim{rng: rand.New(rand.NewPCG(seed, 1)), host: [2]string{"A", "A"}}
	if !sameHost {
		s.host[1] = "B"
	}
	for r := range 2 {
		c := negCfg()
		c.self, c.talks, c.host = r, []bool{r != 0, r != 1}, s.host[r]
		c.me.Host = s.host[r]
		s.n[r] = newNegotiator(c)
	}
	return s
}

func (s *pairSim) step(r int, ev event) {
	for _, a := range s.n[r].step(ev) {
		s.log[r] = append(s.log[r], a.String())
		peer := 1 - r
		switch a := a.(type) {
		case actSend:
			s.q = append(s.q, evRecv{r, a.m})
			s.to = append(s.to, peer)
		case actMakeRing:
			s.step(r, evRingMade{peer: peer, rpc: a.rpc, ring: ringSpec{Path: fmt.Sprintf("/dev/shm/%d", r), Size: 1 << 20}})
		case actArmTCP:
			s.step(r, evTCPArmed{peer: peer, rpc: a.rpc, dial: dialSpec{Addr: s.host[r], Nonce: nonce32, Conns: a.conns, TLS: true}})
		case actOpenRing:
			s.step(r, evAttached{peer: peer, rpc: a.rpc, kind: pathSHM, ch: "ring " + a.ring.Path})
		case actDial:
			s.step(r, evAttached{peer: peer, rpc: a.rpc, kind: pathTCP, ch: "tcp " + a.dial.Addr})
		}
	}
}

// run delivers everything in flight; r's messages come from rank r.
func (s *pairSim) run() {
	for len(s.q) > 0 {
		i := s.rng.IntN(len(s.q))
		m, to := s.q[i], s.to[i]
		s.q, s.to = slices.Delete(s.q, i, i+1), slices.Delete(s.to, i, i+1)
		m.from = 1 - to
		s.step(to, evRecv{1 - to, m.m})
	}
}

// TestNegotiatorCrossing: both ranks start at once, then each sends its
// first message and its first call to the other at once. Every order of
// delivery ends with a channel per direction (each direction is its
// receiver's, so nothing needs a tie-break), Start released on both, and
// no message refused.
func TestNegotiatorCrossing(t *testing.T) {
	for _, same := range []bool{true, false} {
		for seed := range uint64(50) {
			s := newPairSim(seed, same)
			s.step(0, evStart{})
			s.step(1, evStart{})
			s.run()
			s.step(0, evConnect{1})
			s.step(1, evConnect{0})
			s.step(0, evRPCConnect{1})
			s.step(1, evRPCConnect{0})
			s.run()
			for r := range 2 {
				want := []string{fmt.Sprintf("install %d tcp %s", 1-r, s.host[1-r]), "ready",
					fmt.Sprintf("install %d rpc tcp %s", 1-r, s.host[1-r])}
				if same {
					want = []string{fmt.Sprintf("later %d", 1-r), "ready",
						fmt.Sprintf("install %d ring /dev/shm/%d (lazy)", 1-r, 1-r),
						fmt.Sprintf("install %d rpc ring /dev/shm/%d", 1-r, 1-r)}
				}
				var got []string
				for _, a := range s.log[r] {
					if strings.HasPrefix(a, "install") || strings.HasPrefix(a, "later") || a == "ready" {
						got = append(got, a)
					}
					if strings.HasPrefix(a, "note") {
						t.Errorf("same host %v, seed %d, rank %d: %s", same, seed, r, a)
					}
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("same host %v, seed %d, rank %d:\n got  %q\n want %q\n log %q", same, seed, r, got, want, s.log[r])
				}
			}
		}
	}
}

// TestCtlRoundTrip: every typed message survives its wire form.
func TestCtlRoundTrip(t *testing.T) {
	for _, m := range []message{
		helloMsg{Proc: procClaim{Host: "h", PID: 1, Start: 2, PIDNS: "pid:[3]"}, SHM: true, TCP: true, RDMA: true},
		wantMsg{Size: 1 << 20, TCP: true},
		rpcWantMsg{Host: "h", SHM: true, TCP: true},
		offerMsg{Kind: pathSHMLazy, Proc: procClaim{Host: "h", PID: 1}},
		offerMsg{Kind: pathSHM, Ring: ringSpec{Path: "/p", Cookie: []byte{1}, Size: 4}},
		offerMsg{Kind: pathTCP, Dial: dialSpec{Addr: "a:1", Nonce: nonce32, Conns: 3, TLS: true}},
		offerMsg{Kind: pathRDMA, QP: []byte{0xa0}},
		offerMsg{Kind: pathQUIC},
		offerMsg{RPC: true, Kind: pathSHM, Ring: ringSpec{Path: "/p", Cookie: []byte{1}, Size: 4, Bell: "/b"}},
		resultMsg{Kind: pathSHM, OK: true, Probe: goodProbe},
		resultMsg{Kind: pathRDMA, OK: true, QP: []byte{0xa0}},
		resultMsg{Kind: pathSHM, Err: "e", TCP: true},
		resultMsg{RPC: true, Kind: pathSHM, OK: true},
		byeMsg{},
		byeAckMsg{},
	} {
		b, err := encodeCtl(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeCtl(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%s: decoded %#v, %v", msgString(m), got, err)
		}
	}
}

// TestDecodeCtlRefuses: a message of another version, type or kind is
// dropped before the negotiator sees it.
func TestDecodeCtlRefuses(t *testing.T) {
	for _, w := range []wireMsg{
		{V: 2, T: "hello"},
		{V: 0, T: "hello"},
		{V: 1, T: "hullo"},
		{V: 1, T: "offer", Kind: "ring"},
		{V: 1, T: "offer"},
		{V: 1, T: "rpcoffer", Kind: "rdma"},
		{V: 1, T: "rpcoffer", Kind: "shm-lazy"},
		{V: 1, T: "result", Kind: "tcp"},
		{V: 1, T: "rpcresult", Kind: "rdma"},
	} {
		b, err := cbor.Marshal(&w)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := decodeCtl(b); err == nil {
			t.Errorf("%+v decoded as %#v", w, m)
		}
	}
}

// TestCrowd: the ranks that share this rank's cores are those on its
// kernel, whatever their host id (another network namespace), whose CPU
// sets overlap its own; their CPUs are the union of those sets.
func TestCrowd(t *testing.T) {
	cfg := negCfg()
	cfg.size = 6
	cfg.talks = []bool{false, true, true, true, true, true}
	cfg.kernel = "m/boot1"
	cfg.cpus = []uint64{0b0011} // CPUs 0 and 1
	n := newNegotiator(cfg)
	hellos := []helloMsg{
		{Proc: procClaim{Host: "A"}, Kernel: "m/boot1", CPUs: []uint64{0b0011}},      // this host
		{Proc: procClaim{Host: "B"}, Kernel: "m/boot1", CPUs: []uint64{0b0110}},      // another netns, overlapping: adds CPU 2
		{Proc: procClaim{Host: "C"}, Kernel: "m/boot1", CPUs: []uint64{0b1100, 0b1}}, // disjoint from 0-1
		{Proc: procClaim{Host: "D"}, Kernel: "m/boot2", CPUs: []uint64{0b0011}},      // another kernel
		{Proc: procClaim{Host: "E"}, Kernel: "m/boot1"},                              // CPUs unknown: counted
	}
	for i, h := range hellos {
		n.step(evRecv{i + 1, h})
	}
	if r, c := n.crowd(8); r != 4 || c != 3 {
		t.Errorf("crowd = %d ranks on %d CPUs, want 4 on 3", r, c)
	}
	// This rank's own set unknown: the machine's count.
	cfg.cpus = nil
	n = newNegotiator(cfg)
	for i, h := range hellos {
		n.step(evRecv{i + 1, h})
	}
	if r, c := n.crowd(8); r != 5 || c != 8 {
		t.Errorf("crowd without a CPU set = %d ranks on %d CPUs, want 5 on 8", r, c)
	}
	// Nothing heard yet: this rank alone.
	if r, _ := newNegotiator(cfg).crowd(8); r != 1 {
		t.Errorf("crowd before any hello = %d ranks, want 1", r)
	}
}

// TestHelloWire: a hello's kernel and CPU set survive the wire form.
func TestHelloWire(t *testing.T) {
	in := helloMsg{Proc: procClaim{Host: "A", PID: 3}, TCP: true, Kernel: "m/b", CPUs: []uint64{5, 1 << 63}}
	b, err := encodeCtl(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeCtl(b)
	if err != nil {
		t.Fatal(err)
	}
	h, ok := out.(helloMsg)
	if !ok || h.Kernel != "m/b" || len(h.CPUs) != 2 || h.CPUs[0] != 5 || h.CPUs[1] != 1<<63 {
		t.Fatalf("hello after the wire: %+v", out)
	}
}
