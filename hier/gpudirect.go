package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hw/cuda"
)

// Direct runs device collectives with GPUDirect RDMA: over point-to-point
// calls on a communicator of its own, whose paths move device memory
// between the NIC and the device (core.Comm.DevicePath: RDMA channels whose
// NIC reaches device memory by dma-buf or peer memory). The NIC reads and
// writes the device buffers; what crosses to the host is only what the host
// must compute on: in an allreduce, the block this rank reduces (1/P of the
// buffer each way, where staging copies all of it both ways).
//
// An allreduce: every rank owns one block (element counts within one of
// each other). Each rank sends every other rank's block of its device
// buffer to that rank from device memory, receives the other ranks' parts
// of its own block into host memory, copies its own part of it to the host
// and reduces them in rank order; it copies the result into its device
// block and sends it, from the host, to every other rank, which receives it
// straight into its device buffer. A broadcast sends the root's device
// buffer to every rank's device buffer; an allgather each rank's device
// block to every rank's.
//
// A Direct belongs to one caller at a time (as its parent's collectives
// do); Close releases its communicator.
type Direct struct {
	c  *core.Comm
	rt *cuda.Runtime
}

// Tags of Direct's messages on its own communicator.
const (
	tagDirectReduce uint64 = 1 + iota
	tagDirectGather
	tagDirectBcast
)

// DirectPaths reports whether every path between c's members, both ways,
// moves device memory (what Direct needs). It changes as paths are set up
// and once a NIC refused device memory for good, so it is asked at every
// call: a rank where it is false must not make the call Direct while
// another does (each rank's answer depends on its own paths; the caller
// agrees on it, e.g. with an allreduce of the answer, before choosing).
func DirectPaths(c *core.Comm) bool {
	if c.Size() < 2 {
		return false
	}
	for p := range c.Size() {
		if p != c.Rank() && (!c.DevicePath(p, true) || !c.DevicePath(p, false)) {
			return false
		}
	}
	return true
}

// NewDirect makes a Direct over parent, collectively: every member of
// parent calls it. rt copies the blocks the host reduces.
func NewDirect(ctx context.Context, parent *core.Comm, rt *cuda.Runtime) (*Direct, error) {
	if rt == nil {
		return nil, errors.New("hier: Direct needs a CUDA runtime")
	}
	c, err := parent.Split(ctx, 0, parent.Rank())
	if err != nil {
		return nil, fmt.Errorf("hier: Direct's communicator: %w", err)
	}
	return &Direct{c: c, rt: rt}, nil
}

// Close closes the Direct's communicator.
func (d *Direct) Close() error { return d.c.Close() }

// Comm is the Direct's communicator (for its paths: Paths, DevicePath).
func (d *Direct) Comm() *core.Comm { return d.c }

// devBytes is a []byte over device memory, which host code never touches:
// only the NIC and the CUDA runtime's copies reach it.
func devBytes(p cuda.DevicePtr, n int) []byte {
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), n)
}

// block returns rank r's block of count elements of es bytes among p ranks
// (the larger ones first): its byte offset and length.
func block(count, es, p, r int) (off, n int) {
	base, rem := count/p, count%p
	first := r * base
	first += min(r, rem)
	k := base
	if r < rem {
		k++
	}
	return first * es, k * es
}

// Allreduce reduces count elements of dt at send (device memory) with op
// across the members into recv (device memory; send itself for in place).
func (d *Direct) Allreduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op) error {
	if err := collective.Check(dt, op); err != nil {
		return err
	}
	p, me, es := d.c.Size(), d.c.Rank(), dt.Size()
	src, dst := devBytes(send, count*es), devBytes(recv, count*es)
	off, n := block(count, es, p, me)
	parts := make([][]byte, p) // the members' parts of this rank's block, in host memory
	var reqs []*core.Request
	for q := range p {
		if q == me {
			continue
		}
		if n > 0 {
			parts[q] = make([]byte, n)
			reqs = append(reqs, d.c.IRecv(parts[q], q, tagDirectReduce))
		}
		if qo, qn := block(count, es, p, q); qn > 0 {
			reqs = append(reqs, d.c.ISendDevice(src[qo:qo+qn], q, tagDirectReduce))
		}
	}
	var err error
	if n > 0 {
		parts[me] = make([]byte, n)
		err = d.rt.CopyFromDevice(parts[me], send+cuda.DevicePtr(off))
	}
	if err = errors.Join(err, wait(ctx, reqs)); err != nil {
		return fmt.Errorf("hier: direct allreduce, reduce-scatter: %w", err)
	}
	acc := parts[0]
	for q := 1; q < p && n > 0; q++ {
		collective.ReduceInto(acc, parts[q], dt, op)
	}
	if op == collective.Avg && n > 0 {
		collective.FinishAvg(acc, dt, p)
	}
	reqs = reqs[:0]
	for q := range p {
		if q == me {
			continue
		}
		if qo, qn := block(count, es, p, q); qn > 0 {
			reqs = append(reqs, d.c.IRecvDevice(dst[qo:qo+qn], q, tagDirectGather))
		}
		if n > 0 {
			reqs = append(reqs, d.c.ISend(acc, q, tagDirectGather))
		}
	}
	if n > 0 {
		err = d.rt.CopyToDevice(recv+cuda.DevicePtr(off), acc)
	}
	if err = errors.Join(err, wait(ctx, reqs)); err != nil {
		return fmt.Errorf("hier: direct allreduce, allgather: %w", err)
	}
	return nil
}

