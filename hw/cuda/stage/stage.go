// Package stage serves CUDA device buffers to nexar's host collectives and
// point-to-point calls by staging them through page-locked host memory,
// ordered against the caller's CUDA stream by events. Host code never
// dereferences a device pointer: only the CUDA runtime's copies touch
// device memory.
//
// One call (a Call) goes:
//
//  1. Add: each device buffer of the call gets a pinned host buffer from a
//     bounded pool (a buffer is reused only once the copy that last used it
//     has completed, which its own event says).
//  2. Run: an event recorded on the caller's stream (the legacy default
//     stream when none is given) is waited for by the library's stream
//     (one per device, non-blocking), which copies the inputs device to
//     host; the host waits for those copies (polling an event, within
//     Options.WaitTimeout), runs the host collective, and enqueues the
//     outputs' copies host to device on the library stream, then a
//     completion event. Stream-ordered: the caller's stream waits on the
//     completion event and Run returns without waiting for the copies.
//     Blocking: Run waits for the completion event.
//
// So the host is busy for the collective itself in both variants; only the
// final copies back are left to the stream. Device memory from
// cudaMallocManaged is not staged (the host may read it).
//
// A Stager is safe for concurrent use; a Call belongs to one goroutine.
package stage

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"time"

	"github.com/nexar-go/nexar/hw/cuda"
)

// Verified says, for `nexar info`, where staging has been run: kept in step
// with docs/device-memory.md.
const Verified = "device-memory staging (C ABI, torch): tested against the fake CUDA runtime (tests/fakes/cudart) only, not yet run on a GPU"

// Runtime is what staging needs of the CUDA runtime; *cuda.Runtime has it.
type Runtime interface {
	PointerType(p uintptr) (cuda.MemoryType, int, error)
	GetDevice() (int, error)
	SetDevice(dev int) error
	MallocHost(n int) ([]byte, error)
	FreeHost(b []byte) error
	MemcpyAsync(dst, src uintptr, n int, kind cuda.MemcpyKind, s cuda.Stream) error
	StreamCreate() (cuda.Stream, error)
	StreamDestroy(s cuda.Stream) error
	StreamWaitEvent(s cuda.Stream, ev cuda.Event) error
	EventCreate() (cuda.Event, error)
	EventDestroy(ev cuda.Event) error
	EventRecord(ev cuda.Event, s cuda.Stream) error
	EventQuery(ev cuda.Event) (bool, error)
}

// Options bound the stager.
type Options struct {
	// PoolBytes bounds the pinned memory kept and lent at once (default
	// 256 MiB). A call that holds nothing waits (within WaitTimeout) for
	// others to return buffers; once it holds one it takes the rest even
	// past the bound, so that two calls never wait on each other.
	PoolBytes int
	// WaitTimeout bounds each wait for device work: the caller's stream
	// reaching the call, the staging copies, a pool buffer (default 5 min,
	// for kernels queued ahead of the call).
	WaitTimeout time.Duration
}

// ErrTimeout is wrapped by errors of waits that ran past WaitTimeout.
var ErrTimeout = errors.New("stage: device work did not complete in time")

// Stager holds the library streams, events and the pinned pool.
type Stager struct {
	rt  Runtime
	opt Options

	mu      sync.Mutex
	streams map[int]cuda.Stream // the library's stream per device
	events  []cuda.Event        // idle events
	idle    map[int][]*pinned   // returned buffers by size class
	total   int                 // bytes of pinned memory allocated
	lent    int                 // of which lent to calls
	closed  bool
}

// pinned is one pool buffer; ready is recorded on the library stream after
// the last copy that uses the buffer.
type pinned struct {
	buf   []byte
	class int
	ready cuda.Event
	dev   int
}

// New returns a stager over rt.
func New(rt Runtime, opt Options) *Stager {
	if opt.PoolBytes <= 0 {
		opt.PoolBytes = 256 << 20
	}
	if opt.WaitTimeout <= 0 {
		opt.WaitTimeout = 5 * time.Minute
	}
	return &Stager{rt: rt, opt: opt, streams: map[int]cuda.Stream{}, idle: map[int][]*pinned{}}
}

