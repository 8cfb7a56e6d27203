// Package match is the matching engine of one communicator: it pairs
// inbound messages (collective steps and point-to-point sends, whole or in
// chunks) with the receives posted for them, buffers what arrives first,
// and reports completed receives.
//
// It does no IO and starts no goroutines, in the manner of etcd raft's
// RawNode: the driver (core.Comm) feeds it events (Post*, Deliver*,
// Place*/Filled*, Cancel, Unpost, Depart, Drop) and acts on what it
// reports: the outcome of each call, and the completions collected since
// the last call to Ready, which the driver settles (closes a waiter's
// channel, finishes a request) before its next call. Buffered bytes are
// accounted by the driver through the room function it passes in; the
// engine reports the bytes it stops holding. A receive into memory that
// host code must not touch (GPU device memory) brings the driver's Put,
// which the engine calls where it would copy.
//
// Collective messages are kept per call, in a window of slots indexed by
// sequence number (a call's few messages from each source in its slot), so
// that the common case (a handful of calls in flight) costs no map and no
// allocation; a message whose slot is taken by another call or full goes
// to an overflow map.
//
// An Engine is not safe for concurrent use: the driver serialises every
// call (core holds Comm.mu), including the Filled* calls of the transport
// goroutine that wrote a placed chunk. Release, Msg.Filling and
// Msg.EndFill are the exceptions (see there).
package match

import (
	"sync"
	"sync/atomic"
)

// Key names one collective message: the step of a call (by sequence
// number) from a source rank.
type Key struct {
	Src  int
	Seq  uint64
	Step uint32
}

// Signal is a one-shot completion whose channel is made only when someone
// blocks on it (C): a waiter that sees it fire while it polls costs no
// allocation. Safe for concurrent use; the zero Signal is not fired.
type Signal struct{ ch atomic.Pointer[chan struct{}] }

// fired is the channel of every Signal fired before anyone asked for one:
// closed once, never written again.
var fired = func() *chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return &ch
}()

// Fire marks s fired and closes its channel if one was made; idempotent.
func (s *Signal) Fire() {
	if p := s.ch.Swap(fired); p != nil && p != fired {
		close(*p)
	}
}

// Fired reports whether Fire was called.
func (s *Signal) Fired() bool { return s.ch.Load() == fired }

// C returns a channel closed once s fires.
func (s *Signal) C() <-chan struct{} {
	if p := s.ch.Load(); p != nil {
		return *p
	}
	ch := make(chan struct{})
	if s.ch.CompareAndSwap(nil, &ch) {
		return ch
	}
	return *s.ch.Load()
}

// Msg is one inbound message, buffered until a receive is posted or
// matched with one.
type Msg struct {
	// Done is the driver's: for a posted collective receive, what it
	// fires when a completion names this message. The engine never
	// touches it.
	Done Signal
	// Err is the error a Depart completed this collective receive with.
	Err error
	// Fill is the driver's too: the callback it hands the transport for
	// a chunk placed into this collective receive (see PlaceColl), made
	// once and kept while the Msg is reused (Release), with FillSize the
	// chunk's length. The engine never touches them.
	Fill     func(error)
	FillSize int
	// FillWhole is the driver's callback for a chunk placed whole (see
	// PlaceColl), kept like Fill.
	FillWhole func(error)
	// Fired is the driver's too: Done.Fired as a function value, made
	// once and kept like Fill (a waiter hands it to a sleep).
	Fired func() bool

	key Key // a collective message's

	src      int
	tag      uint64
	total    int // bytes; -1 while a posted collective receive has seen none
	got      int
	chunks   []chunk // held while unmatched
	held     int64   // bytes of chunks (accounted by the driver)
	buf      []byte  // a posted collective receive's destination
	posted   bool    // collective: a receive is posted (buf is its destination)
	recv     *Recv   // point-to-point: the matched receive
	complete bool    // point-to-point, unmatched: every chunk arrived
	putErr   error   // point-to-point: the first failed Put of its receive
	// filling: a placed chunk is being written into the destination.
	// Atomic: a message placed whole (PlaceColl) ends its fill without a
	// call into the engine.
	filling atomic.Bool
}

