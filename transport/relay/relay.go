// Package relay is a transport.DataPath for sparse topologies: it wraps an
// inner DataPath that only ever talks to this rank's neighbours (package
// topology) and carries a message for any other rank through neighbours.
//
// A message to a non-neighbour is wrapped: the inner header is a relay
// frame (owner byte ownerRelay, at or above transport.OwnerTransport) with
// the source, the final destination, a hop limit and a sequence number per
// (source, destination, lane); the payload is the original 56-byte header
// followed by the original payload (cut into fragments when the two
// together exceed transport.MaxPayload). Every rank on the way forwards
// the frame to its next hop (topology.Graph.NextHop, deterministic, around
// the ranks it knows failed); the destination unwraps it and hands it to
// its Handler as if it came straight from the source. Messages between
// neighbours go to the inner path untouched.
//
// Order. All frames of one (source, destination, lane) take one route at a
// time and are forwarded in order, so they arrive in order. When a relay
// fails the route changes, and frames that the dead relay held are lost
// while later ones may arrive by the new route. Nothing is delivered out of
// order or silently skipped: the destination checks each frame's sequence
// number (a gap, or a late frame from the old route, is detected), and
// every rank that forwarded frames of a flow to the dead relay sends the
// destination a check (the last sequence number it handed over); a frame
// missing at the check, or a gap, is reported through Options.Lost, naming
// the source and the dead relay, before anything later of that flow is
// delivered; late frames are dropped. The layer above fails what the loss
// touches (core fails the communicators that contain the source, naming the
// relay). The check is conservative: a frame still in flight on the old
// route when the check arrives counts as lost.
//
// Back-pressure. A rank's own Send blocks on its first hop like a direct
// send. Forwarding never blocks an inner delivery goroutine: frames to
// forward wait in an unbounded queue per (next hop, lane) drained by one
// goroutine, so that relaying cannot deadlock around a cycle of full
// queues; the memory this takes is what the layer above has in flight
// through this rank. A Handler that blocks on a relayed message holds up
// that lane from the last relay, for every source relayed through it.
//
// A graceful Close sends each non-neighbour a goodbye on every lane it
// used (behind its messages), so that peers are told ErrPeerClosed after
// everything was delivered, as the contract asks; the abrupt loss of a
// non-neighbour is not detected here (the layer above learns it by gossip
// and calls Abandon).
package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// ownerRelay marks a relay frame (header byte 0).
const ownerRelay = transport.OwnerTransport | 0x52

// Frame flags (header byte 1).
const (
	flagMore  = 1 << iota // more fragments of this message follow
	flagFirst             // first fragment of a message
	flagBye               // the source closed; byte 2 holds the lanes it says goodbye on
	flagCheck             // out of band: the sender handed frames up to seq to a relay that failed
	flagCast              // a broadcast of the source (cast.go): the payload starts with a bit per recipient
)

// Relay frame layout in the inner header.
const (
	offFlags = 1
	offMask  = 2
	offHops  = 4  // uint16: hops left
	offSrc   = 8  // uint32
	offDst   = 12 // uint32
	offVia   = 16 // uint32: 1 + the failed relay this frame was re-routed around, 0: none
	offSeq   = 24 // uint64
)

// fragMax is the most original payload bytes one frame carries.
const fragMax = transport.MaxPayload - transport.HeaderSize

// closeDrain bounds how long Close waits for goodbyes and queued forwards.
const closeDrain = 2 * time.Second

// Options tunes an Endpoint.
type Options struct {
	// Lost is told, from a delivery goroutine, that messages from rank
	// src relayed towards this rank were lost or overtaken when relay via
	// failed (via is -1 when unknown). Later messages of src are delivered
	// after it returns; it must not block for long.
	Lost func(src, via int)
	// FragmentSize caps the original payload bytes per relay frame
	// (default and maximum: transport.MaxPayload less one header; tests
	// set it small to exercise reassembly).
	FragmentSize int
	// Linger bounds how long Close keeps relaying for the others after
	// its goodbyes, until every other rank said goodbye too or is down
	// (ranks still finishing their last calls may route through this
	// one). Default 1 s.
	Linger time.Duration
}

// Stats counts what an endpoint relayed. Safe to read at any time.
type Stats struct {
	ForwardedMsgs  int64 // frames forwarded for other ranks
	ForwardedBytes int64 // their original payload bytes
	RelayedMsgs    int64 // this rank's own messages sent through a relay
	Dropped        int64 // frames dropped: hop limit, or no live route
	Lost           int64 // losses reported through Options.Lost
}

