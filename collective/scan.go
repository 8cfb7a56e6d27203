package collective

import (
	"context"
	"fmt"
)

// Scan leaves in recv of rank r the reduction of send over ranks 0..r
// (inclusive prefix; Avg divides by r+1). send == nil means in place.
func Scan(ctx context.Context, l Link, send, recv []byte, dt DType, op Op) error {
	return scan(ctx, l, send, recv, dt, op, false)
}

// Exscan leaves in recv of rank r > 0 the reduction of send over ranks
// 0..r-1 (Avg divides by r); rank 0's recv is left unchanged, as in MPI.
// send == nil means in place.
func Exscan(ctx context.Context, l Link, send, recv []byte, dt DType, op Op) error {
	return scan(ctx, l, send, recv, dt, op, true)
}

func scan(ctx context.Context, l Link, send, recv []byte, dt DType, op Op, exclusive bool) error {
	name := "scan"
	if exclusive {
		name = "exscan"
	}
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := Check(dt, op); err != nil {
		return err
	}
	if send != nil && len(send) != len(recv) {
		return fmt.Errorf("collective: %s send has %d bytes, recv %d", name, len(send), len(recv))
	}
	if err := checkElems(name, len(recv), dt); err != nil {
		return err
	}
	auto := AlgoRecursiveDoubling
	if len(recv) >= l.Tuning().ScanChainThreshold {
		auto = AlgoPipeline
	}
	algo, err := choose(name, l.Tuning().Force.Scan, auto, AlgoRecursiveDoubling, AlgoPipeline)
	if err != nil {
		return err
	}
	if len(recv) == 0 || (exclusive && size == 1) {
		return nil
	}
	if size == 1 {
		if send != nil {
			copy(recv, send)
		}
		return nil
	}
	own := send
	if own == nil {
		own = append([]byte(nil), recv...)
	}
	var st steps
	st.init(l)
	o := redOp(op)
	if algo == AlgoPipeline {
		err = st.chainScan(ctx, l, own, recv, dt, o, exclusive)
	} else {
		err = st.doublingScan(ctx, l, own, recv, dt, o, exclusive)
	}
	if err != nil {
		return err
	}
	if op == Avg {
		switch {
		case !exclusive:
			FinishAvg(recv, dt, rank+1)
		case rank > 0:
			FinishAvg(recv, dt, rank)
		}
	}
	return nil
}

// chainScan passes the running prefix down the chain 0 -> 1 -> ... -> size-1
// segment by segment, so large buffers stream through every rank.
func (st *steps) chainScan(ctx context.Context, l Link, own, recv []byte, dt DType, op Op, exclusive bool) error {
	rank, size := l.Rank(), l.Size()
	prev, next := rank-1, rank+1
	if next == size {
		next = -1
	}
	if !exclusive {
		// recv = prefix(0..r-1) op own, forwarded as it completes.
		copy(recv, own)
		if rank == 0 {
			return st.pipeline(ctx, l, -1, nil, next, recv, nil)
		}
		tmp := scratchOf(l).Get(len(recv))
		defer scratchOf(l).Put(tmp)
		return st.pipeline(ctx, l, prev, tmp, next, recv, func(lo, hi int) {
			ReduceInto(recv[lo:hi], tmp[lo:hi], dt, op)
		})
	}
	// Exclusive: recv = prefix(0..r-1); forward prefix op own.
	if rank == 0 {
		return st.pipeline(ctx, l, -1, nil, next, own, nil)
	}
	if next < 0 {
		return st.pipeline(ctx, l, prev, recv, -1, recv, nil)
	}
	fwd := append([]byte(nil), own...)
	return st.pipeline(ctx, l, prev, recv, next, fwd, func(lo, hi int) {
		ReduceInto(fwd[lo:hi], recv[lo:hi], dt, op)
	})
}

// doublingScan is MPICH's recursive-doubling scan: partial holds the
// reduction over the block of ranks this rank has heard from so far; at
// distance mask it swaps partial with rank^mask and, if the partner is
// lower, also folds the partner's partial into the result.
func (st *steps) doublingScan(ctx context.Context, l Link, own, recv []byte, dt DType, op Op, exclusive bool) error {
	rank, size := l.Rank(), l.Size()
	partial := append(scratchOf(l).Get(len(own))[:0], own...)
	tmp := scratchOf(l).Get(len(own))
	defer scratchOf(l).Put(partial)
	defer scratchOf(l).Put(tmp)
	if !exclusive {
		copy(recv, own)
	}
	have := false // exclusive: whether recv holds anything yet
	for mask := 1; mask < size; mask <<= 1 {
		peer := rank ^ mask
		if peer >= size {
			continue
		}
		if err := st.exchange(ctx, l, peer, partial, peer, tmp); err != nil {
			return err
		}
		if peer < rank {
			if exclusive && !have {
				have = true
				copy(recv, tmp)
			} else {
				ReduceInto(recv, tmp, dt, op)
			}
			// Lower ranks' data goes first: partial = tmp op partial.
			ReduceInto(tmp, partial, dt, op)
			partial, tmp = tmp, partial
		} else {
			ReduceInto(partial, tmp, dt, op)
		}
	}
	return nil
}
