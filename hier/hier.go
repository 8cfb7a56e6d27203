// Package hier is the hierarchical device communicator: collectives on CUDA
// device memory (allreduce, broadcast, allgather, reduce-scatter) with NCCL
// among the ranks of one host and nexar between hosts.
//
// A Comm sits over a core.Comm (its parent). New, collective over the
// parent, finds which ranks share a host (Layout: hosts of any sizes, ranks
// in any placement), splits the parent into a communicator per host and
// one per piece (Layout), and makes an NCCL communicator per host. An
// allreduce is then: NCCL reduces each piece of the buffer onto the local
// rank that owns it; every local rank carries its pieces between hosts (a
// nexar allreduce within the piece's group, staged through pinned memory by
// hw/cuda/stage); NCCL spreads the pieces over the host again. Broadcast,
// allgather and reduce-scatter follow the same pattern (coll.go). With one
// host the call is NCCL's own.
//
// Failures: before NCCL is given a call, the ranks of a host compare the
// call (kind, type, op, root, count) over nexar, so that a mismatch fails
// every rank instead of hanging NCCL. While NCCL work is in flight a
// watcher checks the parent communicator and NCCL's asynchronous error;
// when the parent has failed (a peer found dead by nexar's detector, an
// abort), when NCCL reports an error or when work runs past the parent's
// Timeout, NCCL is aborted (ncclCommAbort) so that nothing waits on it, and
// the call fails with the parent's error, which names the rank. A failed
// call fails the parent (as any failed collective does).
//
// A Comm is safe for concurrent use; its calls run one at a time, in the
// order they take its lock, which must be the same on every rank (as for a
// core.Comm's collectives).
package hier

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
	"github.com/nexar-go/nexar/internal/hostid"
)

// Mode is whether device collectives use NCCL (NEXAR_NCCL_HIER).
type Mode int

const (
	// Auto uses NCCL when every rank can load it and some host holds
	// several ranks; otherwise device buffers are staged as before.
	Auto Mode = iota
	// On uses NCCL; setting up fails, naming the ranks, where a rank
	// cannot.
	On
	// Off never uses NCCL.
	Off
)

func (m Mode) String() string {
	switch m {
	case Auto:
		return "auto"
	case On:
		return "on"
	case Off:
		return "off"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// ParseMode reads NEXAR_NCCL_HIER's value: auto (also empty), on or off.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "auto":
		return Auto, nil
	case "on":
		return On, nil
	case "off":
		return Off, nil
	}
	return Auto, fmt.Errorf("hier: NEXAR_NCCL_HIER=%q: want auto, on or off", s)
}

// Runtime is what a Comm needs of the CUDA runtime; *cuda.Runtime has it.
type Runtime interface {
	stage.Runtime
	Malloc(n int) (cuda.DevicePtr, error)
	Free(p cuda.DevicePtr) error
}

// Deps are what this process has for device collectives.
type Deps struct {
	Runtime Runtime
	Stager  *stage.Stager // staging over Runtime
	NCCL    *nccl.Library
	// Unusable says why this process cannot use NCCL; empty when Runtime,
	// Stager and NCCL are all there.
	Unusable string
}

// Options configure New.
type Options struct {
	Mode Mode
	// HostID is this process's host identity: ranks with equal ids share
	// NCCL. Default: internal/hostid.Local, the id transport/bulk uses
	// (machine, boot, host name, network namespace).
	HostID string
	// Device is the CUDA device of this rank's buffers; NCCL is bound to it.
	Device int
	// Timeout bounds each wait for NCCL work and for NCCL's setup (default:
	// the parent's Timeout).
	Timeout time.Duration
}

// pollEvery is how often the watcher looks at the parent, NCCL's
// asynchronous error and the work in flight while there is any.
const pollEvery = time.Millisecond

// asyncGrace is how long an NCCL asynchronous error (a peer on this host
// aborted its NCCL) waits for nexar to name the failure before the call
// fails with NCCL's message alone.
const asyncGrace = 2 * time.Second

// errAborted ends a phase that found NCCL aborted: the call then reports the
// parent's failure.
var errAborted = errors.New("hier: NCCL was aborted")

// errDiffer is the cause of the mismatch agree reports: an error about the
// parent's ranks already, which fails the parent as it is.
var errDiffer = errors.New("hier: the ranks of a host made different calls")