// Endpoint is one rank's relaying data path. All methods are safe for
// concurrent use; Handler and DownHandler calls run on the inner path's
// goroutines or on goroutines the endpoint owns, which Close waits for.
type Endpoint struct {
	g     *topology.Graph
	rank  int
	up    transport.Handler
	upDn  transport.DownHandler
	opts  Options
	frag  int                // payload bytes per frame
	inner transport.DataPath // set by Start
	// poller is inner's scheduling group (transport.Poller), or one that
	// polls nothing where inner has none; set by Start.
	poller transport.Poller
	start  chan struct{} // closed by Start
	done   chan struct{} // closed by Close
	kill   chan struct{} // closed by Close once forwards had their drain time
	// doneCtx and killCtx end with done and kill: real contexts, so that
	// a send derives from them without a goroutine per frame (a context
	// over a bare channel costs one in context.AfterFunc).
	doneCtx, killCtx       context.Context
	doneCancel, killCancel context.CancelFunc

	failed  []atomic.Bool // per rank: failed or gone, never a relay again
	nFailed atomic.Int32  // how many are set: the routing generation
	routes  atomic.Pointer[routeTable]
	routeMu sync.Mutex // one computation of the table at a time

	fwdMsgs, fwdBytes, relayedMsgs, dropped, lost atomic.Int64

	wg sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	told    []bool        // per rank: the upper DownHandler was told
	heard   []bool        // per rank: its goodbye arrived (it closes: it needs this rank's relaying no more)
	gone    int           // ranks told or heard (Close's linger ends when all others are)
	goneCh  chan struct{} // closed and replaced when gone grows
	downErr []error       // per non-neighbour: why sends to it fail
	tx      map[int]*txState
	rx      map[int]*rxState
	byes    map[int]uint8 // per source: lanes whose goodbye arrived
	flows   map[flowKey]flowState
	queues  map[int]*fwdQueue // per next hop*NumLanes+lane
}

// routeTable is the next hop to every rank around the failed ranks, made
// once per change of the failed set (one breadth-first search).
type routeTable struct {
	gen  int32
	hops []int
}

type txState struct {
	sem  chan struct{} // one sender per (destination, lane): sequence order is send order
	seq  uint64        // next sequence number
	used bool          // a frame went: the goodbye goes on this lane too
}

type rxState struct {
	mu   sync.Mutex // held across delivery: one (source, lane) delivered in order
	next uint64
	frag []byte // the message being reassembled
	fh   transport.Header
	open bool
}

type flowKey struct {
	src, dst int32
	lane     transport.Lane
}

type flowState struct {
	last    uint64 // last sequence number handed to hop
	hop     int32
	checked bool // hop failed and the destination was sent a check
}

type fwdQueue struct {
	hop, lane int
	frames    []frame
	running   bool
}

type frame struct {
	h transport.Header
	p []byte
}

var _ transport.DataPath = (*Endpoint)(nil)

// New makes rank's relaying endpoint over g; h and down serve the layer
// above (either may be nil). Give Handler and DownHandler to the inner
// path when making it, then call Start with it.
func New(g *topology.Graph, rank int, h transport.Handler, down transport.DownHandler, opts Options) *Endpoint {
	n := g.Size()
	e := &Endpoint{
		g: g, rank: rank, up: h, upDn: down, opts: opts,
		start: make(chan struct{}), done: make(chan struct{}), kill: make(chan struct{}),
		failed: make([]atomic.Bool, n),
		told:   make([]bool, n), downErr: make([]error, n), heard: make([]bool, n), goneCh: make(chan struct{}),
		tx: map[int]*txState{}, rx: map[int]*rxState{}, byes: map[int]uint8{},
		flows: map[flowKey]flowState{}, queues: map[int]*fwdQueue{},
	}
	e.doneCtx, e.doneCancel = context.WithCancel(context.Background())
	e.killCtx, e.killCancel = context.WithCancel(context.Background())
	e.frag = fragMax
	if opts.FragmentSize > 0 && opts.FragmentSize < fragMax {
		e.frag = opts.FragmentSize
	}
	if e.opts.Linger <= 0 {
		e.opts.Linger = time.Second
	}
	return e
}

// Start attaches the inner path (made with Handler and DownHandler). Frames
// to forward arrive while nobody here waits for anything: an inner path
// that leaves data to the goroutines that poll it must be told to read
// without them (transport/bulk: Options.Forwards).
func (e *Endpoint) Start(inner transport.DataPath) {
	e.inner = inner
	if p, ok := inner.(transport.Poller); ok {
		e.poller = p
	} else {
		e.poller = transport.NoPoller{}
	}
	close(e.start)
}

// ForwardedBytes is Stats().ForwardedBytes (transport.Forwarder).
func (e *Endpoint) ForwardedBytes() int64 { return e.fwdBytes.Load() }

