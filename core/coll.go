package core

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sort"

	"github.com/nexar-go/nexar/collective"
)

// This file is the public collective API: a blocking, a non-blocking and
// an internal form per collective. Each validates its arguments
// (validate.go), builds the call's signature and runs its schedule
// (call.go) over a link (link.go).

// Allreduce combines send from every rank with op into recv on every rank.
// send == nil: in place (the input is in recv).
func (c *Comm) Allreduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.iallreduce(ctx, send, recv, dt, op).wait()
}

// IAllreduce is the non-blocking Allreduce.
func (c *Comm) IAllreduce(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.iallreduce(context.Background(), send, recv, dt, op).start()
}

func (c *Comm) iallreduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) *Request {
	const name = "allreduce"
	n, err := c.sameShape(name, send, recv, dt, op)
	if err != nil {
		return c.invalid(name, err)
	}
	req := c.startCollective(ctx, signature{collAllreduce, dt, op, -1, uint64(n), 0}, allreduceBody)
	if cc := req.coll; cc != nil {
		cc.args = collArgs{send: send, recv: recv, dt: dt, op: op}
	}
	return req
}

// allreduceBody runs an allreduce on its call's arguments: a function, not
// a closure over them, so that the call makes no allocation for it.
func allreduceBody(ctx context.Context, l *link) error {
	a := &l.cc.args
	return collective.Allreduce(ctx, l, a.send, a.recv, a.dt, a.op)
}

// Broadcast copies buf from root to every rank.
func (c *Comm) Broadcast(ctx context.Context, buf []byte, dt collective.DType, root int) error {
	return c.ibroadcast(ctx, buf, dt, root).wait()
}

// IBroadcast is the non-blocking Broadcast.
func (c *Comm) IBroadcast(buf []byte, dt collective.DType, root int) *Request {
	return c.ibroadcast(context.Background(), buf, dt, root).start()
}

func (c *Comm) ibroadcast(ctx context.Context, buf []byte, dt collective.DType, root int) *Request {
	const name = "broadcast"
	n, err := elems(name, "buf", buf, dt)
	if err == nil {
		err = c.checkRoot(name, root)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startAgreed(ctx, signature{collBroadcast, dt, 0, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Broadcast(ctx, l, buf, root)
	})
}

// Reduce combines send from every rank into recv on root. On root, send ==
// nil means in place; elsewhere recv is not used and may be nil.
func (c *Comm) Reduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op, root int) error {
	return c.ireduce(ctx, send, recv, dt, op, root).wait()
}

// IReduce is the non-blocking Reduce.
func (c *Comm) IReduce(send, recv []byte, dt collective.DType, op collective.Op, root int) *Request {
	return c.ireduce(context.Background(), send, recv, dt, op, root).start()
}

func (c *Comm) ireduce(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op, root int) *Request {
	const name = "reduce"
	err := checkOp(name, dt, op)
	if err == nil {
		err = c.checkRoot(name, root)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	var n int
	if c.rank == root {
		n, err = c.sameShape(name, send, recv, dt, op)
	} else {
		if send == nil {
			err = invalidArg(name, "send is nil on non-root rank %d (in place is for the root only)", c.rank)
		} else {
			n, err = elems(name, "send", send, dt)
		}
		recv = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startAgreed(ctx, signature{collReduce, dt, op, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Reduce(ctx, l, send, recv, dt, op, root)
	})
}

// Allgather concatenates every rank's send into recv (rank order);
// len(recv) == Size()*len(send). send == nil: this rank's block is already
// in place in recv.
func (c *Comm) Allgather(ctx context.Context, send, recv []byte, dt collective.DType) error {
	return c.iallgather(ctx, send, recv, dt).wait()
}

// IAllgather is the non-blocking Allgather.
func (c *Comm) IAllgather(send, recv []byte, dt collective.DType) *Request {
	return c.iallgather(context.Background(), send, recv, dt).start()
}

func (c *Comm) iallgather(ctx context.Context, send, recv []byte, dt collective.DType) *Request {
	const name = "allgather"
	n, err := c.blocks(name, send, recv, dt)
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startCollective(ctx, signature{collAllgather, dt, 0, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Allgather(ctx, l, send, recv)
	})
}

// Allgatherv gathers counts[r] elements from rank r into recv at displs[r]
// (elements) on every rank. send == nil: this rank's block is in place.
func (c *Comm) Allgatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType) error {
	return c.iallgatherv(ctx, send, recv, counts, displs, dt).wait()
}

// IAllgatherv is the non-blocking Allgatherv.
func (c *Comm) IAllgatherv(send, recv []byte, counts, displs []int, dt collective.DType) *Request {
	return c.iallgatherv(context.Background(), send, recv, counts, displs, dt).start()
}

// iallgatherv is IAllgatherv bounded by ctx.
func (c *Comm) iallgatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType) *Request {
	const name = "allgatherv"
	n, err := elems(name, "recv", recv, dt)
	var bc, bd []int
	var total int
	if err == nil {
		bc, bd, total, err = c.bytesV(name, "", counts, displs, n, dt)
	}
	if err == nil && send != nil && len(send) != bc[c.rank] {
		err = invalidArg(name, "send has %d bytes but counts[%d] is %d elements", len(send), c.rank, counts[c.rank])
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collAllgatherv, dt, 0, -1, uint64(total), 0}, func(ctx context.Context, l *link) error {
		if total == 0 {
			return exchangeSignatures(ctx, l)
		}
		return collective.Allgatherv(ctx, l, send, recv, bc, bd)
	})
}

