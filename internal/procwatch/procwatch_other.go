//go:build !linux

package procwatch

import "errors"

// Package procwatch: off Linux there are no pidfds, and nothing is
// watched (a local process's death is found by its silence or its
// connection, as a remote one's).

// Supported is false: no pidfds off Linux.
const Supported = false

// ID identifies a process (unused off Linux).
type ID struct {
	PID   int
	Start uint64
	PIDNS string
}

// Self reports no identity off Linux.
func Self() (ID, bool) { return ID{}, false }

// StartTime is unknown off Linux.
func StartTime(int) (uint64, error) { return 0, errors.New("procwatch: needs Linux") }

// Watch watches nothing off Linux.
type Watch struct{}

// New fails off Linux.
func New(func(key, pid int)) (*Watch, error) {
	return nil, errors.New("procwatch: watching processes needs Linux")
}

func (w *Watch) Add(int, ID) error { return errors.New("procwatch: watching processes needs Linux") }
func (w *Watch) Watching(int) bool { return false }
func (w *Watch) Take(int) int      { return 0 }
func (w *Watch) Close()            {}