// Stats returns the relay counters.
func (e *Endpoint) Stats() Stats {
	return Stats{ForwardedMsgs: e.fwdMsgs.Load(), ForwardedBytes: e.fwdBytes.Load(),
		RelayedMsgs: e.relayedMsgs.Load(), Dropped: e.dropped.Load(), Lost: e.lost.Load()}
}

// Inner returns the inner path given to Start (nil before).
func (e *Endpoint) Inner() transport.DataPath { return e.inner }

// Graph returns the topology the endpoint routes over.
func (e *Endpoint) Graph() *topology.Graph { return e.g }

// Rank returns this endpoint's rank.
func (e *Endpoint) Rank() int { return e.rank }

// Size returns the world size.
func (e *Endpoint) Size() int { return e.g.Size() }

func (e *Endpoint) direct(peer int) bool { return peer == e.rank || e.g.IsNeighbor(e.rank, peer) }

func (e *Endpoint) isFailed(r int) bool { return e.failed[r].Load() }

// nextHop returns the next hop to dst, or -1 when there is none: the
// closed form while no rank failed, else the table for the failed set.
func (e *Endpoint) nextHop(dst int) int {
	gen := e.nFailed.Load()
	if gen == 0 {
		h, ok := e.g.NextHop(e.rank, dst, nil)
		if !ok {
			return -1
		}
		return h
	}
	if t := e.routes.Load(); t != nil && t.gen == gen {
		return t.hops[dst]
	}
	e.routeMu.Lock()
	defer e.routeMu.Unlock()
	gen = e.nFailed.Load()
	t := e.routes.Load()
	if t == nil || t.gen != gen {
		// A failure while this runs bumps the generation: the next call
		// computes again.
		t = &routeTable{gen: gen, hops: e.g.NextHops(e.rank, e.isFailed)}
		e.routes.Store(t)
	}
	return t.hops[dst]
}

// markFailed takes r out of every route; it reports whether r was live.
func (e *Endpoint) markFailed(r int) bool {
	if r < 0 || r >= len(e.failed) || r == e.rank || e.failed[r].Swap(true) {
		return false
	}
	e.nFailed.Add(1)
	return true
}

// Send sends like the inner path to a neighbour (or to this rank), and
// through relays to anyone else.
func (e *Endpoint) Send(ctx context.Context, peer int, lane transport.Lane, h *transport.Header, payload []byte) error {
	if peer < 0 || peer >= e.g.Size() {
		return fmt.Errorf("relay: send to rank %d: out of range [0,%d)", peer, e.g.Size())
	}
	if lane >= transport.NumLanes {
		return fmt.Errorf("relay: send on lane %d: unknown lane", lane)
	}
	if len(payload) > transport.MaxPayload {
		return fmt.Errorf("relay: payload of %d bytes exceeds %d", len(payload), transport.MaxPayload)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return transport.ErrClosed
	}
	<-e.start
	if e.direct(peer) {
		return e.inner.Send(ctx, peer, lane, h, payload)
	}
	return e.sendRelayed(ctx, peer, lane, h, payload, 0, false)
}

// sendRelayed sends this rank's message to the non-neighbour dst under
// the (dst, lane) sequence: fragments, or a goodbye (bye) with mask.
func (e *Endpoint) sendRelayed(ctx context.Context, dst int, lane transport.Lane, h *transport.Header, payload []byte, mask uint8, bye bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !bye {
		stop := context.AfterFunc(e.doneCtx, cancel)
		defer stop()
	}
	e.mu.Lock()
	if err := e.downErr[dst]; err != nil {
		e.mu.Unlock()
		return err
	}
	k := dst*int(transport.NumLanes) + int(lane)
	tx := e.tx[k]
	if tx == nil {
		tx = &txState{sem: make(chan struct{}, 1)}
		e.tx[k] = tx
	}
	e.mu.Unlock()
	select {
	case tx.sem <- struct{}{}:
	case <-ctx.Done():
		return e.ctxErr(ctx)
	}
	defer func() { <-tx.sem }()
	var orig transport.Header
	if h != nil {
		orig = *h
	}
	off := 0
	for first := true; first || off < len(payload); first = false {
		n := min(len(payload)-off, e.frag)
		var fh transport.Header
		fh[0] = ownerRelay
		switch {
		case bye:
			fh[offFlags] = flagBye
			fh[offMask] = mask
		default:
			fh[offFlags] = flagFirst
			if !first {
				fh[offFlags] = 0
			}
			if off+n < len(payload) {
				fh[offFlags] |= flagMore
			}
		}
		binary.LittleEndian.PutUint16(fh[offHops:], uint16(min(e.g.HopLimit(), 0xffff)))
		binary.LittleEndian.PutUint32(fh[offSrc:], uint32(e.rank))
		binary.LittleEndian.PutUint32(fh[offDst:], uint32(dst))
		binary.LittleEndian.PutUint64(fh[offSeq:], tx.seq)
		var p []byte
		if !bye {
			p = make([]byte, transport.HeaderSize+n)
			copy(p, orig[:])
			copy(p[transport.HeaderSize:], payload[off:off+n])
		}
		if err := e.route(ctx, dst, lane, &fh, p); err != nil {
			return err
		}
		tx.seq++
		tx.used = true
		off += n
	}
	e.relayedMsgs.Add(1)
	return nil
}

