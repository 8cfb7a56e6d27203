package bulk

import (
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// This file is the negotiation's messages: typed values for the
// negotiator (negotiate.go) and their wire form, one CBOR map with string
// keys (docs/bulk-path.md), which only encodeCtl and decodeCtl see.

// msgType is a negotiation message's type: the wire's "t".
type msgType uint8

const (
	msgHello     msgType = iota + 1 // each rank to each peer at Start
	msgOffer                        // the receiving side of a data direction: how to reach it
	msgWant                         // the sender asks a local peer for its ring (first message)
	msgResult                       // the sender's outcome of a shm or rdma offer
	msgRPCWant                      // the first call to a peer asks for an RPC channel
	msgRPCOffer                     // the callee's answer
	msgRPCResult                    // the caller's outcome of a shm RPC offer
	msgBye                          // this process leaves: its exit is a departure (procdeath.go)
	msgByeAck                       // the goodbye was heard
)

var msgNames = [...]string{msgHello: "hello", msgOffer: "offer", msgWant: "want", msgResult: "result",
	msgRPCWant: "rpcwant", msgRPCOffer: "rpcoffer", msgRPCResult: "rpcresult", msgBye: "bye", msgByeAck: "byeack"}

func (t msgType) String() string {
	if int(t) < len(msgNames) && msgNames[t] != "" {
		return msgNames[t]
	}
	return fmt.Sprintf("msgType(%d)", t)
}

// pathKind is what an offer offers (and a result answers): the wire's
// "kind".
type pathKind uint8

const (
	pathSHM     pathKind = iota + 1 // a ring this rank made
	pathSHMLazy                     // this host: ask with the first message (want)
	pathRDMA                        // a queue pair
	pathTCP                         // a TCP listener and a one-time nonce
	pathQUIC                        // nothing: the inner endpoint
)

var pathNames = [...]string{pathSHM: "shm", pathSHMLazy: "shm-lazy", pathRDMA: "rdma", pathTCP: "tcp", pathQUIC: "quic"}

func (k pathKind) String() string {
	if int(k) < len(pathNames) && pathNames[k] != "" {
		return pathNames[k]
	}
	return fmt.Sprintf("pathKind(%d)", k)
}

// procClaim is a sender's host and process, carried by hello and data
// offers for a peer on the same host to watch it (procwatch_linux.go).
// PID 0: not known.
type procClaim struct {
	Host  string
	PID   int
	Start uint64 // clock ticks after boot
	PIDNS string // "pid:[inode]"
}

// ringSpec names a ring file (and, for RPC, its doorbell FIFO).
type ringSpec struct {
	Path   string
	Cookie []byte
	Size   int
	Bell   string // RPC only
}

// dialSpec is a TCP offer: where to dial, and the one-time nonce.
type dialSpec struct {
	Addr  string
	Nonce []byte
	Conns int
	TLS   bool
}

// probe lets a ring's receiver test cross-memory attach: the sender's
// pid and the address in its memory where Data lies.
type probe struct {
	PID  int
	Addr uint64
	Data []byte
}

// valid reports whether p names something to read.
func (p probe) valid() bool { return p.PID > 0 && p.Addr != 0 && len(p.Data) == 16 }

// message is one negotiation message: helloMsg, wantMsg, offerMsg,
// resultMsg, rpcWantMsg, byeMsg or byeAckMsg.
type message interface{ msgType() msgType }

type helloMsg struct {
	Proc           procClaim // Host always set
	SHM, TCP, RDMA bool      // what the sender can use
	Kernel         string    // the sender's machine and boot (hostid.Kernel; empty: unknown)
	CPUs           []uint64  // the CPUs the sender may run on (sched.Allowed; nil: unknown)
}

type wantMsg struct {
	Size int  // the ring capacity the sender proposes
	TCP  bool // the sender can dial TCP (for the fallback)
}

type rpcWantMsg struct {
	Host     string
	SHM, TCP bool
}

// offerMsg is an offer (RPC false) or rpcoffer (RPC true).
type offerMsg struct {
	RPC  bool
	Kind pathKind
	Proc procClaim // data offers only
	Ring ringSpec  // pathSHM
	Dial dialSpec  // pathTCP
	QP   []byte    // pathRDMA: the queue pair's parameters (transport/rdma)
}

// resultMsg is a result (RPC false) or rpcresult (RPC true).
type resultMsg struct {
	RPC   bool
	Kind  pathKind // pathSHM or pathRDMA
	OK    bool
	Err   string
	TCP   bool   // not OK: the sender can dial TCP (for the next offer)
	Probe probe  // OK shm: cross-memory attach probe, if any
	QP    []byte // OK rdma: the sender's queue pair
}

type byeMsg struct{}
type byeAckMsg struct{}

func (helloMsg) msgType() msgType   { return msgHello }
func (wantMsg) msgType() msgType    { return msgWant }
func (rpcWantMsg) msgType() msgType { return msgRPCWant }
func (byeMsg) msgType() msgType     { return msgBye }
func (byeAckMsg) msgType() msgType  { return msgByeAck }
func (m offerMsg) msgType() msgType {
	if m.RPC {
		return msgRPCOffer
	}
	return msgOffer
}
func (m resultMsg) msgType() msgType {
	if m.RPC {
		return msgRPCResult
	}
	return msgResult
}

// wireMsg is the wire form of every message: one flat CBOR map, version
// 1, with the keys docs/bulk-path.md names. Both ends of a job are the
// same build, so the form may change between releases; it has not since
// the typed messages replaced it in the code.
type wireMsg struct {
	V      int             `cbor:"v"`
	T      string          `cbor:"t"`
	Host   string          `cbor:"host,omitempty"`
	SHM    bool            `cbor:"shm,omitempty"`
	TCP    bool            `cbor:"tcp,omitempty"`
	Kind   string          `cbor:"kind,omitempty"`
	Path   string          `cbor:"path,omitempty"`
	Cookie []byte          `cbor:"cookie,omitempty"`
	Size   int             `cbor:"size,omitempty"`
	Addr   string          `cbor:"addr,omitempty"` // tcp: the listener; rpcoffer shm: the doorbell
	Nonce  []byte          `cbor:"nonce,omitempty"`
	Conns  int             `cbor:"conns,omitempty"`
	TLS    bool            `cbor:"tls,omitempty"`
	OK     bool            `cbor:"ok,omitempty"`
	Err    string          `cbor:"err,omitempty"`
	PID    int             `cbor:"pid,omitempty"`
	Probe  uint64          `cbor:"probe,omitempty"`
	Data   []byte          `cbor:"data,omitempty"`
	Start  uint64          `cbor:"start,omitempty"`
	PIDNS  string          `cbor:"pidns,omitempty"`
	RDMA   bool            `cbor:"rdma,omitempty"`
	QP     cbor.RawMessage `cbor:"qp,omitempty"`
	Kernel string          `cbor:"kernel,omitempty"`
	CPUs   []uint64        `cbor:"cpus,omitempty"`
}

func (w *wireMsg) setProc(p procClaim) {
	w.Host, w.PID, w.Start, w.PIDNS = p.Host, p.PID, p.Start, p.PIDNS
}

func (w *wireMsg) proc() procClaim {
	return procClaim{Host: w.Host, PID: w.PID, Start: w.Start, PIDNS: w.PIDNS}
}

// toWire lays m out as its wire map.
func toWire(m message) wireMsg {
	w := wireMsg{V: 1, T: m.msgType().String()}
	switch m := m.(type) {
	case helloMsg:
		w.setProc(m.Proc)
		w.SHM, w.TCP, w.RDMA = m.SHM, m.TCP, m.RDMA
		w.Kernel, w.CPUs = m.Kernel, m.CPUs
	case wantMsg:
		w.Size, w.TCP = m.Size, m.TCP
	case rpcWantMsg:
		w.Host, w.SHM, w.TCP = m.Host, m.SHM, m.TCP
	case offerMsg:
		w.setProc(m.Proc)
		w.Kind = m.Kind.String()
		switch m.Kind {
		case pathSHM:
			w.Path, w.Cookie, w.Size, w.Addr = m.Ring.Path, m.Ring.Cookie, m.Ring.Size, m.Ring.Bell
		case pathTCP:
			w.Addr, w.Nonce, w.Conns, w.TLS = m.Dial.Addr, m.Dial.Nonce, m.Dial.Conns, m.Dial.TLS
		case pathRDMA:
			w.QP = m.QP
		}
	case resultMsg:
		w.Kind, w.OK, w.Err, w.TCP = m.Kind.String(), m.OK, m.Err, m.TCP
		w.PID, w.Probe, w.Data = m.Probe.PID, m.Probe.Addr, m.Probe.Data
		w.QP = m.QP
	}
	return w
}

// fromWire reads w as a typed message; an unknown type or kind is an
// error (both ends are the same build).
func fromWire(w *wireMsg) (message, error) {
	var kind pathKind
	if w.Kind != "" {
		for k, n := range pathNames {
			if n != "" && n == w.Kind {
				kind = pathKind(k)
			}
		}
		if kind == 0 {
			return nil, fmt.Errorf("bulk: negotiation message of unknown kind %q", w.Kind)
		}
	}
	needKind := func(ok bool) error {
		if !ok {
			return fmt.Errorf("bulk: %s of kind %q", w.T, w.Kind)
		}
		return nil
	}
	switch w.T {
	case "hello":
		return helloMsg{Proc: w.proc(), SHM: w.SHM, TCP: w.TCP, RDMA: w.RDMA, Kernel: w.Kernel, CPUs: w.CPUs}, nil
	case "want":
		return wantMsg{Size: w.Size, TCP: w.TCP}, nil
	case "rpcwant":
		return rpcWantMsg{Host: w.Host, SHM: w.SHM, TCP: w.TCP}, nil
	case "offer", "rpcoffer":
		m := offerMsg{RPC: w.T == "rpcoffer", Kind: kind}
		if err := needKind(kind == pathSHM || kind == pathTCP || kind == pathQUIC ||
			!m.RPC && (kind == pathSHMLazy || kind == pathRDMA)); err != nil {
			return nil, err
		}
		if !m.RPC {
			m.Proc = w.proc()
		}
		switch kind {
		case pathSHM:
			m.Ring = ringSpec{Path: w.Path, Cookie: w.Cookie, Size: w.Size}
			if m.RPC {
				m.Ring.Bell = w.Addr
			}
		case pathTCP:
			m.Dial = dialSpec{Addr: w.Addr, Nonce: w.Nonce, Conns: w.Conns, TLS: w.TLS}
		case pathRDMA:
			m.QP = w.QP
		}
		return m, nil
	case "result", "rpcresult":
		m := resultMsg{RPC: w.T == "rpcresult", Kind: kind, OK: w.OK, Err: w.Err, TCP: w.TCP}
		if err := needKind(kind == pathSHM || !m.RPC && kind == pathRDMA); err != nil {
			return nil, err
		}
		switch kind {
		case pathSHM:
			m.Probe = probe{PID: w.PID, Addr: w.Probe, Data: w.Data}
		case pathRDMA:
			m.QP = w.QP
		}
		return m, nil
	case "bye":
		return byeMsg{}, nil
	case "byeack":
		return byeAckMsg{}, nil
	}
	return nil, fmt.Errorf("bulk: negotiation message of unknown type %q", w.T)
}

var ctlDec, _ = cbor.DecOptions{MaxArrayElements: 16, MaxMapPairs: 32, MaxNestedLevels: 4}.DecMode()

// encodeCtl encodes m for the control lane.
func encodeCtl(m message) ([]byte, error) {
	w := toWire(m)
	return cbor.Marshal(&w)
}

// decodeCtl decodes a peer's negotiation message (FuzzDecodeCtl).
func decodeCtl(p []byte) (message, error) {
	if len(p) > ctlMax {
		return nil, fmt.Errorf("bulk: negotiation message of %d bytes exceeds %d", len(p), ctlMax)
	}
	var w wireMsg
	if err := ctlDec.Unmarshal(p, &w); err != nil {
		return nil, fmt.Errorf("bulk: negotiation message: %w", err)
	}
	if w.V != 1 {
		return nil, fmt.Errorf("bulk: negotiation message of version %d", w.V)
	}
	return fromWire(&w)
}
