package hier

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/nccl"
)

// This file is point-to-point within a host through NCCL (ncclSend,
// ncclRecv): the device buffer goes from GPU to GPU on the caller's stream,
// with no copy through host memory and no host wait for the stream.
//
// NCCL matches a pair's sends and receives in the order they are enqueued,
// with no tag, and a receive must be the size of its send. So the two
// sides keep NCCL's contract, per ordered pair, in call order: before the
// data goes, the sender tells the receiver (over nexar, on the host's
// communicator, in order) the message's tag and size. The receiver checks
// the message at the head of the pair's order against its call: a
// different tag, or a message longer than its buffer, is still received by
// NCCL (into device scratch: a receive that does not take it would leave
// both GPUs waiting for ever) and the call fails (CodeMismatch naming both
// tags; CodeTruncated with the bytes that fit); a shorter message fills
// the front of the buffer. The sender never waits for the receiver on the
// host: its ncclSend waits on the stream, as NCCL's does.

// p2pTag is the tag of the size-and-tag notes on the host's communicator.
const p2pTag uint64 = 0x6e636c7032700001

const noteBytes = 16

// p2pState orders a Comm's point-to-point calls per peer and direction.
type p2pState struct {
	mu    sync.Mutex
	locks map[[2]int]*sync.Mutex // by (direction, local index of the peer)
}

func (h *Comm) pairLock(send bool, lp int) *sync.Mutex {
	h.p2p.mu.Lock()
	defer h.p2p.mu.Unlock()
	if h.p2p.locks == nil {
		h.p2p.locks = map[[2]int]*sync.Mutex{}
	}
	d := 0
	if send {
		d = 1
	}
	k := [2]int{d, lp}
	m := h.p2p.locks[k]
	if m == nil {
		m = &sync.Mutex{}
		h.p2p.locks[k] = m
	}
	return m
}

// P2P reports whether device point-to-point calls with peer (a rank of the
// parent) can go through NCCL: the hierarchy is active, peer shares this
// rank's host, and the NCCL library has ncclSend and ncclRecv. The answer
// depends on the setup only, which both sides of a pair share, so they
// make the same choice. Safe for concurrent use.
func (h *Comm) P2P(peer int) bool {
	return h.active && h.lib != nil && h.lib.HasP2P() && peer >= 0 && peer < h.parent.Size() &&
		peer != h.rank && h.lay.HostOf[peer] == h.host
}

// beginP2P is begin for a point-to-point call: calls with other peers, and
// collectives, go on meanwhile (h.mu is not taken); the watcher watches.
func (h *Comm) beginP2P(op string, peer int) (int, error) {
	if !h.P2P(peer) {
		return 0, fmt.Errorf("hier: %s: rank %d cannot be reached through NCCL from rank %d", op, peer, h.rank)
	}
	if err := h.parent.Err(); err != nil {
		return 0, relabel(err, op)
	}
	h.wmu.Lock()
	h.busy++
	h.wmu.Unlock()
	h.poke()
	return h.lay.LocalOf[peer], nil
}

func (h *Comm) endP2P() {
	h.wmu.Lock()
	h.busy--
	h.wmu.Unlock()
}

// Send sends n bytes of device memory at buf to peer (a rank of the parent
// on this host, P2P) with tag, through NCCL on stream. With blocking it
// returns once the data has left buf; otherwise once the send is enqueued
// on stream (buf must not change until the stream passes it). Calls with
// one peer are matched in call order (see the file's doc); calls with
// other peers and collectives may run concurrently.
func (h *Comm) Send(ctx context.Context, buf cuda.DevicePtr, n, peer int, tag uint64, stream cuda.Stream, blocking bool) error {
	const op = "send"
	lp, err := h.beginP2P(op, peer)
	if err != nil {
		return err
	}
	defer h.endP2P()
	mu := h.pairLock(true, lp)
	mu.Lock()
	defer mu.Unlock()
	note := make([]byte, noteBytes)
	binary.LittleEndian.PutUint64(note, uint64(n))
	binary.LittleEndian.PutUint64(note[8:], tag)
	if err := h.local.Send(ctx, note, lp, p2pTag); err != nil {
		return h.failCall(op, err)
	}
	if n == 0 {
		return nil
	}
	if err := h.enqueue(func(c *nccl.Comm) error { return c.Send(buf, n, collective.Uint8, lp, stream) }); err != nil {
		return h.failCall(op, err)
	}
	return h.finishP2P(op, stream, blocking)
}