// chunk is a payload the engine holds; pooled: the driver's
// (DeliverCollPooled, DeliverP2PPooled), given back through Engine.Free
// once copied out.
type chunk struct {
	p      []byte
	pooled bool
}

// Filling reports whether the transport is writing a placed chunk into
// m's destination (see Filled*): the driver waits for that to end before
// it lets a withdrawn receive's buffer go. Safe for concurrent use.
func (m *Msg) Filling() bool { return m != nil && m.filling.Load() }

// EndFill ends the write of a message PlaceColl placed whole (whole true):
// the driver calls it after the write, from the goroutine that wrote, and
// then, when the write succeeded, fires Done. Safe for concurrent use with
// the engine's calls, which no longer see m.
func (m *Msg) EndFill() { m.filling.Store(false) }

// AnySource as a Recv's Src matches a message from any rank.
const AnySource = -1

// Recv is a posted point-to-point receive.
type Recv struct {
	Src   int // a rank, or AnySource
	Tag   uint64
	Buf   []byte
	Owner any // the driver's (core: its *Request); the engine never touches it
	// Put, when set, writes src into dst (a part of Buf) where the engine
	// would copy: Buf is memory that host code must not touch (GPU device
	// memory), which Put reaches through its runtime. Its first error
	// fails the receive (the Completion's Err). PlaceP2P places such a
	// receive only where the driver says the transport writes that memory
	// itself.
	Put func(dst, src []byte) error

	msg    *Msg
	cancel bool
}

// Msg is the message matched with r, or nil.
func (r *Recv) Msg() *Msg { return r.msg }

// Completion is a receive that completed: a posted collective receive
// (Coll) or a point-to-point one (Recv). Err is set when Depart failed
// it, or a Put of the receive failed; otherwise, for Recv, Source and Tag name the message, Total is its
// length and Count the bytes written (Total > len(Recv.Buf): truncated).
type Completion struct {
	Coll   *Msg
	Recv   *Recv
	Err    error
	Source int
	Tag    uint64
	Count  int
	Total  int
}

// Mismatch reports a collective message whose length differs from the
// receive posted for it: the ranks disagree about the call.
type Mismatch struct {
	Key
	Sent, Want int
}

// Outcome is what a Deliver call did with a chunk.
type Outcome uint8

const (
	// Copied: written into a posted receive (or dropped for a cancelled
	// one); the payload is free again.
	Copied Outcome = iota + 1
	// Buffered: held until a receive is posted; the driver accounted its
	// bytes (room returned true).
	Buffered
	// NoRoom: it must be held but room returned false; nothing changed
	// but the message's registration, and the driver calls again when
	// there is room.
	NoRoom
	// Mismatched: a posted collective receive of another length; the
	// Mismatch says which.
	Mismatched
)

// Engine holds the matching state of one communicator of size ranks.
type Engine struct {
	msgs  sync.Pool // *Msg of collective messages done with (Release)
	slots [collWindow]collSlot
	coll  map[Key]*Msg // collective messages no slot holds (made on first need)
	// scratch collects collective messages while Depart and Drop walk them.
	scratch    []*Msg
	posted     []*Recv // point-to-point receives, in posting order
	unexpected []*Msg  // point-to-point messages not matched, in arrival order
	cur        []*Msg  // per source: the point-to-point message in progress
	ready      []Completion
	spare      []Completion
	// Free, when set, takes back the payloads of DeliverCollPooled and
	// DeliverP2PPooled once the engine has copied them into their receive
	// (or found the receive withdrawn); never one it drops unread: those
	// go to the garbage collector. Set by the driver before its first
	// call.
	Free func([]byte)
}

// collWindow is the number of call slots (a power of two): calls whose
// sequence numbers differ by a multiple of it share a slot, and the later
// one's messages go to the overflow map while the earlier one holds it.
const collWindow = 64

// slotMsgs is how many messages of one call a slot holds: a small
// collective exchanges one or two messages per source and call.
const slotMsgs = 4

// collSlot holds the messages of call seq (n of them) while any is pending.
type collSlot struct {
	seq  uint64
	n    int
	msgs [slotMsgs]*Msg
}

// New returns an empty engine for a communicator of size ranks.
func New(size int) *Engine {
	return &Engine{cur: make([]*Msg, size)}
}