// route hands one frame to dst's next hop, re-routing around next hops
// that fail meanwhile (the frame then carries the failed relay).
func (e *Endpoint) route(ctx context.Context, dst int, lane transport.Lane, fh *transport.Header, p []byte) error {
	for {
		hop := e.nextHop(dst)
		if hop < 0 {
			return &transport.PeerDownError{Peer: dst, Cause: fmt.Errorf("relay: no live route from rank %d to rank %d (%d ranks failed)", e.rank, dst, e.nFailed.Load())}
		}
		e.stampReroute(fh, lane, hop)
		err := e.inner.Send(ctx, hop, lane, fh, p)
		var pd *transport.PeerDownError
		if err != nil && errors.As(err, &pd) && pd.Peer == hop && hop != dst {
			e.markFailed(hop)
			binary.LittleEndian.PutUint32(fh[offVia:], uint32(hop+1))
			continue
		}
		if err != nil {
			return e.sendErr(ctx, err)
		}
		if fh[offFlags]&flagCheck == 0 {
			e.mu.Lock()
			e.flows[flowKey{int32(binary.LittleEndian.Uint32(fh[offSrc:])), int32(dst), lane}] = flowState{last: binary.LittleEndian.Uint64(fh[offSeq:]), hop: int32(hop)}
			e.mu.Unlock()
		}
		return nil
	}
}

// stampReroute marks a frame that leaves its flow's route because the
// flow's last hop failed with that hop, so that the destination can name
// the failed relay should frames be missing.
func (e *Endpoint) stampReroute(fh *transport.Header, lane transport.Lane, hop int) {
	if fh[offFlags]&(flagCheck|flagCast) != 0 || binary.LittleEndian.Uint32(fh[offVia:]) != 0 {
		return
	}
	k := flowKey{int32(binary.LittleEndian.Uint32(fh[offSrc:])), int32(binary.LittleEndian.Uint32(fh[offDst:])), lane}
	e.mu.Lock()
	f, ok := e.flows[k]
	e.mu.Unlock()
	if ok && int(f.hop) != hop && e.isFailed(int(f.hop)) {
		binary.LittleEndian.PutUint32(fh[offVia:], uint32(f.hop+1))
	}
}

func (e *Endpoint) ctxErr(ctx context.Context) error {
	select {
	case <-e.done:
		return transport.ErrClosed
	default:
	}
	return ctx.Err()
}

func (e *Endpoint) sendErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return e.ctxErr(ctx)
	}
	return err
}

// Handler is the inner path's Handler.
func (e *Endpoint) Handler() transport.Handler { return e.handle }

// DownHandler is the inner path's DownHandler.
func (e *Endpoint) DownHandler() transport.DownHandler { return e.innerDown }

func (e *Endpoint) handle(from int, lane transport.Lane, h *transport.Header, p []byte) {
	if h == nil || h[0] != ownerRelay {
		if e.up != nil {
			e.up(from, lane, h, p)
		}
		return
	}
	src := int(binary.LittleEndian.Uint32(h[offSrc:]))
	dst := int(binary.LittleEndian.Uint32(h[offDst:]))
	// A broadcast's detour (cast.go) may pass its source.
	detour := h[offFlags]&flagCast != 0 && dst != src && dst != e.rank
	if src < 0 || src >= e.g.Size() || dst < 0 || dst >= e.g.Size() || (src == e.rank && !detour) {
		e.dropped.Add(1)
		return
	}
	if h[offFlags]&flagCast != 0 && !detour {
		e.castArrive(src, lane, h, p) // on the tree, or where a detour ends
		return
	}
	if dst != e.rank {
		e.forward(lane, h, p)
		return
	}
	e.arrive(src, lane, h, p)
}