// ReduceScatter combines send (Size() blocks) from every rank with op and
// leaves block r in rank r's recv. send == nil: recv holds the Size()
// blocks of input and the result is left in block Rank() of recv.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.ireduceScatter(ctx, send, recv, dt, op).wait()
}

// IReduceScatter is the non-blocking ReduceScatter.
func (c *Comm) IReduceScatter(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.ireduceScatter(context.Background(), send, recv, dt, op).start()
}

func (c *Comm) ireduceScatter(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) *Request {
	const name = "reduce_scatter"
	if err := checkOp(name, dt, op); err != nil {
		return c.invalid(name, err)
	}
	var n int
	var err error
	if send == nil {
		n, err = c.blocks(name, nil, recv, dt)
	} else {
		n, err = c.blocks(name, recv, send, dt)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startCollective(ctx, signature{collReduceScatter, dt, op, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		if send == nil {
			return collective.ReduceScatterInPlace(ctx, l, recv, dt, op)
		}
		return collective.ReduceScatter(ctx, l, send, recv, dt, op)
	})
}

// Alltoall sends block j of send to rank j, which stores it as block
// Rank() of recv. send == nil: in place in recv.
func (c *Comm) Alltoall(ctx context.Context, send, recv []byte, dt collective.DType) error {
	return c.ialltoall(ctx, send, recv, dt).wait()
}

// IAlltoall is the non-blocking Alltoall.
func (c *Comm) IAlltoall(send, recv []byte, dt collective.DType) *Request {
	return c.ialltoall(context.Background(), send, recv, dt).start()
}

func (c *Comm) ialltoall(ctx context.Context, send, recv []byte, dt collective.DType) *Request {
	const name = "alltoall"
	n, err := c.blocks(name, nil, recv, dt)
	if err == nil && send != nil && len(send) != len(recv) {
		err = invalidArg(name, "send has %d bytes but recv has %d", len(send), len(recv))
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startCollective(ctx, signature{collAlltoall, dt, 0, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Alltoall(ctx, l, send, recv)
	})
}

// Alltoallv sends scounts[j] elements at sdispls[j] to rank j, which
// receives them at rdispls[Rank()] (elements). In place is not supported.
func (c *Comm) Alltoallv(ctx context.Context, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, dt collective.DType) error {
	return c.ialltoallv(ctx, send, scounts, sdispls, recv, rcounts, rdispls, dt).wait()
}

// IAlltoallv is the non-blocking Alltoallv.
func (c *Comm) IAlltoallv(send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, dt collective.DType) *Request {
	return c.ialltoallv(context.Background(), send, scounts, sdispls, recv, rcounts, rdispls, dt).start()
}

// ialltoallv is IAlltoallv bounded by ctx.
func (c *Comm) ialltoallv(ctx context.Context, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, dt collective.DType) *Request {
	const name = "alltoallv"
	if send == nil {
		return c.invalid(name, invalidArg(name, "send is nil: in place is not supported for alltoallv"))
	}
	sn, err := elems(name, "send", send, dt)
	var rn int
	if err == nil {
		rn, err = elems(name, "recv", recv, dt)
	}
	var sc, sd, rc, rd []int
	if err == nil {
		sc, sd, _, err = c.bytesV(name, "s", scounts, sdispls, sn, dt)
	}
	if err == nil {
		rc, rd, _, err = c.bytesV(name, "r", rcounts, rdispls, rn, dt)
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collAlltoallv, dt, 0, -1, noCount, 0}, func(ctx context.Context, l *link) error {
		return collective.Alltoallv(ctx, l, send, sc, sd, recv, rc, rd)
	})
}

// Gather collects every rank's send into recv on root (rank order). On
// root send == nil means its block is in place; elsewhere recv may be nil.
func (c *Comm) Gather(ctx context.Context, send, recv []byte, dt collective.DType, root int) error {
	return c.igather(ctx, send, recv, dt, root).wait()
}

// IGather is the non-blocking Gather.
func (c *Comm) IGather(send, recv []byte, dt collective.DType, root int) *Request {
	return c.igather(context.Background(), send, recv, dt, root).start()
}

func (c *Comm) igather(ctx context.Context, send, recv []byte, dt collective.DType, root int) *Request {
	const name = "gather"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var n int
	var err error
	if c.rank == root {
		n, err = c.blocks(name, send, recv, dt)
	} else if send == nil {
		err = invalidArg(name, "send is nil on non-root rank %d", c.rank)
	} else {
		n, err = elems(name, "send", send, dt)
		recv = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startAgreed(ctx, signature{collGather, dt, 0, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Gather(ctx, l, send, recv, root)
	})
}

// Gatherv collects counts[r] elements from rank r into recv at displs[r]
// on root; counts and displs are used on root only.
func (c *Comm) Gatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType, root int) error {
	return c.igatherv(ctx, send, recv, counts, displs, dt, root).wait()
}

// IGatherv is the non-blocking Gatherv.
func (c *Comm) IGatherv(send, recv []byte, counts, displs []int, dt collective.DType, root int) *Request {
	return c.igatherv(context.Background(), send, recv, counts, displs, dt, root).start()
}

// igatherv is IGatherv bounded by ctx.
func (c *Comm) igatherv(ctx context.Context, send, recv []byte, counts, displs []int, dt collective.DType, root int) *Request {
	const name = "gatherv"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var bc, bd []int
	var err error
	if c.rank == root {
		var n int
		n, err = elems(name, "recv", recv, dt)
		if err == nil {
			bc, bd, _, err = c.bytesV(name, "", counts, displs, n, dt)
		}
		if err == nil && send != nil && len(send) != bc[c.rank] {
			err = invalidArg(name, "send has %d bytes but counts[%d] is %d elements", len(send), c.rank, counts[c.rank])
		}
	} else if send == nil {
		err = invalidArg(name, "send is nil on non-root rank %d", c.rank)
	} else {
		_, err = elems(name, "send", send, dt)
		recv = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collGatherv, dt, 0, root, noCount, 0}, agreed(func(ctx context.Context, l *link) error {
		return collective.Gatherv(ctx, l, send, recv, bc, bd, root)
	}))
}