// lookup returns the registered collective message k, or nil.
func (e *Engine) lookup(k Key) *Msg {
	if s := &e.slots[k.Seq%collWindow]; s.n > 0 && s.seq == k.Seq {
		for _, m := range s.msgs[:s.n] {
			if m.key == k {
				return m
			}
		}
	}
	if len(e.coll) > 0 {
		return e.coll[k]
	}
	return nil
}

// register adds m as collective message k (not registered yet).
func (e *Engine) register(k Key, m *Msg) {
	if s := &e.slots[k.Seq%collWindow]; (s.n == 0 || s.seq == k.Seq) && s.n < slotMsgs {
		s.seq = k.Seq
		s.msgs[s.n] = m
		s.n++
		return
	}
	if e.coll == nil {
		e.coll = make(map[Key]*Msg)
	}
	e.coll[k] = m
}

// unregister removes m, registered as k; it reports false (and changes
// nothing) when m is not what is registered as k.
func (e *Engine) unregister(k Key, m *Msg) bool {
	if m == nil {
		return false
	}
	if s := &e.slots[k.Seq%collWindow]; s.n > 0 && s.seq == k.Seq {
		for i, x := range s.msgs[:s.n] {
			if x == m {
				s.n--
				s.msgs[i], s.msgs[s.n] = s.msgs[s.n], nil
				return true
			}
		}
	}
	if len(e.coll) > 0 && e.coll[k] == m {
		delete(e.coll, k)
		return true
	}
	return false
}

// registered returns every registered collective message, in e.scratch
// (valid until the next call).
func (e *Engine) registered() []*Msg {
	all := e.scratch[:0]
	for i := range e.slots {
		s := &e.slots[i]
		all = append(all, s.msgs[:s.n]...)
	}
	for _, m := range e.coll {
		all = append(all, m)
	}
	e.scratch = all
	return all
}

// newColl returns a collective message for k, reusing a released one.
func (e *Engine) newColl(k Key) *Msg {
	m, _ := e.msgs.Get().(*Msg)
	if m == nil {
		return &Msg{key: k, src: k.Src}
	}
	fill, whole, fired := m.Fill, m.FillWhole, m.Fired
	*m = Msg{key: k, src: k.Src, Fill: fill, FillWhole: whole, Fired: fired}
	return m
}

// Key names a collective message.
func (m *Msg) Key() Key { return m.key }

// Release gives back a collective message that nothing refers to any more:
// its receive completed (the waiter read Err), or was withdrawn
// (UnpostColl) with no chunk Filling. It may be called concurrently with
// the engine's other calls (the free list is safe for that), and must be
// called at most once per Msg that PostColl returned.
func (e *Engine) Release(m *Msg) {
	if m != nil {
		e.msgs.Put(m)
	}
}

// Ready returns the completions since the previous call; the slice is
// valid until the next call to Ready.
func (e *Engine) Ready() []Completion {
	r := e.ready
	e.ready, e.spare = e.spare[:0], r
	return r
}

// Arrived reports whether collective message k has arrived (whole or in
// part) with no receive posted for it.
func (e *Engine) Arrived(k Key) bool {
	m := e.lookup(k)
	return m != nil && !m.posted
}

// PostColl makes buf the destination of collective message k. It returns
// the message to wait for (the driver sets its Done), or nil when the
// message had arrived whole and is now in buf; released is the bytes the
// engine held for it. A message that arrived with another length is a
// Mismatch, and nothing is posted.
func (e *Engine) PostColl(k Key, buf []byte) (m *Msg, released int64, mm *Mismatch) {
	m = e.lookup(k)
	if m == nil {
		m = e.newColl(k)
		m.total, m.buf, m.posted = -1, buf, true
		e.register(k, m)
		return m, 0, nil
	}
	if m.total != len(buf) {
		return nil, 0, &Mismatch{Key: k, Sent: m.total, Want: len(buf)}
	}
	off := 0
	for i, ch := range m.chunks {
		copy(buf[off:], ch.p)
		off += len(ch.p)
		e.free(ch)
		m.chunks[i] = chunk{}
	}
	released = m.held
	m.chunks, m.held, m.buf, m.posted = nil, 0, buf, true
	if m.got >= m.total {
		e.unregister(k, m)
		e.Release(m) // arrived whole: no one else refers to it
		return nil, released, nil
	}
	return m, released, nil
}