// Device reports whether p is device memory and on which device. Host
// memory (pageable, pinned or managed) is false.
func (s *Stager) Device(p uintptr) (bool, int, error) {
	if p == 0 {
		return false, -1, nil
	}
	t, dev, err := s.rt.PointerType(p)
	if err != nil {
		return false, -1, fmt.Errorf("stage: cudaPointerGetAttributes(%#x): %w", p, err)
	}
	return t.OnDevice(), dev, nil
}

// Buf is one device buffer of a call.
type Buf struct {
	Name    string // the argument's name, for errors
	Ptr     uintptr
	Len     int
	In, Out bool // read by the call (copied in first), written (copied back)
}

// Call is one staged call: its buffers, then Run once (or Release).
type Call struct {
	s     *Stager
	dev   int
	bufs  []Buf
	hosts []*pinned
	done  bool
}

// Begin starts a call.
func (s *Stager) Begin() *Call { return &Call{s: s, dev: -1} }

// Add lends a pinned buffer for b (on device dev) and returns its first
// b.Len bytes, which stand for b in the host call.
func (c *Call) Add(b Buf, dev int) ([]byte, error) {
	if c.dev >= 0 && dev != c.dev {
		return nil, fmt.Errorf("stage: %s is on device %d but the call's other buffers are on device %d", b.Name, dev, c.dev)
	}
	p, err := c.s.acquire(b.Len, dev, len(c.hosts) > 0)
	if err != nil {
		return nil, fmt.Errorf("stage: %s (%d bytes): %w", b.Name, b.Len, err)
	}
	c.dev = dev
	c.bufs = append(c.bufs, b)
	c.hosts = append(c.hosts, p)
	return p.buf[:b.Len:b.Len], nil
}

// Len is the number of buffers added.
func (c *Call) Len() int { return len(c.bufs) }

// Release returns the buffers of a call that will not run (its arguments
// failed a later check). Nothing was enqueued for them.
func (c *Call) Release() {
	if c.done {
		return
	}
	c.done = true
	c.s.mu.Lock()
	for _, p := range c.hosts {
		c.s.putLocked(p)
	}
	c.s.mu.Unlock()
}

// Run stages the call's buffers around fn, ordered after the work enqueued
// on stream so far; see the package doc for the two variants. An error of
// fn is returned as it is, and its outputs are not copied back (the device
// buffers keep what they held).
func (c *Call) Run(stream cuda.Stream, blocking bool, fn func() error) (err error) {
	if c.done {
		return errors.New("stage: call already run")
	}
	c.done = true
	s := c.s
	if len(c.bufs) == 0 {
		return fn()
	}
	// Device selection is per OS thread in CUDA, and this thread may be
	// the application's (a call from C runs Go on the caller's thread):
	// its current device is put back after the call.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := s.rt.GetDevice()
	if err != nil {
		c.returnNow()
		return fmt.Errorf("stage: cudaGetDevice: %w", err)
	}
	if prev != c.dev {
		if err := s.rt.SetDevice(c.dev); err != nil {
			c.returnNow()
			return fmt.Errorf("stage: cudaSetDevice(%d): %w", c.dev, err)
		}
		defer s.rt.SetDevice(prev)
	}
	lib, err := s.stream(c.dev)
	if err != nil {
		c.returnNow()
		return err
	}
	evs, err := s.getEvents(3)
	if err != nil {
		c.returnNow()
		return err
	}
	defer s.putEvents(evs)
	start, staged, end := evs[0], evs[1], evs[2]
	// From here on every buffer goes back behind an event recorded after
	// the last copy enqueued for it, whatever fails.
	defer func() {
		if c.hosts != nil {
			c.returnAfter(lib)
		}
	}()

	if err := s.rt.EventRecord(start, stream); err != nil {
		return fmt.Errorf("stage: recording an event on the caller's stream %#x: %w", uintptr(stream), err)
	}
	if err := s.rt.StreamWaitEvent(lib, start); err != nil {
		return fmt.Errorf("stage: ordering the library stream after the caller's: %w", err)
	}
	for i, b := range c.bufs {
		if !b.In {
			continue
		}
		h := c.hosts[i].buf
		if err := s.rt.MemcpyAsync(addr(h), b.Ptr, b.Len, cuda.MemcpyDeviceToHost, lib); err != nil {
			return fmt.Errorf("stage: copying %s (%#x, %d bytes) to the host: %w", b.Name, b.Ptr, b.Len, err)
		}
	}
	if err := s.rt.EventRecord(staged, lib); err != nil {
		return fmt.Errorf("stage: recording an event on the library stream: %w", err)
	}
	if err := s.wait(staged, "the caller's stream and the copies to the host"); err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	for i, b := range c.bufs {
		if !b.Out {
			continue
		}
		h := c.hosts[i].buf
		if err := s.rt.MemcpyAsync(b.Ptr, addr(h), b.Len, cuda.MemcpyHostToDevice, lib); err != nil {
			return fmt.Errorf("stage: copying the result to %s (%#x, %d bytes): %w", b.Name, b.Ptr, b.Len, err)
		}
	}
	// The buffers' own events go before the completion event, so that a
	// blocking call finds its buffers reusable when it returns.
	c.returnAfter(lib)
	if err := s.rt.EventRecord(end, lib); err != nil {
		return fmt.Errorf("stage: recording the completion event: %w", err)
	}
	if blocking {
		return s.wait(end, "the copies back to the device")
	}
	if err := s.rt.StreamWaitEvent(stream, end); err != nil {
		return fmt.Errorf("stage: ordering the caller's stream %#x after the call: %w", uintptr(stream), err)
	}
	return nil
}