// Scatter sends block r of send on root to rank r's recv. On root recv ==
// nil means in place (root's block stays in send); elsewhere send may be nil.
func (c *Comm) Scatter(ctx context.Context, send, recv []byte, dt collective.DType, root int) error {
	return c.iscatter(ctx, send, recv, dt, root).wait()
}

// IScatter is the non-blocking Scatter.
func (c *Comm) IScatter(send, recv []byte, dt collective.DType, root int) *Request {
	return c.iscatter(context.Background(), send, recv, dt, root).start()
}

func (c *Comm) iscatter(ctx context.Context, send, recv []byte, dt collective.DType, root int) *Request {
	const name = "scatter"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var n int
	var err error
	if c.rank == root {
		n, err = c.blocks(name, recv, send, dt)
	} else if recv == nil {
		err = invalidArg(name, "recv is nil on non-root rank %d", c.rank)
	} else {
		n, err = elems(name, "recv", recv, dt)
		send = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startAgreed(ctx, signature{collScatter, dt, 0, root, uint64(n), 0}, func(ctx context.Context, l *link) error {
		return collective.Scatter(ctx, l, send, recv, root)
	})
}

// Scatterv sends counts[r] elements at displs[r] of send on root to rank r;
// counts and displs are used on root only.
func (c *Comm) Scatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, dt collective.DType, root int) error {
	return c.iscatterv(ctx, send, counts, displs, recv, dt, root).wait()
}

// IScatterv is the non-blocking Scatterv.
func (c *Comm) IScatterv(send []byte, counts, displs []int, recv []byte, dt collective.DType, root int) *Request {
	return c.iscatterv(context.Background(), send, counts, displs, recv, dt, root).start()
}

// iscatterv is IScatterv bounded by ctx.
func (c *Comm) iscatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, dt collective.DType, root int) *Request {
	const name = "scatterv"
	if err := c.checkRoot(name, root); err != nil {
		return c.invalid(name, err)
	}
	var bc, bd []int
	var err error
	if c.rank == root {
		var n int
		n, err = elems(name, "send", send, dt)
		if err == nil {
			bc, bd, _, err = c.bytesV(name, "", counts, displs, n, dt)
		}
		if err == nil && recv != nil && len(recv) != bc[c.rank] {
			err = invalidArg(name, "recv has %d bytes but counts[%d] is %d elements", len(recv), c.rank, counts[c.rank])
		}
	} else if recv == nil {
		err = invalidArg(name, "recv is nil on non-root rank %d", c.rank)
	} else {
		_, err = elems(name, "recv", recv, dt)
		send = nil
	}
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startColl(ctx, signature{collScatterv, dt, 0, root, noCount, 0}, agreed(func(ctx context.Context, l *link) error {
		return collective.Scatterv(ctx, l, send, bc, bd, recv, root)
	}))
}