// UnpostColl withdraws the receive m posted for k, if it is still
// pending. The driver first waits while m is Filling.
func (e *Engine) UnpostColl(k Key, m *Msg) { e.unregister(k, m) }

// DeliverColl takes one chunk of collective message k, whose sender says
// it is total bytes long. A chunk that must be held calls room(its
// length) first and is held only when room says so.
func (e *Engine) DeliverColl(k Key, total int, payload []byte, room func(int64) bool) (Outcome, *Mismatch) {
	return e.deliverColl(k, total, chunk{p: payload}, room)
}

// DeliverCollPooled is DeliverColl for a payload from the driver's pool:
// the engine gives it to Free once it has copied it into its receive
// (at once when the receive is posted, else when PostColl takes it).
func (e *Engine) DeliverCollPooled(k Key, total int, payload []byte, room func(int64) bool) (Outcome, *Mismatch) {
	return e.deliverColl(k, total, chunk{p: payload, pooled: true}, room)
}

// free gives ch to Free if it is the driver's.
func (e *Engine) free(ch chunk) {
	if ch.pooled && e.Free != nil {
		e.Free(ch.p)
	}
}

func (e *Engine) deliverColl(k Key, total int, ch chunk, room func(int64) bool) (Outcome, *Mismatch) {
	payload := ch.p
	m := e.lookup(k)
	if m != nil && m.posted {
		if m.total < 0 {
			if total != len(m.buf) {
				return Mismatched, &Mismatch{Key: k, Sent: total, Want: len(m.buf)}
			}
			m.total = total
		}
		copy(m.buf[m.got:], payload)
		e.free(ch)
		m.got += len(payload)
		if m.got >= m.total {
			e.unregister(k, m)
			e.ready = append(e.ready, Completion{Coll: m})
		}
		return Copied, nil
	}
	n := int64(len(payload))
	if !room(n) {
		return NoRoom, nil
	}
	if m == nil {
		m = e.newColl(k)
		m.total = total
		e.register(k, m)
	}
	m.chunks = append(m.chunks, ch)
	m.held += n
	m.got += len(payload)
	return Buffered, nil
}

// PlaceColl returns the destination of the next size bytes of
// collective message k (total bytes long) when a receive is posted for it
// and can take them, else nil (the chunk then goes through DeliverColl).
// The message is Filling until its write ends.
//
// A chunk that is the whole message (whole: the common case of small
// messages) completes it without another call into the engine: the engine
// forgets m at once (nothing else completes, withdraws or departs it), and
// the driver, after the write, calls m.EndFill and, when the write
// succeeded, fires m.Done. Otherwise the driver calls FilledColl.
func (e *Engine) PlaceColl(k Key, total, size int) (m *Msg, dst []byte, whole bool) {
	m = e.lookup(k)
	if m == nil || !m.posted || m.filling.Load() || (m.total < 0 && total != len(m.buf)) || m.got+size > len(m.buf) {
		return nil, nil, false
	}
	m.total = total
	m.filling.Store(true)
	dst = m.buf[m.got : m.got+size]
	if m.got == 0 && size == total {
		e.unregister(k, m)
		m.got = size
		return m, dst, true
	}
	return m, dst, false
}

// FilledColl ends the write PlaceColl started (not whole): ok when the
// size bytes were written (else the transport failed and the driver fails
// the communicator).
func (e *Engine) FilledColl(k Key, m *Msg, size int, ok bool) {
	m.filling.Store(false)
	if !ok {
		return
	}
	m.got += size
	if m.got >= m.total && e.unregister(k, m) {
		e.ready = append(e.ready, Completion{Coll: m})
	}
}

func matches(r *Recv, src int, tag uint64) bool {
	return (r.Src == AnySource || r.Src == src) && r.Tag == tag
}