// Comm is the hierarchical communicator over a parent core.Comm. See the
// package doc.
type Comm struct {
	parent  *core.Comm
	lay     Layout
	rank    int
	host    int // this rank's host
	li      int // its local index
	active  bool
	reason  string // why not active
	timeout time.Duration

	local *core.Comm   // the ranks of this host
	cross []*core.Comm // by piece: its cross-host group, where this rank owns it and there are several hosts
	rt    Runtime
	st    *stage.Stager
	lib   *nccl.Library
	dev   int

	mu      sync.Mutex // one call at a time; the scratch buffers
	scratch cuda.DevicePtr
	scrLen  int
	retired []cuda.DevicePtr // scratch outgrown, freed at Close

	nmu  sync.Mutex // enqueueing on nc, and aborting it
	nc   *nccl.Comm
	dead atomic.Bool // nc was aborted: nothing more goes to it

	failed atomic.Bool // fail has run

	p2p p2pState // point-to-point calls through NCCL (p2p.go)

	// The crossing between hosts by GPUDirect RDMA, per piece's group
	// (gpudirect.go's Directs, keyed by piece), with the runtime they copy
	// through; and how many pieces crossed each way, for Crossings.
	gd                       Directs
	gpu                      *cuda.Runtime
	crossDirect, crossStaged atomic.Int64

	wmu     sync.Mutex // the watcher's state
	busy    int        // calls in progress
	pending []pending  // NCCL work enqueued and not known complete
	events  []cuda.Event
	nerr    error // NCCL's asynchronous error, once seen
	nerrAt  time.Time
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	closed  sync.Once
}

// pending is NCCL work of a call: complete once ev is.
type pending struct {
	ev    cuda.Event
	since time.Time
	op    string
}

// New sets up the hierarchy over parent. It is collective over parent: every
// rank calls it at the same point of its sequence of collectives, with the
// same Mode. It decides on every rank alike whether NCCL is used (Active):
// under Auto not when a rank cannot use NCCL or no host holds two ranks
// (Reason says why); under On those fail. Every wait is bounded by ctx and
// Options.Timeout; an NCCL setup that never returns (a local peer died in
// it) is left behind on its thread.
func New(ctx context.Context, parent *core.Comm, d Deps, opt Options) (*Comm, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = parent.Timeout()
	}
	if opt.HostID == "" {
		opt.HostID = hostid.Local()
	}
	gpu, _ := d.Runtime.(*cuda.Runtime) // GPUDirect crossings copy through a *cuda.Runtime (Direct)
	h := &Comm{parent: parent, rank: parent.Rank(), timeout: opt.Timeout, rt: d.Runtime, st: d.Stager, gpu: gpu,
		lib: d.NCCL, dev: opt.Device}
	if opt.Mode == Off {
		h.reason = "NEXAR_NCCL_HIER=off"
		return h, nil
	}
	usable := d.Unusable == "" && d.Runtime != nil && d.Stager != nil && d.NCCL != nil
	why := d.Unusable
	if !usable && why == "" {
		why = "no CUDA runtime, stager or NCCL given"
	}

	// Who is where, and who can use NCCL.
	const rec = sha256.Size + 1
	mine := make([]byte, rec)
	sum := sha256.Sum256([]byte(opt.HostID))
	copy(mine, sum[:])
	if usable {
		mine[sha256.Size] = 1
	}
	all := make([]byte, rec*parent.Size())
	if err := parent.Allgather(ctx, mine, all, collective.Uint8); err != nil {
		return nil, err
	}
	keys := make([]string, parent.Size())
	var missing []int
	for r := range keys {
		keys[r] = string(all[r*rec : r*rec+sha256.Size])
		if all[r*rec+sha256.Size] == 0 {
			missing = append(missing, r)
		}
	}
	h.lay = NewLayout(keys)
	h.host, h.li = h.lay.HostOf[h.rank], h.lay.LocalOf[h.rank]
	if len(missing) > 0 {
		msg := fmt.Sprintf("rank(s) %v cannot use NCCL", missing)
		if !usable {
			msg += fmt.Sprintf(" (this rank, %d: %s)", h.rank, why)
		}
		if opt.Mode == On {
			return nil, &core.Error{Code: core.CodeUnavailable, Op: "nccl_setup", Rank: missing[0],
				Msg: "NEXAR_NCCL_HIER=on but " + msg}
		}
		h.reason = msg
		return h, nil
	}
	if opt.Mode == Auto && h.lay.Pieces == 1 {
		h.reason = "every host holds one rank: NCCL has nothing to do within a host"
		return h, nil
	}

	// The communicators: this host's ranks, and each piece's group.
	var err error
	if h.local, err = parent.Split(ctx, h.host, h.rank); err != nil {
		return nil, err
	}
	if len(h.lay.Hosts) > 1 {
		h.cross = make([]*core.Comm, h.lay.Pieces)
		for p := range h.cross {
			color := -1
			if h.lay.Owner(h.host, p) == h.li {
				color = 0
			}
			if h.cross[p], err = parent.Split(ctx, color, h.host); err != nil {
				h.closeComms()
				return nil, err
			}
		}
	}

	// NCCL within the host, then every rank says whether it has it.
	initErr := h.initNCCL(ctx)
	ok := []byte{1}
	if initErr != nil {
		ok[0] = 0
	}
	oks := make([]byte, parent.Size())
	if err := parent.Allgather(ctx, ok, oks, collective.Uint8); err != nil {
		h.teardown()
		return nil, err
	}
	var bad []int
	for r, v := range oks {
		if v == 0 {
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		h.teardown()
		msg := fmt.Sprintf("NCCL setup failed on rank(s) %v", bad)
		if initErr != nil {
			msg += fmt.Sprintf(" (this rank, %d: %v)", h.rank, initErr)
		}
		if opt.Mode == On {
			return nil, &core.Error{Code: core.CodeUnavailable, Op: "nccl_setup", Rank: bad[0], Msg: msg, Cause: initErr}
		}
		h.reason = msg
		return h, nil
	}
	h.active = true
	h.wake = make(chan struct{}, 1)
	h.stop = make(chan struct{})
	h.done = make(chan struct{})
	go h.watch()
	return h, nil
}