// Scan leaves in rank r's recv the combination of send over ranks 0..r.
// send == nil: in place.
func (c *Comm) Scan(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.iscan(ctx, collScan, send, recv, dt, op).wait()
}

// IScan is the non-blocking Scan.
func (c *Comm) IScan(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.iscan(context.Background(), collScan, send, recv, dt, op).start()
}

// Exscan leaves in rank r's recv the combination over ranks 0..r-1; rank
// 0's recv is left unchanged. send == nil: in place.
func (c *Comm) Exscan(ctx context.Context, send, recv []byte, dt collective.DType, op collective.Op) error {
	return c.iscan(ctx, collExscan, send, recv, dt, op).wait()
}

// IExscan is the non-blocking Exscan.
func (c *Comm) IExscan(send, recv []byte, dt collective.DType, op collective.Op) *Request {
	return c.iscan(context.Background(), collExscan, send, recv, dt, op).start()
}

func (c *Comm) iscan(ctx context.Context, kind collKind, send, recv []byte, dt collective.DType, op collective.Op) *Request {
	name := kind.String()
	n, err := c.sameShape(name, send, recv, dt, op)
	if err != nil {
		return c.invalid(name, err)
	}
	return c.startAgreed(ctx, signature{kind, dt, op, -1, uint64(n), 0}, func(ctx context.Context, l *link) error {
		if kind == collExscan {
			return collective.Exscan(ctx, l, send, recv, dt, op)
		}
		return collective.Scan(ctx, l, send, recv, dt, op)
	})
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error { return c.ibarrier(ctx).wait() }

// IBarrier is the non-blocking Barrier.
func (c *Comm) IBarrier() *Request { return c.ibarrier(context.Background()).start() }

func (c *Comm) ibarrier(ctx context.Context) *Request {
	return c.startColl(ctx, signature{kind: collBarrier, root: -1, count: 0}, exchangeSignatures)
}

// Split partitions c: ranks that pass the same color form a new
// communicator, ordered by (key, rank in c). It is collective over c. A
// negative color means "not a member": Split returns (nil, nil). The child
// shares c's transport; close it separately.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	var child *Comm
	req := c.startColl(ctx, signature{kind: collSplit, root: -1, count: noCount}, func(ctx context.Context, l *link) error {
		const rec = 24
		send := make([]byte, rec)
		binary.LittleEndian.PutUint64(send[0:], uint64(int64(color)))
		binary.LittleEndian.PutUint64(send[8:], uint64(int64(key)))
		binary.LittleEndian.PutUint64(send[16:], uint64(c.rank))
		all := make([]byte, rec*c.size)
		if err := collective.Allgather(ctx, l, send, all); err != nil {
			return err
		}
		if color < 0 {
			return nil
		}
		type member struct{ key, rank int }
		var ms []member
		for r := 0; r < c.size; r++ {
			b := all[r*rec:]
			if int(int64(binary.LittleEndian.Uint64(b))) == color {
				ms = append(ms, member{int(int64(binary.LittleEndian.Uint64(b[8:]))), r})
			}
		}
		sort.SliceStable(ms, func(i, j int) bool {
			if ms[i].key != ms[j].key {
				return ms[i].key < ms[j].key
			}
			return ms[i].rank < ms[j].rank
		})
		world := make([]int, len(ms))
		me := -1
		for i, m := range ms {
			world[i] = c.world[m.rank]
			if m.rank == c.rank {
				me = i
			}
		}
		ch := newComm(c.n, childID(c.id, l.seq, color), me, world)
		ch.rec.policy = c.FailurePolicy() // the parent's, as set now
		if err := c.n.register(ch); err != nil {
			return err
		}
		ch.startFlight()
		child = ch
		return nil
	})
	if err := req.wait(); err != nil {
		return nil, err
	}
	return child, nil
}

// childID derives a split child's id from its parent's id, the split's
// sequence number on the parent and the color; never worldID.
func childID(parent, seq uint64, color int) uint64 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], parent)
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(int64(color)))
	sum := sha256.Sum256(b[:])
	id := binary.LittleEndian.Uint64(sum[:8])
	if id == worldID {
		id = 1
	}
	return id
}