// TakeUnexpected matches r with the first unexpected message it takes,
// in arrival order, copying what has arrived into r.Buf; released is the
// bytes the engine held for it. When the message is complete, r completes.
func (e *Engine) TakeUnexpected(r *Recv) (matched bool, released int64) {
	for i, m := range e.unexpected {
		if !matches(r, m.src, m.tag) {
			continue
		}
		e.unexpected = append(e.unexpected[:i], e.unexpected[i+1:]...)
		m.recv, r.msg = r, m
		off := 0
		for i, ch := range m.chunks {
			m.put(off, ch.p)
			off += len(ch.p)
			e.free(ch)
			m.chunks[i] = chunk{}
		}
		released = m.held
		m.chunks, m.held = nil, 0
		if m.complete {
			e.completeRecv(m)
		}
		return true, released
	}
	return false, 0
}

// Post queues r for a message not arrived yet (after TakeUnexpected found
// none).
func (e *Engine) Post(r *Recv) { e.posted = append(e.posted, r) }

// Cancel withdraws r: it will not complete, and no more is written into
// its buffer once the message being written into it (returned; the
// driver waits while it is Filling) is done.
func (e *Engine) Cancel(r *Recv) *Msg {
	for i, p := range e.posted {
		if p == r {
			e.posted = append(e.posted[:i], e.posted[i+1:]...)
			break
		}
	}
	r.cancel = true
	return r.msg
}

// startP2P returns the point-to-point message in progress from src,
// starting it (matched with the first posted receive that takes it, else
// unexpected) when none is.
func (e *Engine) startP2P(src int, tag uint64, total int) *Msg {
	if m := e.cur[src]; m != nil {
		return m
	}
	m := &Msg{src: src, tag: tag, total: total}
	for i, r := range e.posted {
		if matches(r, src, tag) {
			e.posted = append(e.posted[:i], e.posted[i+1:]...)
			m.recv, r.msg = r, m
			break
		}
	}
	if m.recv == nil {
		e.unexpected = append(e.unexpected, m)
	}
	e.cur[src] = m
	return m
}

// DeliverP2P takes one chunk of a point-to-point message from src with
// tag, total bytes long; chunks of one message arrive in order, one
// message per source at a time. A chunk that must be held calls room(its
// length) first and is held only when room says so.
func (e *Engine) DeliverP2P(src int, tag uint64, total int, payload []byte, room func(int64) bool) Outcome {
	return e.deliverP2P(src, tag, total, chunk{p: payload}, room)
}

// DeliverP2PPooled is DeliverP2P for a payload from the driver's pool,
// which the engine gives to Free once it has copied it into its receive.
func (e *Engine) DeliverP2PPooled(src int, tag uint64, total int, payload []byte, room func(int64) bool) Outcome {
	return e.deliverP2P(src, tag, total, chunk{p: payload, pooled: true}, room)
}

func (e *Engine) deliverP2P(src int, tag uint64, total int, ch chunk, room func(int64) bool) Outcome {
	payload := ch.p
	m := e.startP2P(src, tag, total)
	out := Copied
	if m.recv != nil {
		if !m.recv.cancel {
			m.put(m.got, payload)
		}
		e.free(ch)
	} else {
		n := int64(len(payload))
		if !room(n) {
			return NoRoom
		}
		m.chunks = append(m.chunks, ch)
		m.held += n
		out = Buffered
	}
	m.got += len(payload)
	if m.got >= m.total {
		e.cur[src] = nil
		if m.recv != nil {
			e.completeRecv(m)
		} else {
			m.complete = true
		}
	}
	return out
}

// put writes src at offset off of its receive's buffer, as much of it as
// fits, through the receive's Put where it has one.
func (m *Msg) put(off int, src []byte) {
	r := m.recv
	if off >= len(r.Buf) {
		return
	}
	if r.Put == nil {
		copy(r.Buf[off:], src)
		return
	}
	n := min(len(src), len(r.Buf)-off)
	if m.putErr == nil && n > 0 {
		m.putErr = r.Put(r.Buf[off:off+n], src[:n])
	}
}

// mayPlace says whether the transport may write r's buffer itself for a
// message from src.
func mayPlace(r *Recv, src int, putOK func(int) bool) bool {
	return r.Put == nil || (putOK != nil && putOK(src))
}