// Broadcast copies n bytes at buf (device memory) on root to buf on every
// member.
func (d *Direct) Broadcast(ctx context.Context, buf cuda.DevicePtr, n, root int) error {
	if n == 0 {
		return nil
	}
	dev := devBytes(buf, n)
	var reqs []*core.Request
	if d.c.Rank() == root {
		for q := range d.c.Size() {
			if q != root {
				reqs = append(reqs, d.c.ISendDevice(dev, q, tagDirectBcast))
			}
		}
	} else {
		reqs = append(reqs, d.c.IRecvDevice(dev, root, tagDirectBcast))
	}
	if err := wait(ctx, reqs); err != nil {
		return fmt.Errorf("hier: direct broadcast: %w", err)
	}
	return nil
}

// Allgather copies n bytes at send (device memory) of every member r to
// recv+r*n (device memory) on every member; in place where send is
// recv+r*n itself.
func (d *Direct) Allgather(ctx context.Context, send, recv cuda.DevicePtr, n int) error {
	if n == 0 {
		return nil
	}
	p, me := d.c.Size(), d.c.Rank()
	src, dst := devBytes(send, n), devBytes(recv, p*n)
	var reqs []*core.Request
	for q := range p {
		if q == me {
			continue
		}
		reqs = append(reqs, d.c.IRecvDevice(dst[q*n:(q+1)*n], q, tagDirectGather), d.c.ISendDevice(src, q, tagDirectGather))
	}
	// This rank's own block: a device-to-device copy through the host
	// would cross twice; the runtime has none here, so it goes by the host
	// once each way (n bytes, as the reduced block of an allreduce does).
	var err error
	if mine := recv + cuda.DevicePtr(me*n); send != mine {
		own := make([]byte, n)
		if err = d.rt.CopyFromDevice(own, send); err == nil {
			err = d.rt.CopyToDevice(mine, own)
		}
	}
	if err = errors.Join(err, wait(ctx, reqs)); err != nil {
		return fmt.Errorf("hier: direct allgather: %w", err)
	}
	return nil
}

