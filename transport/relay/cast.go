package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/nexar-go/nexar/transport"
)

// Broadcast: one message from this rank to many non-neighbours, carried
// over the tree of shortest routes back to this rank (a rank's parent is
// its next hop towards the source), so that each rank of the world gets
// the frame once, from a neighbour, and forwards it to its own children:
// N-1 one-hop sends where relaying the message to each rank takes the sum
// of their distances. A departure (Close, and the layer above's goodbyes)
// is told to every rank this way. The frame names its recipients (a bit per
// rank); the others only forward it.
//
// Order: a rank's broadcasts on one lane reach each recipient in the order
// they were sent (they take the same tree edges, each a FIFO per (next hop,
// lane)); they are not ordered with this rank's relayed messages to that
// recipient, which take the route to it. Broadcast to a rank that a relayed
// message went to, and a goodbye that must follow one, therefore goes
// relayed (see Close and Talked).

// Talked reports whether this rank relayed a message (or a fragment) to
// world rank p: a goodbye to p must then follow it on its route, where a
// broadcast could overtake it.
func (e *Endpoint) Talked(p int) bool {
	if p < 0 || p >= e.g.Size() {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for l := range transport.NumLanes {
		if tx := e.tx[p*int(transport.NumLanes)+int(l)]; tx != nil && tx.used {
			return true
		}
	}
	return false
}

// Broadcast delivers (h, payload) on lane to every rank in to (world ranks,
// not this one) as if sent to each directly; it
// returns once the frames went to this rank's children. Order: see the
// file comment.
func (e *Endpoint) Broadcast(ctx context.Context, lane transport.Lane, h *transport.Header, payload []byte, to []int) error {
	if lane >= transport.NumLanes {
		return fmt.Errorf("relay: broadcast on lane %d: unknown lane", lane)
	}
	var orig transport.Header
	if h != nil {
		orig = *h
	}
	return e.cast(ctx, lane, 0, 0, to, func(p []byte) []byte {
		p = append(p, orig[:]...)
		return append(p, payload...)
	}, transport.HeaderSize+len(payload))
}

// castAll sends this rank's goodbye broadcast to the ranks in to, with the
// bitmap of the ones also told in order (see Close).
func (e *Endpoint) castAll(ctx context.Context, flags, mask uint8, to []int, ordered []byte) error {
	return e.cast(ctx, transport.LaneControl, flags, mask, to, func(p []byte) []byte { return append(p, ordered...) }, len(ordered))
}

// cast sends this rank's broadcast frame (flags and mask: a goodbye's)
// carrying body to the ranks in to.
func (e *Endpoint) cast(ctx context.Context, lane transport.Lane, flags, mask uint8, to []int, body func([]byte) []byte, bodyLen int) error {
	n := e.g.Size()
	bm := (n + 7) / 8
	if bm+bodyLen > e.frag {
		return fmt.Errorf("relay: broadcast of %d bytes to %d ranks exceeds a frame", bodyLen, n)
	}
	p := make([]byte, bm, bm+bodyLen)
	for _, r := range to {
		if r < 0 || r >= n || r == e.rank {
			return fmt.Errorf("relay: broadcast from rank %d to rank %d: out of range or itself", e.rank, r)
		}
		p[r/8] |= 1 << (r % 8)
	}
	p = body(p)
	var fh transport.Header
	fh[0] = ownerRelay
	fh[offFlags] = flagCast | flags
	fh[offMask] = mask
	binary.LittleEndian.PutUint16(fh[offHops:], uint16(min(e.g.HopLimit(), 0xffff)))
	binary.LittleEndian.PutUint32(fh[offSrc:], uint32(e.rank))
	binary.LittleEndian.PutUint32(fh[offDst:], uint32(e.rank))
	<-e.start
	f := frame{h: fh, p: p}
	for _, c := range e.castChildren(e.rank, e.rank) {
		if e.isFailed(c) {
			e.castAround(c, lane, f)
			continue
		}
		err := e.inner.Send(ctx, c, lane, &fh, p)
		var pd *transport.PeerDownError
		if errors.As(err, &pd) && pd.Peer == c {
			e.markFailed(c)
			e.castAround(c, lane, f)
			continue
		}
		if err != nil {
			return e.sendErr(ctx, err)
		}
	}
	return nil
}

// castChildren returns the neighbours of at whose next hop towards src is
// at (without failures): at's children in the broadcast tree of src.
func (e *Endpoint) castChildren(at, src int) []int {
	var out []int
	for _, y := range e.g.Neighbors(at) {
		if y == src {
			continue
		}
		if h, ok := e.g.NextHop(y, src, nil); ok && h == at {
			out = append(out, y)
		}
	}
	return out
}

// castArrive takes a broadcast frame of src: forward it to this rank's
// children, and deliver it here if this rank is a recipient.

func (e *Endpoint) castArrive(src int, lane transport.Lane, h *transport.Header, p []byte) {
	n := e.g.Size()
	bm := (n + 7) / 8
	hops := binary.LittleEndian.Uint16(h[offHops:])
	if len(p) < bm {
		e.dropped.Add(1)
		return
	}
	if binary.LittleEndian.Uint32(h[offDst:]) != uint32(src) {
		// The end of a detour: the tree again, with the hops of a tree.
		hops = uint16(min(e.g.HopLimit(), 0xffff))
	}
	f := frame{h: *h, p: p}
	binary.LittleEndian.PutUint16(f.h[offHops:], hops-1)
	binary.LittleEndian.PutUint32(f.h[offDst:], uint32(src))
	for _, c := range e.castChildren(e.rank, src) {
		if hops <= 1 {
			e.dropped.Add(1)
			break
		}
		e.fwdMsgs.Add(1)
		if e.isFailed(c) {
			e.castAround(c, lane, f)
			continue
		}
		e.enqueueTo(c, lane, f)
	}
	if p[e.rank/8]&(1<<(e.rank%8)) == 0 {
		return
	}
	if h[offFlags]&flagBye != 0 {
		// The body's bitmap names the recipients told of the departure
		// otherwise, in order (a relayed goodbye, or the inner path's):
		// for them this goodbye only ends their linger.
		if b := p[bm:]; len(b) >= bm && b[e.rank/8]&(1<<(e.rank%8)) != 0 {
			e.mu.Lock()
			e.goneLocked(src, e.heard)
			e.mu.Unlock()
			return
		}
		e.bye(src, lane, h[offMask])
		return
	}
	body := p[bm:]
	if len(body) < transport.HeaderSize {
		e.dropped.Add(1)
		return
	}
	if e.up != nil {
		var oh transport.Header
		copy(oh[:], body)
		// The frame's payload is shared with the copies forwarded to
		// the children; the handler owns what it gets.
		e.up(src, lane, &oh, append([]byte(nil), body[transport.HeaderSize:]...))
	}
}

// castAround hands a broadcast frame that the tree would give to the
// failed (or departed) rank y to y's children instead, each relayed to
// along a live route (the frame's destination names the child, which then
// continues on the tree); a failed child's children likewise. Such a
// detour is not ordered with the tree's frames.
func (e *Endpoint) castAround(y int, lane transport.Lane, f frame) {
	src := int(binary.LittleEndian.Uint32(f.h[offSrc:]))
	for _, c := range e.castChildren(y, src) {
		if e.isFailed(c) {
			e.castAround(c, lane, f)
			continue
		}
		g := f
		binary.LittleEndian.PutUint32(g.h[offDst:], uint32(c))
		// A detour is a route of its own (it may be long: the way around
		// a ring); it ends deeper in the tree, so detours cannot loop.
		binary.LittleEndian.PutUint16(g.h[offHops:], uint16(min(e.g.HopLimit(), 0xffff)))
		e.enqueue(lane, g)
	}
}