// PlaceP2P returns the destination of the next size bytes of the
// point-to-point message from src (tag, total bytes long) when it is, or
// as its first chunk can be, matched with a receive whose buffer holds it
// whole and that the transport may write (a receive with Put only where
// putOK(src) says the transport writes its memory itself); else nil (the
// chunk then goes through DeliverP2P). The message is Filling until the
// driver calls FilledP2P.
func (e *Engine) PlaceP2P(src int, tag uint64, total, size int, putOK func(src int) bool) (*Msg, []byte) {
	m := e.cur[src]
	if m == nil {
		ri := -1
		for i, p := range e.posted {
			if matches(p, src, tag) {
				ri = i
				break
			}
		}
		if ri < 0 || total > len(e.posted[ri].Buf) || !mayPlace(e.posted[ri], src, putOK) {
			return nil, nil // unexpected, truncated, or not for the transport to write: DeliverP2P's path
		}
		r := e.posted[ri]
		e.posted = append(e.posted[:ri], e.posted[ri+1:]...)
		m = &Msg{src: src, tag: tag, total: total, recv: r}
		r.msg = m
		e.cur[src] = m
	}
	if m.recv == nil || m.recv.cancel || m.filling.Load() || m.got+size > len(m.recv.Buf) || !mayPlace(m.recv, src, putOK) {
		return nil, nil
	}
	m.filling.Store(true)
	return m, m.recv.Buf[m.got : m.got+size]
}

// FilledP2P ends the write PlaceP2P started (see FilledColl).
func (e *Engine) FilledP2P(src int, m *Msg, size int, ok bool) {
	m.filling.Store(false)
	if !ok {
		return
	}
	m.got += size
	if m.got >= m.total {
		if e.cur[src] == m {
			e.cur[src] = nil
		}
		e.completeRecv(m)
	}
}

func (e *Engine) completeRecv(m *Msg) {
	r := m.recv
	if r.cancel {
		return
	}
	e.ready = append(e.ready, Completion{Recv: r, Source: m.src, Tag: m.tag,
		Count: min(m.total, len(r.Buf)), Total: m.total, Err: m.putErr})
}

// Depart records that rank src left after completing every collective
// before limit: posted collective receives from src, or of a call from
// limit on, complete with err; so do the receives posted for src and the
// one its message in progress was matched with. Messages held for such
// calls, or cut short, are dropped; released is their bytes.
func (e *Engine) Depart(src int, limit uint64, err error) (released int64) {
	for _, m := range e.registered() {
		k := m.key
		if k.Src != src && k.Seq < limit {
			continue
		}
		switch {
		case m.posted:
			m.Err = err
			e.unregister(k, m)
			e.ready = append(e.ready, Completion{Coll: m, Err: err})
		case k.Seq >= limit || m.got < m.total:
			released += m.held
			e.unregister(k, m)
		}
	}
	clear(e.scratch)
	kept := e.posted[:0]
	for _, p := range e.posted {
		if p.Src == src {
			e.ready = append(e.ready, Completion{Recv: p, Err: err})
		} else {
			kept = append(kept, p)
		}
	}
	clear(e.posted[len(kept):])
	e.posted = kept
	if m := e.cur[src]; m != nil { // cut short: it can never complete
		e.cur[src] = nil
		if m.recv != nil {
			if !m.recv.cancel {
				e.ready = append(e.ready, Completion{Recv: m.recv, Err: err})
			}
		} else {
			e.dropUnexpected(m)
			released += m.held
		}
	}
	return released
}

func (e *Engine) dropUnexpected(m *Msg) {
	for i, u := range e.unexpected {
		if u == m {
			e.unexpected = append(e.unexpected[:i], e.unexpected[i+1:]...)
			return
		}
	}
}

// Drop empties the engine (the communicator is destroyed): nothing
// pending completes. It returns the bytes it held.
func (e *Engine) Drop() (held int64) {
	for _, m := range e.registered() {
		held += m.held
	}
	clear(e.scratch)
	for _, m := range e.unexpected { // a partial one is also in cur
		held += m.held
	}
	clear(e.coll)
	clear(e.slots[:])
	e.posted, e.unexpected, e.ready = nil, nil, e.ready[:0]
	clear(e.cur)
	return held
}
