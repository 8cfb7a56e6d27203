package bulk

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockWait lets the goroutines that wait for a TCP channel's data read it
// themselves, as they do a ring's: the channel's read loop sleeps until the
// socket is readable on a duplicate of its descriptor, registered with Go's
// poller apart from the connection. A read loop parked in a read of the
// connection itself would hold the connection's read lock, so a waiter
// could only read after the loop woke: two wake-ups per message (the
// loop's thread, then the waiter's), which on an idle host cost tens of
// microseconds each, where a waiter that polls the socket costs none.
//
// peek is called with the channel's rmu held; wait and clearInterrupt by
// the read loop only; interrupt and close by anyone.
type sockWait struct {
	conn syscall.RawConn // the connection's own descriptor: peeks
	dup  *os.File        // a duplicate: the read loop's waits
	dupc syscall.RawConn

	waitFn           func(fd uintptr) bool
	peekCtl          func(fd uintptr)
	peeked           bool    // rmu: peekCtl's answer
	peekBuf, waitBuf [1]byte // recv's buffers, one per caller side
}

// newSockWait returns the waiter of raw, or nil where raw is not a TCP
// connection or its descriptor cannot be duplicated (the read loop then
// reads as before and nobody polls).
func newSockWait(raw net.Conn) *sockWait {
	tc, ok := raw.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	nfd, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil || derr != nil {
		return nil
	}
	// The descriptor is non-blocking (the flag belongs to the shared file
	// description), so os.NewFile registers it with the poller.
	f := os.NewFile(uintptr(nfd), "bulk-tcp-wait")
	dc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	s := &sockWait{conn: rc, dup: f, dupc: dc}
	s.peekCtl = func(fd uintptr) { s.peeked = readable(fd, &s.peekBuf) }
	s.waitFn = func(fd uintptr) bool { return readable(fd, &s.waitBuf) }
	return s
}

// readable reports whether a read of socket fd would not block: it holds
// data, or its end (or an error) is there for the read to report.
func readable(fd uintptr, b *[1]byte) bool {
	_, _, e := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return e != syscall.EAGAIN && e != syscall.EINTR
}

// peek reports whether the socket holds data (or its end), without
// waiting. Called with rmu held.
func (s *sockWait) peek() bool {
	s.peeked = false
	if s.conn.Control(s.peekCtl) != nil {
		return true // closed: a read reports it
	}
	return s.peeked
}

// wait sleeps until the socket is readable, interrupt is called, or the
// waiter is closed. It returns nil when readable, errInterrupted after an
// interrupt (the caller then calls clearInterrupt), else the error that
// closed it.
func (s *sockWait) wait() error {
	err := s.dupc.Read(s.waitFn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errInterrupted
	}
	return err
}

// interrupt ends the read loop's wait (or its next one) at once.
func (s *sockWait) interrupt() { s.dup.SetReadDeadline(time.Unix(1, 0)) }

// clearInterrupt lets the next wait sleep again.
func (s *sockWait) clearInterrupt() { s.dup.SetReadDeadline(time.Time{}) }

// close closes the duplicate, which ends a wait in progress. The socket
// itself lives on until the connection is closed too.
func (s *sockWait) close() { s.dup.Close() }