// forward queues a frame for its next hop.
func (e *Endpoint) forward(lane transport.Lane, h *transport.Header, p []byte) {
	hops := binary.LittleEndian.Uint16(h[offHops:])
	if hops <= 1 {
		e.dropped.Add(1)
		return
	}
	f := frame{h: *h, p: p}
	binary.LittleEndian.PutUint16(f.h[offHops:], hops-1)
	e.fwdMsgs.Add(1)
	if len(p) >= transport.HeaderSize {
		e.fwdBytes.Add(int64(len(p) - transport.HeaderSize))
	}
	e.enqueue(lane, f)
}

func (e *Endpoint) enqueue(lane transport.Lane, f frame) {
	dst := int(binary.LittleEndian.Uint32(f.h[offDst:]))
	hop := e.nextHop(dst)
	if hop < 0 {
		e.dropped.Add(1)
		return
	}
	e.enqueueTo(hop, lane, f)
}

// enqueueTo queues a frame for the neighbour hop.
func (e *Endpoint) enqueueTo(hop int, lane transport.Lane, f frame) {
	k := hop*int(transport.NumLanes) + int(lane)
	e.mu.Lock()
	q := e.queues[k]
	if q == nil {
		q = &fwdQueue{hop: hop, lane: int(lane)}
		e.queues[k] = q
	}
	q.frames = append(q.frames, f)
	if !q.running {
		q.running = true
		e.wg.Add(1)
		go e.drain(q)
	}
	e.mu.Unlock()
}

// drain sends q's frames in order until it is empty. A frame whose next
// hop failed is routed again (to another queue).
func (e *Endpoint) drain(q *fwdQueue) {
	defer e.wg.Done()
	select {
	case <-e.start:
	case <-e.kill: // closed before it started (a formation that failed)
		e.mu.Lock()
		e.dropped.Add(int64(len(q.frames)))
		q.frames, q.running = nil, false
		e.mu.Unlock()
		return
	}
	for {
		e.mu.Lock()
		if len(q.frames) == 0 {
			q.running = false
			e.mu.Unlock()
			return
		}
		f := q.frames[0]
		q.frames[0] = frame{}
		q.frames = q.frames[1:]
		e.mu.Unlock()
		lane := transport.Lane(q.lane)
		// A broadcast frame on the tree (its destination: the source)
		// goes around a failed child; one on a detour is routed again.
		cast := f.h[offFlags]&flagCast != 0 && binary.LittleEndian.Uint32(f.h[offDst:]) == binary.LittleEndian.Uint32(f.h[offSrc:])
		if e.isFailed(q.hop) && cast {
			e.castAround(q.hop, lane, f)
			continue
		}
		if e.isFailed(q.hop) {
			binary.LittleEndian.PutUint32(f.h[offVia:], uint32(q.hop+1))
			e.enqueue(lane, f)
			continue
		}
		e.stampReroute(&f.h, lane, q.hop)
		err := e.inner.Send(e.killCtx, q.hop, lane, &f.h, f.p)
		var pd *transport.PeerDownError
		switch {
		case err == nil:
			if f.h[offFlags]&(flagCheck|flagCast) == 0 {
				src := int32(binary.LittleEndian.Uint32(f.h[offSrc:]))
				dst := int32(binary.LittleEndian.Uint32(f.h[offDst:]))
				e.mu.Lock()
				e.flows[flowKey{src, dst, lane}] = flowState{last: binary.LittleEndian.Uint64(f.h[offSeq:]), hop: int32(q.hop)}
				e.mu.Unlock()
			}
		case errors.As(err, &pd) && pd.Peer == q.hop && cast:
			e.markFailed(q.hop)
			e.castAround(q.hop, lane, f)
		case errors.As(err, &pd) && pd.Peer == q.hop && int(binary.LittleEndian.Uint32(f.h[offDst:])) != q.hop:
			e.markFailed(q.hop)
			binary.LittleEndian.PutUint32(f.h[offVia:], uint32(q.hop+1))
			e.enqueue(lane, f)
		default:
			e.dropped.Add(1)
		}
	}
}