// WaitStream waits (within WaitTimeout) for the work enqueued on stream so
// far: a call on host buffers ordered after a caller's stream.
func (s *Stager) WaitStream(stream cuda.Stream) error {
	evs, err := s.getEvents(1)
	if err != nil {
		return err
	}
	defer s.putEvents(evs)
	if err := s.rt.EventRecord(evs[0], stream); err != nil {
		return fmt.Errorf("stage: recording an event on the caller's stream %#x: %w", uintptr(stream), err)
	}
	return s.wait(evs[0], "the caller's stream")
}

// returnNow gives the buffers back when nothing was enqueued for them.
func (c *Call) returnNow() {
	c.s.mu.Lock()
	for _, p := range c.hosts {
		c.s.putLocked(p)
	}
	c.s.mu.Unlock()
}

// returnAfter gives the buffers back, each usable again once the library
// stream has passed the point recorded now (after its last copy). A buffer
// whose event cannot be recorded is leaked rather than reused too early.
func (c *Call) returnAfter(lib cuda.Stream) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range c.hosts {
		if err := s.rt.EventRecord(p.ready, lib); err != nil {
			s.lent -= len(p.buf)
			continue
		}
		s.putLocked(p)
	}
	c.hosts = nil
}

func addr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(sliceData(b))
}

// wait polls ev until it completes or WaitTimeout passes: spinning briefly
// (the common case is a copy already done), then sleeping with backoff.
func (s *Stager) wait(ev cuda.Event, what string) error {
	deadline := time.Now().Add(s.opt.WaitTimeout)
	var nap time.Duration
	for i := 0; ; i++ {
		ok, err := s.rt.EventQuery(ev)
		if err != nil {
			return fmt.Errorf("stage: waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s, after %v", ErrTimeout, what, s.opt.WaitTimeout)
		}
		switch {
		case i < 64:
			runtime.Gosched()
		default:
			if nap < time.Microsecond*20 {
				nap = time.Microsecond * 20
			} else if nap < time.Millisecond {
				nap *= 2
			}
			time.Sleep(nap)
		}
	}
}

// stream returns the library stream of dev, made on first use (with dev
// current on this thread).
func (s *Stager) stream(dev int) (cuda.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errors.New("stage: stager closed")
	}
	if st, ok := s.streams[dev]; ok {
		return st, nil
	}
	st, err := s.rt.StreamCreate()
	if err != nil {
		return 0, fmt.Errorf("stage: creating the library stream on device %d: %w", dev, err)
	}
	s.streams[dev] = st
	return st, nil
}

