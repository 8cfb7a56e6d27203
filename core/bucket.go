package core

import (
	"context"

	"github.com/nexar-go/nexar/collective"
)

// Bucketed allreduce: many buffers (a model's gradients) reduced in a few
// large calls instead of one call each. Buffers are packed in order into
// buckets of at most bucketBytes; a buffer as large as a bucket, or alone
// in its bucket, is reduced where it lies (no copy). Packing bucket k+1 and
// unpacking bucket k-1 overlap the reduction of bucket k, with two staging
// buffers per call.

// DefaultBucketBytes is the bucket size when the caller gives 0: DDP's
// default bucket_cap_mb.
const DefaultBucketBytes = 25 << 20

// AllreduceMulti is Allreduce over each recv[i] (send[i] its input; a nil
// send or send[i]: in place), all of dtype dt, reduced in buckets of at
// most bucketBytes (0: DefaultBucketBytes). Every rank must pass the same
// buffer lengths in the same order and the same bucketBytes.
func (c *Comm) AllreduceMulti(ctx context.Context, send, recv [][]byte, dt collective.DType, op collective.Op, bucketBytes int) error {
	return c.iallreduceMulti(ctx, send, recv, dt, op, bucketBytes).wait()
}

// IAllreduceMulti is the non-blocking AllreduceMulti. The buckets' places
// in the communicator's call order are taken now, so later calls may be
// issued at once.
func (c *Comm) IAllreduceMulti(send, recv [][]byte, dt collective.DType, op collective.Op, bucketBytes int) *Request {
	return c.iallreduceMulti(context.Background(), send, recv, dt, op, bucketBytes).start()
}

// bucket is a run of buffers [first, end) reduced by one collective call.
type bucket struct {
	first, end int
	bytes      int
	direct     bool   // one buffer, reduced in place in the caller's memory
	stage      []byte // staged buckets: the packed data while in flight
}

// planBuckets groups buffers in order into buckets of at most max bytes.
// Empty buffers join whatever bucket is open (they cost nothing); a buffer
// of max bytes or more gets a bucket of its own. Every rank computes the
// same plan from the same lengths.
func planBuckets(recv [][]byte, max int) []bucket {
	var out []bucket
	cur := bucket{}
	flush := func(end int) {
		if cur.bytes > 0 {
			cur.end = end
			out = append(out, cur)
		}
		cur = bucket{first: end}
	}
	for i, r := range recv {
		n := len(r)
		if n == 0 {
			continue
		}
		if n >= max {
			flush(i)
			cur.bytes = n
			flush(i + 1)
			continue
		}
		if cur.bytes+n > max {
			flush(i)
		}
		cur.bytes += n
	}
	flush(len(recv))
	for k := range out {
		b := &out[k]
		nonEmpty := 0
		for i := b.first; i < b.end; i++ {
			if len(recv[i]) > 0 {
				nonEmpty++
			}
		}
		b.direct = nonEmpty == 1
	}
	return out
}

func (c *Comm) iallreduceMulti(ctx context.Context, send, recv [][]byte, dt collective.DType, op collective.Op, bucketBytes int) *Request {
	const name = "allreduce_multi"
	total, err := multiShape(name, send, recv, dt, op, bucketBytes)
	if err != nil {
		return c.invalid(name, err)
	}
	if bucketBytes == 0 {
		bucketBytes = DefaultBucketBytes
	}
	// Whole elements per bucket, so that a staged bucket reduces as dt.
	if es := dt.Size(); bucketBytes < es {
		bucketBytes = es
	} else {
		bucketBytes -= bucketBytes % es
	}
	m := &multiCall{send: send, recv: recv, scratch: c.scratch}
	m.buckets = planBuckets(recv, bucketBytes)
	if total == 0 {
		// Nothing to reduce: one signature exchange, so that the call is
		// still matched against every rank's.
		m.reqs = []*Request{c.startCollective(ctx, signature{collAllreduce, dt, op, -1, 0, 0}, nil)}
	} else {
		// Each bucket is a collective call of its own; all take their
		// sequence numbers now, in the caller's goroutine.
		m.ctx, m.cancel = context.WithCancel(ctx)
		m.reqs = make([]*Request, len(m.buckets))
		for k := range m.buckets {
			b := &m.buckets[k]
			var s, r []byte
			if b.direct {
				i := m.nonEmpty(b)
				r = recv[i]
				if send != nil {
					s = send[i]
				}
			}
			m.reqs[k] = c.startColl(m.ctx, signature{collAllreduce, dt, op, -1, uint64(b.bytes / dt.Size()), 0},
				func(ctx context.Context, l *link) error {
					if b.direct {
						return collective.Allreduce(ctx, l, s, r, dt, op)
					}
					return collective.Allreduce(ctx, l, nil, b.stage, dt, op)
				})
		}
	}
	req := newRequest(c, name, true)
	req.pendingOp = func() { req.finish(Status{}, m.drive()) }
	return req
}

// multiCall is one bucketed allreduce in progress.
type multiCall struct {
	send, recv [][]byte
	buckets    []bucket
	reqs       []*Request // one per bucket
	ctx        context.Context
	cancel     context.CancelFunc
	scratch    *collective.ScratchPool // the communicator's: staging buffers
}

func (m *multiCall) nonEmpty(b *bucket) int {
	for i := b.first; i < b.end; i++ {
		if len(m.recv[i]) > 0 {
			return i
		}
	}
	return b.first
}

// pack copies bucket k's inputs into a staging buffer.
func (m *multiCall) pack(k int) {
	b := &m.buckets[k]
	if b.direct {
		return
	}
	b.stage = m.scratch.Get(b.bytes)
	off := 0
	for i := b.first; i < b.end; i++ {
		src := m.recv[i]
		if m.send != nil && m.send[i] != nil {
			src = m.send[i]
		}
		off += copy(b.stage[off:], src)
	}
}

// unpack copies bucket k's result out to its buffers (if ok) and releases
// the staging buffer.
func (m *multiCall) unpack(k int, ok bool) {
	b := &m.buckets[k]
	if b.stage == nil {
		return
	}
	if ok {
		off := 0
		for i := b.first; i < b.end; i++ {
			off += copy(m.recv[i], b.stage[off:])
		}
	}
	m.scratch.Put(b.stage)
	b.stage = nil
}

// drive runs the buckets in order, at most one reduction in flight: while
// bucket k reduces (in its own goroutine), bucket k+1 is packed; bucket k
// is unpacked while bucket k+1 reduces. After a failure the remaining
// buckets still run, under a cancelled context (they end at once), since
// each holds a sequence number every rank must see settled.
func (m *multiCall) drive() error {
	if m.cancel == nil {
		return m.reqs[0].wait()
	}
	defer m.cancel()
	if len(m.reqs) == 1 {
		// Nothing to overlap: run it here, without a goroutine hand-off.
		m.pack(0)
		err := m.reqs[0].wait()
		m.unpack(0, err == nil)
		return err
	}
	var first error
	m.pack(0)
	m.reqs[0].launch()
	for k := range m.reqs {
		next := k+1 < len(m.reqs)
		if next && first == nil {
			m.pack(k + 1)
		}
		if err := m.reqs[k].wait(); err != nil && first == nil {
			first = err
			m.cancel()
		}
		if next {
			if first == nil {
				m.reqs[k+1].launch()
			} else {
				m.reqs[k+1].wait() // fails at once: cancelled
			}
		}
		m.unpack(k, first == nil)
	}
	return first
}