// arrive takes a frame addressed to this rank.
func (e *Endpoint) arrive(src int, lane transport.Lane, h *transport.Header, p []byte) {
	k := src*int(transport.NumLanes) + int(lane)
	e.mu.Lock()
	rx := e.rx[k]
	if rx == nil {
		rx = &rxState{}
		e.rx[k] = rx
	}
	e.mu.Unlock()
	flags := h[offFlags]
	seq := binary.LittleEndian.Uint64(h[offSeq:])
	via := int(binary.LittleEndian.Uint32(h[offVia:])) - 1
	rx.mu.Lock()
	defer rx.mu.Unlock()
	if flags&flagCheck != 0 {
		// seq is the last frame a relay handed to via, which failed.
		if rx.next <= seq {
			rx.next, rx.open, rx.frag = seq+1, false, nil
			e.reportLost(src, via)
		}
		return
	}
	switch {
	case seq < rx.next:
		e.dropped.Add(1) // late, from a route given up on: reported already
		return
	case seq > rx.next:
		rx.open, rx.frag = false, nil
		e.reportLost(src, via)
	}
	rx.next = seq + 1
	if flags&flagBye != 0 {
		e.bye(src, lane, h[offMask])
		return
	}
	if len(p) < transport.HeaderSize {
		e.dropped.Add(1)
		return
	}
	if flags&flagFirst != 0 {
		rx.open, rx.frag = false, nil
		copy(rx.fh[:], p[:transport.HeaderSize])
		if flags&flagMore == 0 {
			if e.up != nil {
				fh := rx.fh
				e.up(src, lane, &fh, p[transport.HeaderSize:])
			}
			return
		}
		rx.open = true
	} else if !rx.open {
		e.dropped.Add(1) // a fragment whose start was lost (reported)
		return
	}
	rx.frag = append(rx.frag, p[transport.HeaderSize:]...)
	if flags&flagMore != 0 {
		return
	}
	msg := rx.frag
	rx.open, rx.frag = false, nil
	if e.up != nil {
		fh := rx.fh
		e.up(src, lane, &fh, msg)
	}
}

func (e *Endpoint) reportLost(src, via int) {
	e.lost.Add(1)
	if e.opts.Lost != nil {
		e.opts.Lost(src, via)
	}
}

// bye records src's goodbye on lane; with the last lane of mask, src has
// departed gracefully.
//
// src still relays for the others while it lingers (Close), so routes keep
// it until it leaves: its neighbours see that (innerDown) and route around
// it. A neighbour's departure is told when its inner path departs.
func (e *Endpoint) bye(src int, lane transport.Lane, mask uint8) {
	e.mu.Lock()
	got := e.byes[src] | 1<<lane
	e.byes[src] = got
	done := got&mask == mask
	if done {
		e.goneLocked(src, e.heard)
	}
	e.mu.Unlock()
	if done && !e.g.IsNeighbor(e.rank, src) {
		e.notifyUp(src, &transport.PeerDownError{Peer: src, Cause: fmt.Errorf("relay: rank %d closed its endpoint: %w", src, transport.ErrPeerClosed)})
	}
}

// goneLocked sets p's flag in set (e.heard or e.told) and counts p gone
// the first time either is set. Called with e.mu held.
func (e *Endpoint) goneLocked(p int, set []bool) {
	if set[p] {
		return
	}
	before := e.told[p] || e.heard[p]
	set[p] = true
	if !before {
		e.gone++
		close(e.goneCh)
		e.goneCh = make(chan struct{})
	}
}

// innerDown: a neighbour failed or left. It relays nothing more; flows
// that went through it are checked at their destinations.
func (e *Endpoint) innerDown(peer int, err error) {
	if peer < 0 || peer >= e.g.Size() || !e.g.IsNeighbor(e.rank, peer) {
		return // never talked to directly (an inner mesh wider than the graph tells of everyone)
	}
	e.markFailed(peer)
	e.notifyUp(peer, err)
	e.mu.Lock()
	var checks []frame
	var lanes []transport.Lane
	for k, f := range e.flows {
		if int(f.hop) != peer || int(k.dst) == peer || f.checked {
			continue
		}
		var h transport.Header
		h[0] = ownerRelay
		h[offFlags] = flagCheck
		binary.LittleEndian.PutUint16(h[offHops:], uint16(min(e.g.HopLimit(), 0xffff)))
		binary.LittleEndian.PutUint32(h[offSrc:], uint32(k.src))
		binary.LittleEndian.PutUint32(h[offDst:], uint32(k.dst))
		binary.LittleEndian.PutUint32(h[offVia:], uint32(peer+1))
		binary.LittleEndian.PutUint64(h[offSeq:], f.last)
		checks = append(checks, frame{h: h})
		lanes = append(lanes, k.lane)
		f.checked = true
		e.flows[k] = f // kept: the next frame of the flow is stamped with the failed hop
	}
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return
	}
	for i, f := range checks {
		e.enqueue(lanes[i], f)
	}
}

// notifyUp tells the layer above, once, that peer is down.
func (e *Endpoint) notifyUp(peer int, err error) {
	e.mu.Lock()
	if e.told[peer] {
		e.mu.Unlock()
		return
	}
	e.goneLocked(peer, e.told)
	if !e.direct(peer) {
		e.downErr[peer] = err
	}
	if e.closed || e.upDn == nil {
		e.mu.Unlock()
		return
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		e.upDn(peer, err)
	}()
}

