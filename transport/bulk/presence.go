package bulk

import (
	"sync"
	"sync/atomic"

	"github.com/nexar-go/nexar/internal/sched"
	"github.com/nexar-go/nexar/transport"
)

// This file is how a rank tells the ranks that send to it over shared
// memory whether it is running: its presence, a word in the header of
// every ring it reads (offConsPresence), which a sender reads from its
// side of the same ring (Endpoint.PeerPresence). Core spins on a peer that
// is seen polling (its beat advances: it is on a CPU and about to answer)
// and yields or sleeps sooner when it is not (preempted, asleep, or busy
// outside the library), instead of spinning blind for a fixed window.
//
// The word is a hint for that choice only, never for correctness: a
// process with several waiting goroutines publishes whichever moved last.
//
// Layout: bits 0-7 the state, bits 8-23 the CPU the publishing thread ran
// on plus one (0: unknown, internal/sched), bits 24-55 the beat, a counter
// bumped every pollsPerBeat polls and at every change of state. The state is
// presPolling while a goroutine of this process polls for data (from
// StartPolling to its stop: it is inside a call), presAsleep while one
// sleeps in Await, and 0 when none does (the rank runs its own code).

const (
	presPolling = 1
	presAsleep  = 2
	// pollsPerBeat is how many polls of a ring make a beat: a few
	// microseconds of spinning, so that a sender that reads the word every
	// microsecond or so sees it move while this rank spins.
	pollsPerBeat = 16
)

// presence publishes this process's presence in the rings it reads. Safe
// for concurrent use.
type presence struct {
	rings   atomic.Pointer[[]*ring] // the rings this process reads
	beat    atomic.Uint32
	pollers atomic.Int32 // polling sessions open (StartPolling to stop)
	// crowded: this rank shares its cores with more ranks than they
	// number (Endpoint.oversubscribed), where TCP read loops step aside
	// while it polls (channel.aside).
	crowded atomic.Bool
	mu      sync.Mutex // serialises add and clear
}

// enter and leave bracket a polling session: the first one in publishes
// presPolling, the last one out 0.
func (p *presence) enter() {
	if p.pollers.Add(1) == 1 {
		p.publish(presPolling)
	}
}

func (p *presence) leave() {
	if p.pollers.Add(-1) == 0 {
		p.publish(0)
	}
}

// add makes r, a ring this process reads, carry its presence.
func (p *presence) add(r *ring) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rs []*ring
	if old := p.rings.Load(); old != nil {
		rs = append(rs, *old...)
	}
	rs = append(rs, r)
	p.rings.Store(&rs)
	r.pres = p
}

// clear stops publishing (the rings are about to be unmapped); called
// when no poll or await can run any more.
func (p *presence) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rings.Store(nil)
}

// publish writes state with a new beat into every ring.
func (p *presence) publish(state uint64) {
	rs := p.rings.Load()
	if rs == nil {
		return
	}
	v := state | uint64(uint16(sched.CPU()+1))<<8 | uint64(p.beat.Add(1))<<24
	for _, r := range *rs {
		r.setPresence(v)
	}
}

// PeerPresence reads what peer last published of its presence
// (transport.DataPath): ok is false when its data does not come over a
// shared-memory ring, or it published nothing yet.
func (e *Endpoint) PeerPresence(peer int) (transport.Presence, bool) {
	if peer < 0 || peer >= e.size {
		return transport.Presence{}, false
	}
	ch := e.out[peer].Load()
	if ch == nil || ch.ring == nil {
		return transport.Presence{}, false
	}
	e.using.Add(1) // as StartPolling: Close does not unmap the ring under it
	var v uint64
	if !e.closed.Load() {
		v = ch.ring.presence()
	}
	e.using.Add(-1)
	if v == 0 {
		return transport.Presence{}, false
	}
	return transport.Presence{Polling: v&presPolling != 0, Asleep: v&presAsleep != 0,
		CPU: int(uint16(v>>8)) - 1, Beat: uint32(v >> 24), InProcess: e.inProc[peer].Load()}, true
}