// wait waits for every request; the first error is returned after all
// have ended (a buffer is not given back while the NIC may still use it).
func wait(ctx context.Context, reqs []*core.Request) error {
	var first error
	for _, r := range reqs {
		if err := r.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Directs keeps the Direct of each caller's handle (as Router keeps its
// hierarchies) and chooses, per call, between it and staging. Safe for
// concurrent use; the zero value is ready.
//
// The choice must be the same on every member (the two paths are
// different messages on different communicators), and each member knows
// only its own paths, so Choose agrees on it over the caller's
// communicator with a 4-byte allreduce per call: cheap beside a device
// collective, and it follows the paths as they change (a NIC found unable
// to reach device memory turns a member's answer, and so the call, to
// staging).
type Directs struct {
	mu sync.Mutex
	m  map[any]*directFor
}

type directFor struct {
	mu   sync.Mutex
	comm *core.Comm
	d    *Direct
}

// Choose returns the Direct that carries a device collective on c (the
// communicator the handle key stands for now), or nil when the call is to
// be staged: every member of c calls it for the call, with device buffers.
// The agreement is a 4-byte allreduce. The first call that chooses
// GPUDirect sets the Direct up, collectively.
func (ds *Directs) Choose(ctx context.Context, key any, c *core.Comm, rt *cuda.Runtime) (*Direct, error) {
	if c.Size() < 2 || rt == nil {
		return nil, nil
	}
	var b [4]byte
	if DirectPaths(c) {
		b[0] = 1
	}
	if err := c.Allreduce(ctx, b[:], b[:], collective.Int32, collective.Min); err != nil {
		return nil, fmt.Errorf("hier: agreeing on GPUDirect: %w", err)
	}
	if binary.LittleEndian.Uint32(b[:]) == 0 {
		return nil, nil
	}
	return ds.direct(ctx, key, c, rt)
}

// ChooseCall is Choose that also checks that every member makes the same
// call, described by call (kind, count, type, op, root): members that
// describe different calls all fail with core.CodeMismatch, as the staged
// path's signatures would make them (Direct's own messages carry none, and
// different counts would pass as short receives). The agreement is one
// 24-byte allreduce.
func (ds *Directs) ChooseCall(ctx context.Context, key any, c *core.Comm, rt *cuda.Runtime, call string) (*Direct, error) {
	if c.Size() < 2 || rt == nil {
		return nil, nil
	}
	// An allreduce (min) of {all my paths move device memory, the call's
	// hash, minus it}: the minimum of the hash and its maximum (minus the
	// minimum of its negation) differ where the calls do.
	h := fnv.New64a()
	h.Write([]byte(call))
	sig := int64(h.Sum64() >> 2)
	var b [24]byte
	if DirectPaths(c) {
		b[0] = 1
	}
	binary.LittleEndian.PutUint64(b[8:], uint64(sig))
	binary.LittleEndian.PutUint64(b[16:], uint64(-sig))
	if err := c.Allreduce(ctx, b[:], b[:], collective.Int64, collective.Min); err != nil {
		return nil, fmt.Errorf("hier: agreeing on GPUDirect: %w", err)
	}
	if lo, hi := int64(binary.LittleEndian.Uint64(b[8:])), -int64(binary.LittleEndian.Uint64(b[16:])); lo != hi || lo != sig {
		return nil, &core.Error{Code: core.CodeMismatch, Op: call, Rank: -1,
			Msg: fmt.Sprintf("rank %d called %s, another member a different device collective", c.Rank(), call)}
	}
	if binary.LittleEndian.Uint64(b[:8]) == 0 {
		return nil, nil
	}
	return ds.direct(ctx, key, c, rt)
}

// direct returns key's Direct over c, set up (collectively) at first use
// and again for a successor communicator.
func (ds *Directs) direct(ctx context.Context, key any, c *core.Comm, rt *cuda.Runtime) (*Direct, error) {
	ds.mu.Lock()
	if ds.m == nil {
		ds.m = map[any]*directFor{}
	}
	f := ds.m[key]
	if f == nil {
		f = &directFor{}
		ds.m[key] = f
	}
	ds.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.comm != c { // first use, or a successor (shrink policy)
		if f.d != nil {
			f.d.Close()
		}
		f.comm, f.d = c, nil
		d, err := NewDirect(ctx, c, rt)
		if err != nil {
			f.comm = nil
			return nil, err
		}
		f.d = d
	}
	return f.d, nil
}

// Release closes and forgets key's Direct (before the communicator it was
// made over is closed).
func (ds *Directs) Release(key any) {
	ds.mu.Lock()
	f := ds.m[key]
	delete(ds.m, key)
	ds.mu.Unlock()
	if f != nil {
		f.mu.Lock()
		if f.d != nil {
			f.d.Close()
		}
		f.mu.Unlock()
	}
}

// Direct returns the Direct that carries device collective x on c by
// GPUDirect RDMA (see Directs), or nil when the call takes the staged
// path. It is for a call Route left to the usual path: with the buffers
// all device memory of one device, on a communicator made with a GPU
// runtime (core.Config.GPU), every member calls it for the call (it agrees
// over c); otherwise it returns nil at once. key and c are Route's; kind
// names the call ("allreduce", "broadcast", "allgather") and root is its
// root (0 where it has none).
func (r *Router) Direct(ctx context.Context, key any, c *core.Comm, kind string, root int, x Collective) (*Direct, error) {
	d := r.dev.Load()
	if d == nil || x.Count == 0 || c.Config().GPU == nil || !x.DType.Valid() || !x.Op.Valid() ||
		x.Reduces && collective.Check(x.DType, x.Op) != nil {
		return nil, nil // the usual path takes it, and reports what is wrong
	}
	dev := -1
	for _, p := range x.Bufs {
		if p == 0 {
			return nil, nil
		}
		pl, err := d.kinds.Of(p)
		if err != nil || !pl.OnDevice || (dev >= 0 && pl.Device != dev) {
			return nil, nil
		}
		dev = pl.Device
	}
	call := fmt.Sprintf("%s of %d %v", kind, x.Count, x.DType)
	if x.Reduces {
		call += fmt.Sprintf(" %v", x.Op)
	}
	if kind == "broadcast" {
		call += fmt.Sprintf(" from rank %d", root)
	}
	return r.direct.ChooseCall(ctx, key, c, d.rt, call)
}