// Close says goodbye to every rank that is not down or gone: relayed
// behind this rank's messages, on every lane it used, to those it relayed
// messages to (Talked), to each neighbour directly, and in one broadcast on
// the control lane to the others (cast.go). It then lingers, relaying for
// the others, until every other rank said goodbye or is down, or for
// Options.Linger (a rank that returned from a collective may still be on
// the routes of ranks that have not), lets queued forwards drain for a
// bounded time, and closes the inner path. Idempotent.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		e.wg.Wait()
		return nil
	}
	e.closed = true
	close(e.done)
	e.doneCancel()
	e.mu.Unlock()
	select {
	case <-e.start:
	default:
		close(e.kill)
		e.killCancel()
		e.wg.Wait()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeDrain)
	defer cancel()
	// Every live rank gets the broadcast goodbye, which ends its linger
	// (a rank that said goodbye still lingers until it heard every
	// other's); ranks this one relayed messages to get a relayed goodbye
	// too, behind them, which tells them of the departure in order, and
	// neighbours learn it from the inner path: for both, the broadcast's
	// second bitmap says so.
	n := e.g.Size()
	bm := (n + 7) / 8
	var masks []uint8 // per rank: the lanes of a relayed goodbye, 0: none
	var cast []int
	ordered := make([]byte, bm)
	e.mu.Lock()
	ctl := uint8(1 << transport.LaneControl)
	for p := 0; p < n; p++ {
		if p == e.rank || e.isFailed(p) {
			continue
		}
		cast = append(cast, p)
		if e.direct(p) {
			ordered[p/8] |= 1 << (p % 8)
			continue
		}
		mask := uint8(0)
		for l := range transport.NumLanes {
			if tx := e.tx[p*int(transport.NumLanes)+int(l)]; tx != nil && tx.used {
				mask |= 1<<l | 1<<transport.LaneControl
			}
		}
		if mask != 0 {
			if masks == nil {
				masks = make([]uint8, n)
			}
			masks[p] = mask
			ordered[p/8] |= 1 << (p % 8)
		}
	}
	e.mu.Unlock()
	if len(cast) > 0 {
		_ = e.castAll(ctx, flagBye, ctl, cast, ordered)
	}
	for p, mask := range masks {
		for l := range transport.NumLanes {
			if mask&(1<<l) != 0 && ctx.Err() == nil {
				_ = e.sendRelayed(ctx, p, l, nil, nil, mask, true)
			}
		}
	}
	e.linger()
	// Let the forwarding queues drain (each drain goroutine gives up
	// closeDrain after Close).
	ctx, cancel = context.WithTimeout(context.Background(), closeDrain)
	defer cancel()
	for {
		e.mu.Lock()
		busy := false
		for _, q := range e.queues {
			busy = busy || q.running
		}
		e.mu.Unlock()
		if !busy || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(e.kill)
	e.killCancel()
	err := e.inner.Close()
	e.wg.Wait()
	return err
}

