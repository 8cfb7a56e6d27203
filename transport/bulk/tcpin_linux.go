package bulk

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockWait is the receiving end of a TCP channel's first connection, taken
// out of Go's poller, so that the goroutines waiting for its data can read
// it themselves without any thread being woken as its packets arrive.
//
// A connection in Go's poller costs a wake-up per arriving packet even when
// no goroutine waits on it: its descriptor is in the runtime's epoll set,
// and an idle thread blocked in epoll_wait is woken for every readiness
// edge (then finds nothing to run and sleeps again). Waiters that spin on
// the socket need no such wake-up, and on a host whose cores are all busy
// (the ranks spinning) it takes a core from them: an 8-byte allreduce
// across two network namespaces on 2 cores took 22 µs (median) with the
// connection in the poller and 8 µs with GOMAXPROCS=1 (no idle thread to
// wake; docs/performance.md). So the socket is duplicated, Go's descriptor
// closed (which removes it from the epoll set), and the duplicate read with
// blocking system calls: by pollers (peek, then a frame), and by the read
// loop, which sleeps in poll(2) on the socket only while nobody polls, and
// otherwise on an eventfd (wake).
//
// Read and peek are called with the channel's rmu held, wait by the read
// loop only; wake, shutdown and answered are safe for concurrent use;
// release is called once, by the read loop as it ends, with rmu held.
type sockWait struct {
	fd int // the socket (blocking)
	ev int // eventfd: wakes the read loop's poll

	// mu guards closed against the reuse of fd's and ev's numbers: the
	// calls that may come from any goroutine take it.
	mu     sync.Mutex
	closed bool

	peekBuf [1]byte        // rmu
	evBuf   [8]byte        // read loop
	fds     [2]unix.PollFd // read loop
}

// newSockWait takes raw, a TCP connection nothing has read from yet, out
// of Go's poller, or returns nil (raw untouched) where it cannot: not a
// TCP connection, no descriptor to spare.
func newSockWait(raw net.Conn) *sockWait {
	rc := tcpRaw(raw)
	if rc == nil {
		return nil
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		return nil
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil
	}
	// Go's descriptor goes (and its epoll registration with it); the
	// connection lives on in fd. The blocking flag belongs to the file
	// description, which only fd refers to now.
	raw.Close()
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		unix.Close(ev)
		return nil
	}
	return &sockWait{fd: fd, ev: ev}
}

// Read reads from the socket, blocking until something arrives; io.EOF at
// its end. shutdown ends a Read in progress.
func (s *sockWait) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := unix.Read(s.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// peek reports whether a Read would not block: the socket holds data, or
// its end (or an error) is there for the Read to report.
func (s *sockWait) peek() bool {
	// Raw: it never blocks, so the scheduler need not know (a waiter
	// spins on it).
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(s.fd), uintptr(unsafe.Pointer(&s.peekBuf[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return e != syscall.EAGAIN && e != syscall.EINTR
}

// wait sleeps until wake is called, d passes (d < 0: no bound) or, with
// watch, the socket is readable (or ended). A signal's interruption is a
// wake-up like any other: the caller looks again either way.
func (s *sockWait) wait(watch bool, d time.Duration) error {
	s.fds[0] = unix.PollFd{Fd: int32(s.ev), Events: unix.POLLIN}
	fds := s.fds[:1]
	if watch {
		s.fds[1] = unix.PollFd{Fd: int32(s.fd), Events: unix.POLLIN}
		fds = s.fds[:2]
	}
	ms := -1
	if d >= 0 {
		ms = int(max(d/time.Millisecond, 1))
	}
	_, err := unix.Poll(fds, ms)
	if err != nil && err != unix.EINTR {
		return os.NewSyscallError("poll", err)
	}
	if s.fds[0].Revents != 0 {
		unix.Read(s.ev, s.evBuf[:]) // reset the count (non-blocking)
	}
	return nil
}

// wake ends the read loop's wait (or its next one) at once.
func (s *sockWait) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		var one = [8]byte{1}
		unix.Write(s.ev, one[:])
	}
}

// shutdown ends the connection both ways: a Read or wait in progress
// returns (at its end), and the peer sees the connection end.
func (s *sockWait) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		unix.Shutdown(s.fd, unix.SHUT_RDWR)
		unix.Write(s.ev, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	}
}

// answered is kernelAnswered for the socket.
func (s *sockWait) answered() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false
	}
	return kernelAnsweredFD(s.fd)
}

// release closes both descriptors; nothing may use them after.
func (s *sockWait) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		unix.Close(s.fd)
		unix.Close(s.ev)
	}
}