// Recv receives a message from peer (P2P) with tag into buf (device
// memory, n bytes) through NCCL on stream, and returns its length. With
// blocking it returns once the data is in buf; otherwise once the receive
// is enqueued (work enqueued on stream after it sees the data). The
// pair's next message must have tag and fit: see the file's doc for what
// fails, and how.
func (h *Comm) Recv(ctx context.Context, buf cuda.DevicePtr, n, peer int, tag uint64, stream cuda.Stream, blocking bool) (int, error) {
	const op = "recv"
	lp, err := h.beginP2P(op, peer)
	if err != nil {
		return 0, err
	}
	defer h.endP2P()
	mu := h.pairLock(false, lp)
	mu.Lock()
	defer mu.Unlock()
	note := make([]byte, noteBytes)
	if _, err := h.local.Recv(ctx, note, lp, p2pTag); err != nil {
		return 0, h.failCall(op, err)
	}
	m := int(binary.LittleEndian.Uint64(note))
	sent := binary.LittleEndian.Uint64(note[8:])
	if sent == tag && m <= n {
		if m > 0 {
			if err := h.enqueue(func(c *nccl.Comm) error { return c.Recv(buf, m, collective.Uint8, lp, stream) }); err != nil {
				return 0, h.failCall(op, err)
			}
			if err := h.finishP2P(op, stream, blocking); err != nil {
				return 0, err
			}
		}
		return m, nil
	}
	// Not this call's message: NCCL takes it all the same (into scratch),
	// and the call fails; the pair's order goes on.
	keep := 0
	if sent == tag {
		keep = n // too long: the bytes that fit
	}
	if err := h.drain(op, buf, keep, m, lp, stream); err != nil {
		return 0, err
	}
	if sent != tag {
		return 0, &core.Error{Code: core.CodeMismatch, Op: op, Rank: peer,
			Msg: fmt.Sprintf("rank %d's next message through NCCL has tag %d, this receive tag %d (NCCL matches a pair's messages in call order: the message was dropped)", peer, sent, tag)}
	}
	return n, &core.Error{Code: core.CodeTruncated, Op: op, Rank: peer,
		Msg: fmt.Sprintf("rank %d sent %d bytes through NCCL into a buffer of %d (the first %d kept)", peer, m, n, n)}
}

// drain receives m bytes from local peer lp into device scratch, copies
// the first keep of them to buf, and waits for both.
func (h *Comm) drain(op string, buf cuda.DevicePtr, keep, m, lp int, stream cuda.Stream) error {
	if m == 0 {
		return nil
	}
	scratch, err := h.rt.Malloc(m)
	if err != nil {
		return h.failCall(op, fmt.Errorf("hier: scratch for a message that does not match: %w", err))
	}
	defer h.rt.Free(scratch)
	if err := h.enqueue(func(c *nccl.Comm) error { return c.Recv(scratch, m, collective.Uint8, lp, stream) }); err != nil {
		return h.failCall(op, err)
	}
	if keep > 0 {
		if err := h.rt.MemcpyAsync(uintptr(buf), uintptr(scratch), keep, cuda.MemcpyDeviceToDevice, stream); err != nil {
			return h.failCall(op, err)
		}
	}
	return h.finishP2P(op, stream, true) // scratch is freed after
}

// finishP2P tracks the work enqueued on stream and, with blocking, waits
// for it.
func (h *Comm) finishP2P(op string, stream cuda.Stream, blocking bool) error {
	ev, err := h.track(op, stream)
	if err != nil {
		return h.failCall(op, err)
	}
	if blocking {
		if err := h.wait(ev); err != nil {
			return h.failCall(op, err)
		}
	}
	if h.dead.Load() {
		return h.failCall(op, errAborted)
	}
	return nil
}