// linger waits until every other rank said goodbye or was told down, or
// Options.Linger passed.
func (e *Endpoint) linger() {
	t := time.NewTimer(e.opts.Linger)
	defer t.Stop()
	for {
		e.mu.Lock()
		all, ch := e.gone >= e.g.Size()-1, e.goneCh
		e.mu.Unlock()
		if all {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

// The rest of transport.DataPath: neighbours are the inner path's;
// relayed peers are never on shared memory, and are polled (and waited
// for) through every neighbour.

// Caps is the inner path's declaration.
func (e *Endpoint) Caps() transport.Caps {
	<-e.start
	return e.inner.Caps()
}

// SendProgress is the inner path's for a neighbour, else Send.
func (e *Endpoint) SendProgress(ctx context.Context, peer int, h *transport.Header, payload []byte, progress func() bool) error {
	if peer >= 0 && peer < e.g.Size() && e.direct(peer) {
		<-e.start
		e.mu.Lock()
		closed := e.closed
		e.mu.Unlock()
		if closed {
			return transport.ErrClosed
		}
		return e.inner.SendProgress(ctx, peer, h, payload, progress)
	}
	return e.Send(ctx, peer, transport.LaneData, h, payload)
}

// StartPolling is the inner path's for a neighbour. For another rank,
// whose messages come relayed by any neighbour, it polls every
// neighbour's channel that can be polled (nil, nil where none can).
func (e *Endpoint) StartPolling(peer int) (poll func() bool, stop func()) {
	if peer < 0 || peer >= e.g.Size() {
		return nil, nil
	}
	<-e.start
	if e.direct(peer) {
		return e.poller.StartPolling(peer)
	}
	var polls []func() bool
	var stops []func()
	for _, n := range e.g.Neighbors(e.rank) {
		if p, s := e.poller.StartPolling(n); p != nil {
			polls, stops = append(polls, p), append(stops, s)
		}
	}
	if len(polls) == 0 {
		return nil, nil
	}
	return func() bool {
			got := false
			for _, p := range polls {
				got = p() || got
			}
			return got
		}, func() {
			for _, s := range stops {
				s()
			}
		}
}

// Waiting is the inner path's for a neighbour; for another rank it is
// every neighbour's (a relayed message may come from any), so that their
// channels wake their readers for what they write meanwhile.
func (e *Endpoint) Waiting(peer int) (done func()) {
	if peer < 0 || peer >= e.g.Size() {
		return func() {}
	}
	<-e.start
	if e.direct(peer) {
		return e.poller.Waiting(peer)
	}
	var dones []func()
	for _, n := range e.g.Neighbors(e.rank) {
		dones = append(dones, e.poller.Waiting(n))
	}
	return func() {
		for _, d := range dones {
			d()
		}
	}
}

// Await is the inner path's for a neighbour; for another peer it returns
// false at once: relayed data arrives through the handler, which the
// caller's usual wait (Waiting) covers.
func (e *Endpoint) Await(peer int, done func() bool, d time.Duration) bool {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return false
	}
	<-e.start
	return e.poller.Await(peer, done, d)
}

// PeerPresence is the inner path's for a neighbour; for another peer it
// cannot tell.
func (e *Endpoint) PeerPresence(peer int) (transport.Presence, bool) {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return transport.Presence{}, false
	}
	<-e.start
	return e.poller.PeerPresence(peer)
}

// PeerAlive is the inner path's for a neighbour; for another peer it
// cannot tell. Before the relay starts it tells nothing.
func (e *Endpoint) PeerAlive(peer int) bool {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return false
	}
	select {
	case <-e.start:
	default:
		return false
	}
	return e.inner.PeerAlive(peer)
}

// SharedMemory is the inner path's for a neighbour; false for others.
func (e *Endpoint) SharedMemory(peer int) bool {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return false
	}
	<-e.start
	return e.inner.SharedMemory(peer)
}

// DeviceData is the inner path's for a neighbour; relayed data never
// carries device memory.
func (e *Endpoint) DeviceData(peer int) (send, recv bool) {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return false, false
	}
	<-e.start
	return e.inner.DeviceData(peer)
}

// SendDevice is the inner path's for a neighbour; a relayed peer's data
// cannot be device memory (transport.ErrNoDevicePath).
func (e *Endpoint) SendDevice(ctx context.Context, peer int, h *transport.Header, payload []byte) error {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return fmt.Errorf("relay: rank %d is reached through a relay: %w", peer, transport.ErrNoDevicePath)
	}
	<-e.start
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return transport.ErrClosed
	}
	return e.inner.SendDevice(ctx, peer, h, payload)
}

// Paths names the inner path for neighbours and the first relay for
// others.
func (e *Endpoint) Paths() map[int]string {
	<-e.start
	in := e.inner.Paths()
	out := make(map[int]string, e.g.Size())
	for p := 0; p < e.g.Size(); p++ {
		switch {
		case p == e.rank:
		case e.direct(p):
			out[p] = in[p]
		default:
			if h := e.nextHop(p); h >= 0 {
				out[p] = "relay via " + strconv.Itoa(h)
			} else {
				out[p] = "relay: no route"
			}
		}
	}
	return out
}

// Oversubscribed is the inner path's.
func (e *Endpoint) Oversubscribed() bool {
	<-e.start
	return e.poller.Oversubscribed()
}

// DataUnused is the inner path's for a neighbour; false for others (a
// relayed path always exists).
func (e *Endpoint) DataUnused(peer int) bool {
	if peer < 0 || peer >= e.g.Size() || !e.direct(peer) {
		return false
	}
	<-e.start
	return e.inner.DataUnused(peer)
}

// Abandon gives up on peer: a neighbour's connection is closed by the
// inner path (which tells DownHandler); another rank is taken out of every
// route and the DownHandler told once.
func (e *Endpoint) Abandon(peer int, cause error) {
	if peer < 0 || peer >= e.g.Size() || peer == e.rank {
		return
	}
	if cause == nil {
		cause = errors.New("relay: abandoned")
	}
	<-e.start
	if e.direct(peer) {
		e.inner.Abandon(peer, cause)
		return
	}
	e.markFailed(peer)
	e.notifyUp(peer, &transport.PeerDownError{Peer: peer, Cause: cause})
}
