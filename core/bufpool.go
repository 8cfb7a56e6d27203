package core

import (
	"math/bits"
	"sync"

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
	}
	p.mu.Unlock()
}

// poolClass is the size class of n bytes, or -1 when n is not pooled.
func poolClass(n int) int {
	if n < poolMin || n > transport.MaxPayload {
		return -1
	}
	return bits.Len(uint(n - 1))
}

// earlyPoolBytes bounds a communicator's idle early-arrival buffers
// (Comm.early): a quarter of the smaller of its scratch and buffering
// budgets (64 MiB by default, 1 MiB in the inference profile); none when
// scratch is not kept.
func earlyPoolBytes(cfg Config) int {
	return int(max(min(cfg.ScratchIdleBytes, cfg.MaxBufferedBytes)/4, 0))
}