func (s *Stager) getEvents(n int) ([]cuda.Event, error) {
	out := make([]cuda.Event, 0, n)
	s.mu.Lock()
	for len(out) < n && len(s.events) > 0 {
		out = append(out, s.events[len(s.events)-1])
		s.events = s.events[:len(s.events)-1]
	}
	s.mu.Unlock()
	for len(out) < n {
		ev, err := s.rt.EventCreate()
		if err != nil {
			s.putEvents(out)
			return nil, fmt.Errorf("stage: creating an event: %w", err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// putEvents returns events to the pool. Re-recording an event that a
// stream was told to wait for is safe: the wait holds the record current
// at the time of the cudaStreamWaitEvent call.
func (s *Stager) putEvents(evs []cuda.Event) {
	s.mu.Lock()
	s.events = append(s.events, evs...)
	s.mu.Unlock()
}

const minClass = 12 // 4 KiB

func class(n int) int {
	c := bits.Len(uint(n - 1))
	if c < minClass {
		c = minClass
	}
	return c
}

// acquire lends a pinned buffer of at least n bytes for device dev. holds
// says the calling Call has one already (then it never waits).
func (s *Stager) acquire(n, dev int, holds bool) (*pinned, error) {
	cl := class(n)
	size := 1 << cl
	deadline := time.Now().Add(s.opt.WaitTimeout)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errors.New("stage: stager closed")
		}
		if p := s.takeLocked(cl, dev); p != nil {
			s.lent += len(p.buf)
			s.mu.Unlock()
			return p, nil
		}
		s.trimLocked(size)
		// Past the bound only for a call that holds a buffer already, or
		// when nothing is lent or waiting to be freed (one call larger
		// than the bound).
		if holds || s.total+size <= s.opt.PoolBytes || s.total == 0 {
			s.total += size
			s.lent += size
			s.mu.Unlock()
			p, err := s.alloc(size, cl, dev)
			if err != nil {
				s.mu.Lock()
				s.total -= size
				s.lent -= size
				s.mu.Unlock()
				return nil, err
			}
			return p, nil
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %d bytes of pinned memory, all %d lent (Options.PoolBytes)", ErrTimeout, size, s.opt.PoolBytes)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (s *Stager) alloc(size, cl, dev int) (*pinned, error) {
	b, err := s.rt.MallocHost(size)
	if err != nil {
		return nil, fmt.Errorf("cudaHostAlloc(%d): %w", size, err)
	}
	ev, err := s.rt.EventCreate()
	if err != nil {
		s.rt.FreeHost(b)
		return nil, fmt.Errorf("creating an event: %w", err)
	}
	return &pinned{buf: b, class: cl, ready: ev, dev: dev}, nil
}

// takeLocked returns an idle buffer of class cl whose last copy completed.
func (s *Stager) takeLocked(cl, dev int) *pinned {
	list := s.idle[cl]
	for i, p := range list {
		if ok, err := s.rt.EventQuery(p.ready); err != nil || !ok {
			continue
		}
		p.dev = dev
		list[i] = list[len(list)-1]
		s.idle[cl] = list[:len(list)-1]
		return p
	}
	return nil
}

// trimLocked frees idle, completed buffers until size more bytes fit in
// the bound (or none is left to free).
func (s *Stager) trimLocked(size int) {
	for cl, list := range s.idle {
		for i := 0; i < len(list) && s.total+size > s.opt.PoolBytes; {
			p := list[i]
			if ok, err := s.rt.EventQuery(p.ready); err != nil || !ok {
				i++
				continue
			}
			s.rt.FreeHost(p.buf)
			s.rt.EventDestroy(p.ready)
			s.total -= len(p.buf)
			list[i] = list[len(list)-1]
			list = list[:len(list)-1]
		}
		s.idle[cl] = list
	}
}

func (s *Stager) putLocked(p *pinned) {
	s.lent -= len(p.buf)
	s.idle[p.class] = append(s.idle[p.class], p)
}

// Stats is the pool's state, for tests and diagnostics.
type Stats struct{ PinnedBytes, LentBytes int }

// Stats returns the pool's state.
func (s *Stager) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{PinnedBytes: s.total, LentBytes: s.lent}
}

// Close waits for the library streams (within WaitTimeout, through their
// buffers' events) and frees the pool, events and streams. Calls after
// Close fail.
func (s *Stager) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var first error
	for cl, list := range s.idle {
		for _, p := range list {
			if err := s.wait(p.ready, "a staging buffer's last copy"); err != nil && first == nil {
				first = err
				continue // leaked, not freed under a pending copy
			}
			s.rt.FreeHost(p.buf)
			s.rt.EventDestroy(p.ready)
			s.total -= len(p.buf)
		}
		delete(s.idle, cl)
	}
	for _, ev := range s.events {
		s.rt.EventDestroy(ev)
	}
	s.events = nil
	for dev, st := range s.streams {
		if err := s.rt.StreamDestroy(st); err != nil && first == nil {
			first = err
		}
		delete(s.streams, dev)
	}
	return first
}
