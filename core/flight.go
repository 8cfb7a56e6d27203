package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// This file is the flight recorder (docs/diagnostics.md): every
// communicator keeps its last Config.FlightRecorderSize operations in a
// fixed ring, written at the start and at the end of each call (startColl,
// isend, irecv; Request.finish), and dumps it as JSON on an operation's
// timeout, on SIGUSR1 (opt-in) and on request (DumpFlightRecord). The ring
// is allocated once: recording an operation allocates nothing.

// FlightState is the state of a recorded operation.
type FlightState string

// The states of a recorded operation.
const (
	FlightStarted   FlightState = "started"   // called here, not complete
	FlightCompleted FlightState = "completed" // completed successfully
	FlightFailed    FlightState = "failed"    // completed with an error
)

// FlightEntry is one operation in a flight record.
type FlightEntry struct {
	// ID numbers the communicator's recorded operations from 1.
	ID uint64 `json:"id"`
	// Op is the operation: a collective ("allreduce", "barrier", ...),
	// "send" or "recv".
	Op string `json:"op"`
	// Seq is a collective's sequence number on the communicator: the n-th
	// collective every member calls has the same Seq on every rank.
	Seq uint64 `json:"seq"`
	// Call renders a collective as its signature ("allreduce(float32,
	// count=2, sum)"); ranks whose Call at one Seq differ made different
	// calls.
	Call string `json:"call,omitempty"`
	// DType, Count and Bytes describe the data (a collective's count is its
	// signature's: elements per rank, or a total for v-forms).
	DType string `json:"dtype,omitempty"`
	Count uint64 `json:"count"`
	Bytes uint64 `json:"bytes"`
	// Root is a rooted collective's root (communicator rank), else -1.
	Root int `json:"root"`
	// Peer is a send's destination or a receive's source (-1: any source;
	// -2 for collectives); Tag its tag.
	Peer  int         `json:"peer"`
	Tag   uint64      `json:"tag,omitempty"`
	State FlightState `json:"state"`
	// Start is when the call was made; End when it completed (zero while
	// started).
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitzero"`
	// Err is a failed operation's error.
	Err string `json:"error,omitempty"`
}

// FlightRecord is a communicator's flight record: its last operations,
// oldest first, and where it stands.
type FlightRecord struct {
	// Comm is the communicator's id (equal on every member).
	Comm uint64 `json:"comm"`
	// Rank and Size are this rank's place in the communicator; World maps
	// communicator ranks to world ranks.
	Rank  int    `json:"rank"`
	Size  int    `json:"size"`
	World []int  `json:"world"`
	Host  string `json:"host"`
	PID   int    `json:"pid"`
	// Time is when the record was taken; Reason why ("request",
	// "timeout", "signal", "closed", "failed: ...").
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"`
	// NextSeq is the sequence number of this rank's next collective: it
	// has called every collective before it and none from it on.
	NextSeq uint64 `json:"next_seq"`
	// Recorded is how many operations were recorded in all (the ring keeps
	// the last len(Entries) of them).
	Recorded uint64 `json:"recorded"`
	// Final is set in the record a communicator writes when it closes or
	// fails: it no longer dumps on SIGUSR1.
	Final   bool          `json:"final,omitempty"`
	Entries []FlightEntry `json:"entries"`
}

// p2p kinds in a flight slot (collectives use their collKind).
const (
	flightSend uint8 = 1
	flightRecv uint8 = 2
)

// flightSlot is one ring entry: plain values, nothing to allocate.
type flightSlot struct {
	id    uint64 // FlightEntry.ID; 0: empty
	seq   uint64
	sig   signature // collectives (sig.kind != collNone)
	p2p   uint8     // flightSend, flightRecv
	peer  int
	tag   uint64
	bytes uint64
	state FlightState
	start int64 // ns after the recorder's epoch
	end   int64 // likewise; 0: not ended
	err   error
}

// flightRecorder is one communicator's ring. mu is a leaf lock: taken with
// or without Comm.mu, and nothing is taken while holding it.
type flightRecorder struct {
	// log takes one record per operation started and ended when
	// NEXAR_DEBUG=TRACE selects COLL (traceColl) or P2P (traceP2P).
	log                 *slog.Logger
	traceColl, traceP2P bool

	// epoch anchors the slots' times: one monotonic reading per
	// timestamp instead of time.Now's two (a clock read costs 20-40 ns
	// on a VM, an 8 B collective about a microsecond).
	epoch time.Time

	mu       sync.Mutex
	slots    []flightSlot
	recorded uint64
	nextSeq  uint64
	lastDump time.Time // of a timeout's dump (at most one a second)
}

