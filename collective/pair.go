package collective

import "context"

// Streamer is an optional Link extension: Stream(peer) reports whether the
// path to peer moves data without the help of the goroutine that waits for
// it (a socket, where the kernel and the transport's reader fill a posted
// buffer), so that a schedule may keep many receives posted, each waited
// for by a goroutine of its own, at no cost (pairStream). A shared-memory
// ring, which its waiters read themselves, is not such a path.
type Streamer interface {
	Stream(peer int) bool
}

// Poster is an optional Link extension: Post makes buf the destination of
// message (peer, step) at once and returns the wait for it, which the
// caller must call exactly once, whatever happens (a wait whose ctx has
// ended withdraws the receive). Without it a schedule posts a receive by
// calling Recv in a goroutine, which posts when the goroutine runs.
type Poster interface {
	Post(ctx context.Context, peer int, step uint32, buf []byte) (wait func() error, err error)
}

// streams reports whether l streams to peer (Streamer).
func streams(l Link, peer int) bool {
	s, ok := l.(Streamer)
	return ok && s.Stream(peer)
}

// segments splits b into pieces of seg bytes (the last shorter); an empty b
// is one empty piece, as an empty message is one step.
func segments(b []byte, seg int) [][]byte {
	n := max(1, (len(b)+seg-1)/seg)
	out := make([][]byte, n)
	for i := range out {
		lo := min(i*seg, len(b))
		hi := min(lo+seg, len(b))
		out[i] = b[lo:hi:hi]
	}
	return out
}

// pairStream is the 2-rank ring allreduce (reduce-scatter, then allgather)
// fused and pipelined chunk by chunk, for a peer that Streams: this rank
// sends the peer's half of its input while the peer's copy of this rank's
// half comes in; each chunk of that half is reduced as soon as it has
// arrived and goes back to the peer right behind the input, so both
// directions of the link stay busy, the reduction overlaps the transfer,
// and each chunk is still in cache when it is reduced and sent on. Every
// receive is posted (a goroutine waits in Recv) before anything is sent,
// so no chunk arrives unposted and is copied twice.
//
// It sends exactly the messages of ringReduceScatter and ringAllgather for
// two ranks (the same steps, each a chunk of the same block, in the same
// order within a direction), so the peer may run either: whether
// a path streams is a local, changing fact (a shared-memory ring is made
// on first use, one direction at a time), and the ranks need not agree on
// it. The arithmetic is ringReduceScatter's too: each half is reduced only
// by its owner, in the same order (received op own input; own op received
// when out is the input), so both ranks get the same bits as the ring.
func (st *steps) pairStream(ctx context.Context, l Link, in, out []byte, dt DType, op Op) error {
	rank := l.Rank()
	peer := 1 - rank
	es := dt.Size()
	ins, outs := balanced(in, 2, es), balanced(out, 2, es)
	seg := st.chunk                    // the ring's messages: sendMsg's chunks
	sendIn := segments(ins[peer], seg) // the peer's half of our input: RS
	own := segments(ins[rank], seg)    // our half of our input
	res := segments(outs[rank], seg)   // our half of the result: reduced here, then sent (AG)
	got := segments(outs[peer], seg)   // the peer's half of the result
	// In place (out is in), the peer's chunks of our half are staged:
	// they cannot land on the input they are combined with.
	staged := overlaps(outs[rank], in)
	recvIn := res
	if staged {
		stage := scratchOf(l).Get(len(outs[rank]))
		defer scratchOf(l).Put(stage)
		prepare(l, stage)
		recvIn = segments(stage, seg)
	}
	so, si := st.out(peer), st.in(peer)
	sb := *so
	*so += uint32(len(sendIn) + len(res))
	rb := *si
	*si += uint32(len(recvIn) + len(got))
	g, ctx := newGroup(ctx)
	recvs := append(append(make([][]byte, 0, len(recvIn)+len(got)), recvIn...), got...)
	waits, err := post(ctx, l, peer, rb, recvs)
	if err != nil {
		g.cancel()
		for _, w := range waits {
			w() // withdraws it: ctx has ended
		}
		return err
	}
	ready := make([]chan struct{}, len(res)) // closed once chunk i is reduced
	for i := range ready {
		ready[i] = make(chan struct{})
	}
	for i := range recvIn {
		g.Go(func() error {
			if err := waits[i](); err != nil {
				return err
			}
			if staged {
				ReduceInto(res[i], recvIn[i], dt, redOp(op)) // own op received
			} else {
				ReduceInto(res[i], own[i], dt, redOp(op)) // received op own
			}
			if op == Avg {
				FinishAvg(res[i], dt, 2)
			}
			close(ready[i])
			return nil
		})
	}
	for _, w := range waits[len(recvIn):] {
		g.Go(w)
	}
	g.Go(func() error {
		for i, s := range sendIn {
			if err := l.Send(ctx, peer, sb+uint32(i), s); err != nil {
				return err
			}
		}
		// In order, as the ring sends them: a ring peer posts one receive
		// at a time, and a large Send may wait for its receive.
		for i := range res {
			select {
			case <-ready[i]:
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := l.Send(ctx, peer, sb+uint32(len(sendIn)+i), res[i]); err != nil {
				return err
			}
		}
		return nil
	})
	return g.Wait()
}

// post posts the receives of bufs from peer under steps base, base+1, ...
// and returns their waits: with a Poster, all posted on return (on an error,
// the waits of those that were); else each is a Recv in a goroutine of its
// own that posts as soon as it runs, and its wait returns Recv's result.
func post(ctx context.Context, l Link, peer int, base uint32, bufs [][]byte) ([]func() error, error) {
	waits := make([]func() error, 0, len(bufs))
	if p, ok := l.(Poster); ok {
		for i, b := range bufs {
			w, err := p.Post(ctx, peer, base+uint32(i), b)
			if err != nil {
				return waits, err
			}
			waits = append(waits, w)
		}
		return waits, nil
	}
	for i, b := range bufs {
		errc := make(chan error, 1)
		go func() { errc <- l.Recv(ctx, peer, base+uint32(i), b) }()
		waits = append(waits, func() error { return <-errc })
	}
	return waits, nil
}
