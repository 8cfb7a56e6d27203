package bulk

import (
	"context"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockWriter writes a data channel's frames to one TCP connection and
// watches the caller's context only when the socket does not take them at
// once. A watch (context.AfterFunc) arms the context's timer and channel,
// which core makes lazily because most sends never wait: a watch on every
// frame cost a timer, about 800 bytes of garbage and the reuse of the
// call's state per message, most of a small allreduce's allocations
// between hosts (docs/performance.md). So it first writes what the socket
// takes without blocking (one writev with the descriptor non-blocking, as
// Go's own Write begins), and only the rest, if any, waits under the watch.
//
// Not safe for concurrent use: the channel's send lock serialises a link's
// writes (ctx is the current write's).
type sockWriter struct {
	raw net.Conn
	rc  syscall.RawConn
	ctx context.Context

	// try's arguments and results, fields so that rc.Write's function is
	// made once (tryFn), not per write.
	bufs  [][]byte
	one   [1][]byte // Write's argument list: a local one would escape
	iov   [16]unix.Iovec
	n     int
	err   error
	tryFn func(fd uintptr) bool
}

// newSockWriter returns the writer of raw, or nil where raw is not a TCP
// connection (the link then watches every write).
func newSockWriter(raw net.Conn) *sockWriter {
	rc := tcpRaw(raw)
	if rc == nil {
		return nil
	}
	w := &sockWriter{raw: raw, rc: rc}
	w.tryFn = w.try
	return w
}

// Write writes p: what the socket takes at once, then the rest under a
// watch of ctx. The record layer writes sealed records through it.
func (w *sockWriter) Write(p []byte) (int, error) {
	w.one[0] = p
	n, err := w.writeBuffers(w.one[:])
	w.one[0] = nil
	return n, err
}

// writeBuffers writes every buffer in order, as Write. bufs is consumed.
func (w *sockWriter) writeBuffers(bufs [][]byte) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	w.bufs, w.n, w.err = bufs, 0, nil
	if err := w.rc.Write(w.tryFn); err != nil {
		w.err = err
	}
	n, err, rest := w.n, w.err, net.Buffers(w.bufs) // try consumed what it wrote
	w.bufs = nil
	if err != nil || n == total {
		return n, err
	}
	ctx := w.ctx
	if ctx == nil {
		ctx = context.Background() // a write from outside connLink.write
	}
	m, err := watched(ctx, w.raw, rest)
	return n + m, err
}

// try is one non-blocking writev of w.bufs (rc.Write's function: it never
// asks to wait). EAGAIN is no error: the caller writes the rest blocking.
func (w *sockWriter) try(fd uintptr) bool {
	for {
		for len(w.bufs) > 0 && len(w.bufs[0]) == 0 {
			w.bufs = w.bufs[1:]
		}
		if len(w.bufs) == 0 {
			return true
		}
		k, err := w.writev(fd)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			if err != syscall.EAGAIN {
				w.err = err
			}
			return true
		}
		w.n += k
		w.bufs = consume(w.bufs, k)
		if k == 0 {
			return true
		}
	}
}

// writev writes the first len(w.iov) buffers of w.bufs (the first not
// empty) with one writev(2). A plain system call, as Go's own writev on a
// connection (internal/poll): no allocation for the vector, and no race
// detector annotation, which would report the network's order (a buffer
// sent, then a reply received into it: an in-place allreduce) as a race.
func (w *sockWriter) writev(fd uintptr) (int, error) {
	n := 0
	for _, b := range w.bufs {
		if n == len(w.iov) {
			break
		}
		if len(b) > 0 {
			w.iov[n].Base = &b[0]
			w.iov[n].SetLen(len(b))
			n++
		}
	}
	r, _, e := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(n))
	clear(w.iov[:n]) // no references kept to the caller's buffers
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// consume drops the first n bytes of bufs (emptied buffers, and the front
// of a partly written one; the array is written, as net.Buffers does).
func consume(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}
