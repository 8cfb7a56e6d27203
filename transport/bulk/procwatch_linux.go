//go:build linux

package bulk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Same-host deaths: the process of a peer on this host is watched through
// a pidfd (pidfd_open(2)), which becomes readable when the process exits,
// so a killed local peer is noticed in milliseconds instead of at the
// heartbeat timeout. One goroutine waits, in epoll, on the pidfds of every
// watched peer and on an eventfd that stops it.

const procWatchSupported = true

// procID identifies a process across pid reuse: its pid, its start time
// (procStart: clock ticks after boot) and its pid namespace.
type procID struct {
	PID   int
	Start uint64
	PIDNS string
}

// selfProcID returns this process's identity; ok is false when /proc
// cannot tell it.
func selfProcID() (procID, bool) {
	pid := os.Getpid()
	st, err := procStart(pid)
	if err != nil {
		return procID{}, false
	}
	ns, err := os.Readlink("/proc/self/ns/pid") // "pid:[inode]"
	if err != nil || ns == "" {
		return procID{}, false
	}
	return procID{PID: pid, Start: st, PIDNS: ns}, true
}

// openProc opens a pidfd on the process id names and proves that it is
// that process, not a later one that reuses the pid: the pidfd is opened
// first and the start time read after, so a match means the pidfd refers
// to the process that was started then (a process keeps its pid for life).
func openProc(id procID) (int, error) {
	if id.PID <= 0 || id.Start == 0 {
		return -1, errors.New("bulk: no process identity")
	}
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		return -1, fmt.Errorf("bulk: pidfd_open(%d): %w", id.PID, err)
	}
	st, err := procStart(id.PID)
	if err != nil || st != id.Start {
		unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("bulk: pid %d now belongs to another process (start time %d, want %d)", id.PID, st, id.Start)
		}
		return -1, err
	}
	return fd, nil
}

// procWatch reports, once each, the exit of the processes it watches.
// Safe for concurrent use.
type procWatch struct {
	exited func(peer, pid int) // called from the watch goroutine
	epfd   int
	evfd   int
	done   chan struct{}

	// mu guards the fields below.
	mu     sync.Mutex
	fds    map[int]watchedProc // by peer
	closed bool
}

type watchedProc struct {
	fd, pid int
}

// newProcWatch starts the watch goroutine; exited is called from it,
// without any of the watcher's locks held, when a watched process exits.
func newProcWatch(exited func(peer, pid int)) (*procWatch, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("bulk: epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("bulk: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(evfd)
		unix.Close(epfd)
		return nil, fmt.Errorf("bulk: epoll_ctl: %w", err)
	}
	w := &procWatch{exited: exited, epfd: epfd, evfd: evfd, done: make(chan struct{}), fds: map[int]watchedProc{}}
	go w.loop()
	return w, nil
}

// add watches the process id names as peer's. A peer is watched once;
// an error says why it cannot be (the process is gone, or the pid now
// names another process, or pidfds are unavailable).
func (w *procWatch) add(peer int, id procID) error {
	if peer < 0 {
		return errors.New("bulk: bad peer")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("bulk: process watch closed")
	}
	if _, ok := w.fds[peer]; ok {
		return nil
	}
	fd, err := openProc(id)
	if err != nil {
		return err
	}
	// Level-triggered: a process that exited before this call is
	// reported by the next wait.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(peer)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bulk: epoll_ctl: %w", err)
	}
	w.fds[peer] = watchedProc{fd: fd, pid: id.PID}
	return nil
}

// watching reports whether peer's process is watched (not yet exited).
func (w *procWatch) watching(peer int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.fds[peer]
	return ok
}

// take stops watching peer and returns its pid, or 0 if it was not
// watched.
func (w *procWatch) take(peer int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.fds[peer]
	if !ok {
		return 0
	}
	delete(w.fds, peer)
	unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, p.fd, nil)
	unix.Close(p.fd)
	return p.pid
}

func (w *procWatch) loop() {
	defer close(w.done)
	evs := make([]unix.EpollEvent, 16)
	for {
		n, err := unix.EpollWait(w.epfd, evs, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		for _, ev := range evs[:n] {
			if ev.Fd < 0 {
				return // close
			}
			peer := int(ev.Fd)
			if pid := w.take(peer); pid != 0 {
				w.exited(peer, pid)
			}
		}
	}
}

// close stops the watch goroutine, waits for it, and closes every pidfd.
// Idempotent; not to be called from exited.
func (w *procWatch) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return
	}
	w.closed = true
	w.mu.Unlock()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(w.evfd, one[:])
	<-w.done
	w.mu.Lock()
	for peer, p := range w.fds {
		unix.Close(p.fd)
		delete(w.fds, peer)
	}
	w.mu.Unlock()
	unix.Close(w.evfd)
	unix.Close(w.epfd)
}
