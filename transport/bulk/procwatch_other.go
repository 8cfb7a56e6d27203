//go:build !linux

package bulk

import "errors"

// Off Linux there are no pidfds: a local peer's death is found by the
// heartbeat or by its transport, as for a remote one.

const procWatchSupported = false

type procID struct {
	PID   int
	Start uint64
	PIDNS string
}

func selfProcID() (procID, bool) { return procID{}, false }

type procWatch struct{}

func newProcWatch(func(peer, pid int)) (*procWatch, error) {
	return nil, errors.New("bulk: watching processes needs Linux")
}

func (w *procWatch) add(int, procID) error { return errors.New("bulk: watching processes needs Linux") }
func (w *procWatch) watching(int) bool     { return false }
func (w *procWatch) take(int) int          { return 0 }
func (w *procWatch) close()                {}