// initNCCL makes this host's NCCL communicator: local rank 0 makes the id,
// the host's ranks receive it over nexar, and each joins on its device.
func (h *Comm) initNCCL(ctx context.Context) error {
	id := make([]byte, 1+len(nccl.UniqueID{}))
	var idErr error
	if h.li == 0 {
		var u nccl.UniqueID
		if u, idErr = h.lib.NewUniqueID(); idErr == nil {
			id[0] = 1
			copy(id[1:], u[:])
		}
	}
	if err := h.local.Broadcast(ctx, id, collective.Uint8, 0); err != nil {
		return err
	}
	if id[0] == 0 {
		if idErr != nil {
			return idErr
		}
		return fmt.Errorf("hier: rank %d could not make this host's NCCL id", h.lay.Hosts[h.host][0])
	}
	var u nccl.UniqueID
	copy(u[:], id[1:])
	res := make(chan initResult, 1)
	L := len(h.lay.Hosts[h.host])
	go func() {
		// NCCL binds the communicator to the calling thread's device.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if prev, err := h.rt.GetDevice(); err == nil && prev != h.dev {
			if err := h.rt.SetDevice(h.dev); err != nil {
				res <- initResult{nil, fmt.Errorf("hier: cudaSetDevice(%d): %w", h.dev, err)}
				return
			}
			defer h.rt.SetDevice(prev)
		}
		c, err := h.lib.NewComm(u, L, h.li)
		res <- initResult{c, err}
	}()
	timer := time.NewTimer(h.timeout)
	defer timer.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-res:
			h.nc = r.c
			return r.err
		case <-ctx.Done():
			abandon(res)
			return ctx.Err()
		case <-timer.C:
			abandon(res)
			return fmt.Errorf("hier: ncclCommInitRank did not return within %v", h.timeout)
		case <-tick.C:
			if err := h.parent.Err(); err != nil {
				abandon(res)
				return err
			}
		}
	}
}

type initResult struct {
	c   *nccl.Comm
	err error
}

// abandon aborts the communicator of an NCCL setup given up on, should it
// ever return one.
func abandon(res chan initResult) {
	go func() {
		if r := <-res; r.c != nil {
			r.c.Abort()
		}
	}()
}

// Active reports whether device collectives go through NCCL.
func (h *Comm) Active() bool { return h.active }

