//go:build race

package bulk

import (
	"runtime"
	"unsafe"
)

// raceSync tells the race detector about the ordering that a
// shared-memory ring provides. The ring's head and tail are atomics on
// memory mapped outside the Go heap, which the race detector ignores (it
// does not track synchronisation there), so it sees no order between a
// payload's bytes read by one of this process's senders and the same
// bytes written later by one of its receivers, even when the later
// receive is a reply that could only be sent after the peer had read the
// first message: an in-place 2-rank allreduce sends half of its buffer
// while the receive of that half's result is posted on it. One raceSync per
// endpoint: every ring publish releases into it, every ring read acquires
// from it, so a message received through a ring is ordered after
// everything this endpoint sent through rings before (the chain of replies
// may pass through any peer). Real overlaps stay visible: a send's later
// bytes are read after the receive's acquire, with no order back.
// Safe for concurrent use. Its size is not zero, so that each has an
// address of its own.
type raceSync struct{ _ byte }

// release: the caller's accesses so far happen before any later acquire.
func (s *raceSync) release() {
	if s != nil {
		runtime.RaceReleaseMerge(unsafe.Pointer(s))
	}
}

// acquire: every release before this call happens before the caller's
// accesses after it.
func (s *raceSync) acquire() {
	if s != nil {
		runtime.RaceAcquire(unsafe.Pointer(s))
	}
}