// newFlightRecorder returns the recorder of communicator id on rank: a
// ring of cfg.FlightRecorderSize entries, or nil (recording off) when that
// is not positive.
func newFlightRecorder(cfg Config, log *slog.Logger, id uint64, rank int) *flightRecorder {
	if cfg.FlightRecorderSize <= 0 {
		return nil
	}
	f := &flightRecorder{slots: make([]flightSlot, cfg.FlightRecorderSize), epoch: time.Now()}
	// Touch every page now. Memory fresh from the OS is zero without being
	// written, so the ring's pages would fault in one by one as calls fill
	// them: 2-7 µs added to every 32nd call of the first thousand.
	clear(f.slots)
	if f.traceColl, f.traceP2P = traceOn(log, SubsysColl), traceOn(log, SubsysP2P); f.traceColl || f.traceP2P {
		f.log = log.With("comm", id, "rank", rank)
	}
	return f
}

// trace logs s (a copy) at LevelTrace.
func (f *flightRecorder) trace(s flightSlot, what string) {
	if s.p2p != 0 {
		op := "send"
		if s.p2p == flightRecv {
			op = "recv"
		}
		f.log.Log(context.Background(), LevelTrace, "nexar: "+op+" "+what, "subsys", SubsysP2P,
			"peer", s.peer, "tag", s.tag, "bytes", s.bytes, "state", string(s.state), "err", s.err)
		return
	}
	f.log.Log(context.Background(), LevelTrace, "nexar: collective "+what, "subsys", SubsysColl,
		"seq", s.seq, "call", s.sig.String(), "state", string(s.state), "err", s.err)
}

// startColl records collective seq, called at now; it returns the entry's
// id for end.
func (f *flightRecorder) startColl(seq uint64, sig signature, now time.Time) uint64 {
	if f == nil {
		return 0
	}
	at := f.since(now)
	f.mu.Lock()
	f.recorded++
	id := f.recorded
	f.nextSeq = seq + 1
	f.slots[id%uint64(len(f.slots))] = flightSlot{id: id, seq: seq, sig: sig, peer: -2, state: FlightStarted, start: at}
	f.mu.Unlock()
	if f.traceColl {
		f.trace(flightSlot{seq: seq, sig: sig, state: FlightStarted}, "started")
	}
	return id
}

// since is t in ns after the epoch, at least 1 (0 marks a time not
// taken); t must carry a monotonic reading (time.Now's does).
func (f *flightRecorder) since(t time.Time) int64 { return max(1, int64(t.Sub(f.epoch))) }

// sinceNow is since(time.Now()) with one monotonic clock reading.
func (f *flightRecorder) sinceNow() int64 { return max(1, int64(time.Since(f.epoch))) }

// at is the wall time of a slot's time, without its monotonic reading.
func (f *flightRecorder) at(ns int64) time.Time { return f.epoch.Add(time.Duration(ns)).Round(0) }

// startP2P records a send (to peer) or receive (from peer).
func (f *flightRecorder) startP2P(kind uint8, peer int, tag uint64, n int) uint64 {
	if f == nil {
		return 0
	}
	at := f.sinceNow()
	f.mu.Lock()
	f.recorded++
	id := f.recorded
	f.slots[id%uint64(len(f.slots))] = flightSlot{id: id, p2p: kind, peer: peer, tag: tag, bytes: uint64(n),
		sig: signature{root: -1}, state: FlightStarted, start: at}
	f.mu.Unlock()
	if f.traceP2P {
		f.trace(flightSlot{p2p: kind, peer: peer, tag: tag, bytes: uint64(n), state: FlightStarted}, "started")
	}
	return id
}

// end records the completion of entry id (if the ring still holds it).
func (f *flightRecorder) end(id uint64, err error) {
	if f == nil || id == 0 {
		return
	}
	at := f.sinceNow()
	var done flightSlot
	f.mu.Lock()
	if s := &f.slots[id%uint64(len(f.slots))]; s.id == id {
		s.end = at
		if err == nil {
			s.state = FlightCompleted
		} else {
			s.state, s.err = FlightFailed, err
		}
		if f.log != nil {
			done = *s
		}
	}
	f.mu.Unlock()
	if done.id != 0 && (done.p2p != 0 && f.traceP2P || done.p2p == 0 && f.traceColl) {
		f.trace(done, "ended")
	}
}