// Reason says why the Comm is not active.
func (h *Comm) Reason() string { return h.reason }

// Crossings reports how many pieces of allreduce calls this rank carried
// between hosts by GPUDirect RDMA (the NIC reading and writing the device
// buffer) and how many it staged through pinned host memory. Safe for
// concurrent use.
func (h *Comm) Crossings() (direct, staged int64) {
	return h.crossDirect.Load(), h.crossStaged.Load()
}

// Device is the CUDA device NCCL is bound to (Options.Device).
func (h *Comm) Device() int { return h.dev }

// Size is the parent's size.
func (h *Comm) Size() int { return h.parent.Size() }

// Layout is where the parent's ranks live.
func (h *Comm) Layout() Layout { return h.lay }

// begin starts a call of op: one at a time, watched.
func (h *Comm) begin(op string) error {
	if !h.active {
		return fmt.Errorf("hier: %s: not active: %s", op, h.reason)
	}
	h.mu.Lock()
	if err := h.parent.Err(); err != nil {
		h.mu.Unlock()
		return relabel(err, op)
	}
	h.wmu.Lock()
	h.busy++
	h.wmu.Unlock()
	h.poke()
	return nil
}

func (h *Comm) end() {
	h.wmu.Lock()
	h.busy--
	h.wmu.Unlock()
	h.mu.Unlock()
}

// scratchOf returns device scratch of n bytes for a call (h.mu held). An
// outgrown buffer is kept until Close: work still queued may use it.
func (h *Comm) scratchOf(n int) (cuda.DevicePtr, error) {
	if n <= h.scrLen {
		return h.scratch, nil
	}
	p, err := h.rt.Malloc(n)
	if err != nil {
		return 0, fmt.Errorf("hier: cudaMalloc(%d) for scratch: %w", n, err)
	}
	if h.scratch != 0 {
		h.retired = append(h.retired, h.scratch)
	}
	h.scratch, h.scrLen = p, n
	return p, nil
}

// Close releases the Comm (not collective): NCCL is destroyed once its work
// has completed, or aborted if the parent failed or work is still pending
// past the timeout; its communicators are closed. The parent stays open.
func (h *Comm) Close() error {
	h.closed.Do(func() {
		if !h.active {
			return
		}
		h.mu.Lock() // no call in progress
		defer h.mu.Unlock()
		// The watcher still runs: a failure or the timeout aborts NCCL,
		// which completes the work.
		for h.hasPending() && h.parent.Err() == nil && !h.dead.Load() {
			time.Sleep(pollEvery)
		}
		close(h.stop)
		<-h.done
		if h.hasPending() || h.parent.Err() != nil {
			h.abortNCCL()
		}
		h.teardown()
		for _, ev := range h.events {
			h.rt.EventDestroy(ev)
		}
		h.events = nil
		for _, p := range append(h.retired, h.scratch) {
			if p != 0 {
				h.rt.Free(p)
			}
		}
		h.retired, h.scratch, h.scrLen = nil, 0, 0
	})
	return nil
}

func (h *Comm) hasPending() bool {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.reapLocked(time.Now())
	return len(h.pending) > 0
}

// reapLocked drops completed work from h.pending (h.wmu held), and returns
// the work that has run past the timeout, if any.
func (h *Comm) reapLocked(now time.Time) *pending {
	var late *pending
	keep := h.pending[:0]
	for _, p := range h.pending {
		if done, err := h.rt.EventQuery(p.ev); err == nil && done {
			h.events = append(h.events, p.ev)
			continue
		}
		if late == nil && now.Sub(p.since) > h.timeout {
			late = &pending{since: p.since, op: p.op}
		}
		keep = append(keep, p)
	}
	h.pending = keep
	return late
}

// teardown destroys NCCL (or aborts it when it was already given up on)
// and closes the Comm's communicators.
func (h *Comm) teardown() {
	if h.nc != nil && h.dead.CompareAndSwap(false, true) {
		h.nc.Close()
	}
	h.closeComms()
}

func (h *Comm) closeComms() {
	for pc := range h.cross {
		h.gd.Release(pc)
	}
	if h.local != nil {
		h.local.Close()
	}
	for _, c := range h.cross {
		if c != nil {
			c.Close()
		}
	}
}
