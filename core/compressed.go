package core

import (
	"context"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/compress"
)

// AllreduceCompressed sums a sparsified buf over the ranks, in place:
// every rank sends k = ceil(ratio*n) of its n elements (package compress
// chooses them), and buf becomes the sum of every rank's contribution,
// zero where no rank sent anything. The result is bit-identical on every
// rank.
//
// TopK: each rank sends its k largest-magnitude elements as (index, value)
// pairs; the pairs of all ranks are gathered and added in rank order, so
// each rank's contribution is counted once, whatever the world size.
// RandomK: every rank sends the same k indices, drawn from seed (which
// must be the same on every rank, e.g. a step counter); the k values are
// allreduced. Without a residual its values are scaled by n/k (unbiased).
//
// residual, when not nil (as long as buf), is the error feedback: the
// input is buf + residual, and residual keeps what this rank did not send.
// It belongs to the caller (one per buffer) and is updated in place.
// Only float32 is supported.
func (c *Comm) AllreduceCompressed(ctx context.Context, buf, residual []byte, dt collective.DType, m compress.Method, ratio float64, seed uint64) error {
	const name = "allreduce_compressed"
	n, err := compressedArgs(name, buf, residual, dt, m, ratio)
	if err != nil {
		return err
	}
	k := compress.K(n, ratio)
	x, res := asF32(buf), asF32(residual)
	idx, vals := compress.Compress(m, x, res, k, seed)
	switch m {
	case compress.TopK:
		// One block per rank: k indices, then k values.
		mine := make([]byte, 8*k)
		copy(mine, bytesOfU32(idx))
		copy(mine[4*k:], bytesOfF32(vals))
		all := make([]byte, 8*k*c.size)
		if err := c.Allgather(ctx, mine, all, collective.Uint8); err != nil {
			return withOp(err, name)
		}
		clear(x)
		for r := 0; r < c.size; r++ {
			blk := all[8*k*r : 8*k*(r+1)]
			if err := compress.Accumulate(x, asU32(blk[:4*k]), asF32(blk[4*k:])); err != nil {
				return newError(CodeInternal, name, r, "rank %d's contribution: %v", r, err)
			}
		}
	case compress.RandomK:
		if err := c.Allreduce(ctx, nil, bytesOfF32(vals), collective.Float32, collective.Sum); err != nil {
			return withOp(err, name)
		}
		clear(x)
		for j, i := range idx {
			x[i] = vals[j]
		}
	}
	return nil
}

// Views of 4-byte elements as bytes and back (the caller checked alignment
// and length; the host is little-endian, as the wire format).
func asF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func asU32(b []byte) []uint32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func bytesOfF32(v []float32) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

func bytesOfU32(v []uint32) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
