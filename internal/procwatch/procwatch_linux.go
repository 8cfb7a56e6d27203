//go:build linux

// Package procwatch watches processes on this host through pidfds
// (pidfd_open(2)), which become readable when the process exits, so that a
// killed process on this host is noticed in milliseconds instead of at a
// heartbeat or idle timeout: transport/bulk watches its same-host peers,
// membership's seed the joiners on its host. One goroutine per Watch waits,
// in epoll, on the pidfds of every watched process and on an eventfd that
// stops it. An ID carries the start time and pid namespace, so a reused
// pid is never mistaken for the process it once named.
package procwatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Supported: pidfds exist on this platform (Linux; the kernel may still
// lack them, which New and Add report).
const Supported = true

// ID identifies a process across pid reuse: its pid, its start time
// (StartTime: clock ticks after boot) and its pid namespace.
type ID struct {
	PID   int
	Start uint64
	PIDNS string
}

// Self returns this process's identity; ok is false when /proc cannot
// tell it.
func Self() (ID, bool) {
	pid := os.Getpid()
	st, err := StartTime(pid)
	if err != nil {
		return ID{}, false
	}
	ns, err := os.Readlink("/proc/self/ns/pid") // "pid:[inode]"
	if err != nil || ns == "" {
		return ID{}, false
	}
	return ID{PID: pid, Start: st, PIDNS: ns}, true
}

// StartTime reads the start time of process pid (field 22 of
// /proc/pid/stat, clock ticks since boot).
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("procwatch: malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("procwatch: malformed /proc stat")
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22: the 20th after ')'
}

// open opens a pidfd on the process id names and proves that it is
// that process, not a later one that reuses the pid: the pidfd is opened
// first and the start time read after, so a match means the pidfd refers
// to the process that was started then (a process keeps its pid for life).
func open(id ID) (int, error) {
	if id.PID <= 0 || id.Start == 0 {
		return -1, errors.New("procwatch: no process identity")
	}
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		return -1, fmt.Errorf("procwatch: pidfd_open(%d): %w", id.PID, err)
	}
	st, err := StartTime(id.PID)
	if err != nil || st != id.Start {
		unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("procwatch: pid %d now belongs to another process (start time %d, want %d)", id.PID, st, id.Start)
		}
		return -1, err
	}
	return fd, nil
}

// Watch reports, once each, the exit of the processes it watches, each
// under a key of the caller's (a rank). Safe for concurrent use.
type Watch struct {
	exited func(key, pid int) // called from the watch goroutine
	epfd   int
	evfd   int
	done   chan struct{}

	// mu guards the fields below.
	mu     sync.Mutex
	fds    map[int]watchedProc // by key
	closed bool
}

type watchedProc struct {
	fd, pid int
}

// New starts the watch goroutine; exited is called from it, without any
// of the watcher's locks held, when a watched process exits.
func New(exited func(key, pid int)) (*Watch, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("procwatch: epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("procwatch: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(evfd)
		unix.Close(epfd)
		return nil, fmt.Errorf("procwatch: epoll_ctl: %w", err)
	}
	w := &Watch{exited: exited, epfd: epfd, evfd: evfd, done: make(chan struct{}), fds: map[int]watchedProc{}}
	go w.loop()
	return w, nil
}

// Add watches the process id names under key (>= 0). A key is watched
// once; an error says why it cannot be (the process is gone, or the pid
// now names another process, or pidfds are unavailable).
func (w *Watch) Add(peer int, id ID) error {
	if peer < 0 {
		return errors.New("procwatch: bad key")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("procwatch: process watch closed")
	}
	if _, ok := w.fds[peer]; ok {
		return nil
	}
	fd, err := open(id)
	if err != nil {
		return err
	}
	// Level-triggered: a process that exited before this call is
	// reported by the next wait.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(peer)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		unix.Close(fd)
		return fmt.Errorf("procwatch: epoll_ctl: %w", err)
	}
	w.fds[peer] = watchedProc{fd: fd, pid: id.PID}
	return nil
}

// Watching reports whether key's process is watched (not yet exited).
func (w *Watch) Watching(peer int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.fds[peer]
	return ok
}

// Take stops watching key and returns its pid, or 0 if it was not
// watched.
func (w *Watch) Take(peer int) int {
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

func (w *Watch) loop() {
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
			if pid := w.Take(peer); pid != 0 {
				w.exited(peer, pid)
			}
		}
	}
}

// Close stops the watch goroutine, waits for it, and closes every pidfd.
// Idempotent; not to be called from exited.
func (w *Watch) Close() {
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
