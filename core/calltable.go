package core

// This file is the communicator's table of collective calls by sequence
// number: the signature of each call of this rank not completed yet, and
// the signatures peers sent for calls this rank has not made yet. A window
// of slots indexed by sequence number holds them (no map and no allocation
// while the calls in flight fit it); a call whose slot another call holds
// goes to an overflow map.

// callWindow is the number of call slots (a power of two).
const callWindow = 64

// callSlot is what c knows of collective call seq.
type callSlot struct {
	seq       uint64
	mine      signature // this rank's call, while it runs
	hasMine   bool
	remote    signature // a peer's, seen before this rank made the call
	from      int       // the peer that sent remote
	hasRemote bool
}

func (s *callSlot) used() bool { return s.hasMine || s.hasRemote }

// callTable holds the slots; every method is called with Comm.mu held.
type callTable struct {
	slots [callWindow]callSlot
	far   map[uint64]*callSlot // calls whose slot holds another (made on first need)
	// minFailed is the first call that failed here (MaxUint64: none): with
	// the calls still running, those not completed (Close's goodbye).
	minFailed uint64
}

// get returns call seq's entry, or nil.
func (t *callTable) get(seq uint64) *callSlot {
	if s := &t.slots[seq%callWindow]; s.used() && s.seq == seq {
		return s
	}
	if len(t.far) > 0 {
		return t.far[seq]
	}
	return nil
}

// at returns call seq's entry, making it (empty) if needed; the caller
// sets one of its fields before its next call into t.
func (t *callTable) at(seq uint64) *callSlot {
	if s := t.get(seq); s != nil {
		return s
	}
	if s := &t.slots[seq%callWindow]; !s.used() {
		*s = callSlot{seq: seq}
		return s
	}
	if t.far == nil {
		t.far = make(map[uint64]*callSlot)
	}
	s := &callSlot{seq: seq}
	t.far[seq] = s
	return s
}

// tidy frees s once it holds nothing.
func (t *callTable) tidy(s *callSlot) {
	if s.used() {
		return
	}
	if s != &t.slots[s.seq%callWindow] {
		delete(t.far, s.seq)
	}
}

// firstUnfinished returns the first call started here and not completed
// successfully, or next when there is none before it.
func (t *callTable) firstUnfinished(next uint64) uint64 {
	first := min(next, t.minFailed)
	for i := range t.slots {
		if s := &t.slots[i]; s.hasMine {
			first = min(first, s.seq)
		}
	}
	for _, s := range t.far {
		if s.hasMine {
			first = min(first, s.seq)
		}
	}
	return first
}
