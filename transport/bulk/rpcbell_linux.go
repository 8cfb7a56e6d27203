//go:build linux

package bulk

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
)

// bell is the doorbell of an RPC ring: a FIFO that the producer writes a
// byte to after each piece it publishes, and that the consumer's reader
// goroutine reads when the ring is empty. Unlike a futex, a FIFO read parks
// the goroutine in Go's network poller without holding a thread and its P
// (a futex sleep in a system call holds the P until sysmon takes it back,
// tens of microseconds or more), so an idle RPC reader costs nothing and
// wakes at once. The FIFO lives next to its ring under shmDir, mode 0600,
// and is unlinked as soon as the producer has opened it (or the ring is
// given up); bytes in it are only wake-ups, never data.
type bell struct {
	f     *os.File
	path  string // set on the creating side
	unlnk sync.Once
}

// bellSuffix ends a doorbell's name: its ring's name plus this.
const bellSuffix = ".bell"

// createBell makes the doorbell of the ring at ringPath and opens it for
// reading (O_RDWR: the open never blocks, and the FIFO never reads EOF).
func createBell(ringPath string) (*bell, error) {
	path := ringPath + bellSuffix
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("bulk: create doorbell: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("bulk: open doorbell: %w", err)
	}
	return &bell{f: f, path: path}, nil
}

// openBell opens the doorbell a peer created for writing, after checking
// that it is a FIFO of this user, 0600, and unlinks it.
func openBell(path string) (*bell, error) {
	if !strings.HasPrefix(path, shmDir+"/"+ringPrefix) || !strings.HasSuffix(path, bellSuffix) || strings.Contains(path[len(shmDir)+1:], "/") {
		return nil, fmt.Errorf("bulk: doorbell %q is not under %s", path, shmDir)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("bulk: open doorbell: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO ||
		st.Uid != uint32(os.Geteuid()) || st.Mode&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("bulk: doorbell %s: not a FIFO of this user with mode 0600", path)
	}
	os.Remove(path)
	return &bell{f: f}, nil
}

// ring wakes the reader: one byte, never blocking (a full FIFO already
// holds wake-ups enough).
func (b *bell) ring() {
	rc, err := b.f.SyscallConn()
	if err != nil {
		return
	}
	one := []byte{1}
	rc.Write(func(fd uintptr) bool {
		syscall.Write(int(fd), one)
		return true
	})
}

// wait blocks until the bell rang (consuming the wake-ups so far) or the
// bell is closed.
func (b *bell) wait() error {
	var buf [512]byte
	_, err := b.f.Read(buf[:])
	return err
}

// unlink removes the creator's FIFO name (the open files stay);
// idempotent, safe concurrently with Close.
func (b *bell) unlink() {
	if b.path != "" {
		b.unlnk.Do(func() { os.Remove(b.path) })
	}
}

// Close unlinks the FIFO if still named and closes it: a wait returns.
func (b *bell) Close() error {
	b.unlink()
	return b.f.Close()
}
