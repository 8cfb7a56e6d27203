package core

import (
	"math/bits"
	"sync"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport"
)

// poolMin is the smallest payload read into a pooled buffer: below it
// a fresh allocation costs less than the bookkeeping.
const poolMin = 64 << 10

// bufPool keeps the buffers of large inbound payloads for reuse: RPC
// requests served by lent handlers and replies that the C and Python
// layers copy out (Comm.rpc), and chunks of collective and point-to-point
// messages that arrive before their receive is posted (Comm.early). A fresh 1 MiB buffer is zeroed by
// the Go runtime, or page-faulted by the kernel when the heap took it
// fresh from the OS, each costing about as much as the copy it receives.
// Buffers are kept by power-of-two size class, at most max bytes idle in
// all (set by the owner from the memory profile). Safe for concurrent use;
// its lock is a leaf.
type bufPool struct {
	// slabs carves the buffers of the sizes it Carves (Comm.slabs: shared
	// with the scratch pool, so that both find one registration covering
	// their buffers); nil: each is its own allocation. Set at creation.
	slabs *collective.Slabs

	mu    sync.Mutex
	max   int
	idle  int
	class [27][][]byte // class k: capacity 1<<k (k <= log2 MaxPayload)
}

// get returns a buffer of n bytes (pooled when n >= poolMin).
func (p *bufPool) get(n int) []byte {
	k := poolClass(n)
	if k < 0 {
		return make([]byte, n)
	}
	p.mu.Lock()
	if l := len(p.class[k]); l > 0 {
		b := p.class[k][l-1]
		p.class[k][l-1] = nil
		p.class[k] = p.class[k][:l-1]
		p.idle -= cap(b)
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	if b := p.slabs.Get(1 << k); b != nil { // nil: not carved (size, no slabs, closed)
		return b[:n]
	}
	return make([]byte, n, 1<<k)
}

// put gives b back for reuse; b must come from get and not be used after.
func (p *bufPool) put(b []byte) {
	k := poolClass(cap(b))
	if k < 0 || cap(b) != 1<<k {
		return
	}
	p.mu.Lock()
	if p.idle+cap(b) <= p.max {
		p.class[k] = append(p.class[k], b[:0])
		p.idle += cap(b)
		b = nil
	}
	p.mu.Unlock()
	if b != nil {
		p.slabs.Put(b) // a piece of a slab goes back to it; others to the GC
	}
}

// poolClass is the size class of n bytes, or -1 when n is not pooled.
func poolClass(n int) int {
	if n < poolMin || n > transport.MaxPayload {
		return -1
	}
	return bits.Len(uint(n - 1))
}

// newSlabs returns the slabs a communicator's scratch and early-arrival
// pools carve their large buffers from, where n's data path registers
// memory with a NIC (transport.Registrar: RDMA): there the buffers of both
// pools fall under one registration per slab, where each buffer would have
// its own (collective.Slabs). nil elsewhere (shared memory, TCP: nothing
// to share, so nothing changes) and where the scratch pool keeps less
// than a slab idle, whose pieces would come back at once, each time
// dropping the slab and its registration.
func newSlabs(n *node) *collective.Slabs {
	if n.reg == nil || !n.reg.Registers() || n.cfg.ScratchIdleBytes < collective.SlabBytes {
		return nil
	}
	return collective.NewSlabs(n.reg.Prepare, n.reg.Forget)
}

// earlyPoolBytes bounds a communicator's idle early-arrival buffers
// (Comm.early): a quarter of the smaller of its scratch and buffering
// budgets (64 MiB by default, 1 MiB in the inference profile); none when
// scratch is not kept.
func earlyPoolBytes(cfg Config) int {
	return int(max(min(cfg.ScratchIdleBytes, cfg.MaxBufferedBytes)/4, 0))
}