// entries returns the ring's entries, oldest first, and the counters.
func (f *flightRecorder) entries() (out []FlightEntry, nextSeq, recorded uint64) {
	if f == nil {
		return nil, 0, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := uint64(len(f.slots))
	first := uint64(1)
	if f.recorded > n {
		first = f.recorded - n + 1
	}
	out = make([]FlightEntry, 0, f.recorded-first+1)
	for id := first; id <= f.recorded; id++ {
		s := &f.slots[id%n]
		if s.id != id {
			continue
		}
		e := FlightEntry{ID: s.id, Peer: s.peer, Root: -1, State: s.state, Start: f.at(s.start)}
		if s.end != 0 {
			e.End = f.at(s.end)
		}
		if s.err != nil {
			e.Err = s.err.Error()
		}
		switch s.p2p {
		case flightSend, flightRecv:
			e.Op = "send"
			if s.p2p == flightRecv {
				e.Op = "recv"
			}
			e.Tag, e.Bytes, e.Count = s.tag, s.bytes, s.bytes
		default:
			e.Op, e.Seq, e.Call, e.Root = s.sig.kind.String(), s.seq, s.sig.String(), s.sig.root
			if s.sig.count != noCount {
				e.Count = s.sig.count
			}
			if s.sig.kind.hasDType() {
				e.DType = s.sig.dt.String()
				if s.sig.count != noCount {
					e.Bytes = s.sig.count * uint64(max(s.sig.dt.Size(), 1))
				}
			}
		}
		out = append(out, e)
	}
	return out, f.nextSeq, f.recorded
}

// FlightRecord returns a snapshot of c's flight record (reason "request").
// With the recorder off (Config.FlightRecorderSize < 0) it has no entries.
func (c *Comm) FlightRecord() FlightRecord {
	return c.flightRecord("request")
}

func (c *Comm) flightRecord(reason string) FlightRecord {
	host, _ := os.Hostname()
	r := FlightRecord{Comm: c.id, Rank: c.rank, Size: c.size, World: append([]int(nil), c.world...),
		Host: host, PID: os.Getpid(), Time: time.Now(), Reason: reason}
	r.Entries, r.NextSeq, r.Recorded = c.flight.entries()
	if r.Entries == nil {
		r.Entries = []FlightEntry{}
	}
	return r
}

// DumpFlightRecord writes c's flight record as JSON to path (replacing it
// whole: written beside it, then renamed).
func (c *Comm) DumpFlightRecord(path string) error {
	return writeFlightRecord(path, c.flightRecord("request"))
}

func writeFlightRecord(path string, r FlightRecord) error {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("core: flight record: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("core: flight record: %w", err)
	}
	return nil
}

// FlightRecordFile is the name of the file in Config.FlightRecorderDir
// that the communicator with id comm on world rank worldRank dumps to.
func FlightRecordFile(worldRank int, comm uint64) string {
	return fmt.Sprintf("nexar-flight-r%d-c%x.json", worldRank, comm)
}

// dumpFlight writes c's record into Config.FlightRecorderDir (if set) and
// logs where; it takes no lock of c but the recorder's.
func (c *Comm) dumpFlight(reason string, final bool) {
	dir := c.cfg.FlightRecorderDir
	if dir == "" || c.flight == nil {
		return
	}
	r := c.flightRecord(reason)
	r.Final = final
	path := filepath.Join(dir, FlightRecordFile(c.world[c.rank], c.id))
	if err := writeFlightRecord(path, r); err != nil {
		c.n.log.Warn("nexar: flight record not written", "subsys", SubsysFlight, "comm", c.id, "rank", c.rank, "err", err)
		return
	}
	level := slog.LevelDebug // asked for (a signal) or routine
	if strings.HasPrefix(reason, "timeout") {
		level = slog.LevelWarn
	}
	c.n.log.Log(context.Background(), level, "nexar: flight record written", "subsys", SubsysFlight, "comm", c.id, "rank", c.rank,
		"reason", reason, "path", path)
}

// flightEnd records the end of a request's operation; an operation that
// timed out dumps the record (at most once a second per communicator).
func (c *Comm) flightEnd(id uint64, err error) {
	f := c.flight
	f.end(id, err)
	if err == nil || c.cfg.FlightRecorderDir == "" {
		return
	}
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeTimeout {
		return
	}
	now := time.Now()
	f.mu.Lock()
	due := now.Sub(f.lastDump) >= time.Second
	if due {
		f.lastDump = now
	}
	f.mu.Unlock()
	if due {
		c.dumpFlight("timeout: "+e.Op, false)
	}
}

// startFlight starts c's recorder's signal watcher when
// Config.FlightDumpOnSignal is set: each SIGUSR1 dumps the record into
// Config.FlightRecorderDir, until c fails or closes, when it writes a last
// record (Final) and stops listening. The watcher counts in c.bg.
func (c *Comm) startFlight() {
	if !c.cfg.FlightDumpOnSignal || c.cfg.FlightRecorderDir == "" || c.flight == nil {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer signal.Stop(sig)
		c.dumpFlight("start", false) // the file says: this rank listens
		for {
			select {
			case <-sig:
				c.dumpFlight("signal", false)
			case <-c.ctx.Done():
				reason := "closed"
				if err := c.Err(); err != nil && CodeOf(err) != CodeClosed {
					reason = "failed: " + err.Error()
				}
				c.dumpFlight(reason, true)
				return
			}
		}
	}()
}
