package core

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/nexar-go/nexar/collective"
)

func TestBucketPlan(t *testing.T) {
	bufs := func(sizes ...int) [][]byte {
		out := make([][]byte, len(sizes))
		for i, n := range sizes {
			out[i] = make([]byte, n)
		}
		return out
	}
	type b = bucket
	cases := []struct {
		sizes []int
		max   int
		want  []bucket
	}{
		{nil, 8, nil},
		{[]int{0, 0}, 8, nil},
		{[]int{4, 4, 4}, 8, []b{{0, 2, 8, false, nil}, {2, 3, 4, true, nil}}},
		{[]int{4, 16, 4}, 8, []b{{0, 1, 4, true, nil}, {1, 2, 16, true, nil}, {2, 3, 4, true, nil}}},
		{[]int{0, 4, 0, 4, 0}, 8, []b{{0, 5, 8, false, nil}}},
		{[]int{4, 0, 8}, 8, []b{{0, 2, 4, true, nil}, {2, 3, 8, true, nil}}},
		{[]int{2, 2, 2, 2, 2}, 4, []b{{0, 2, 4, false, nil}, {2, 4, 4, false, nil}, {4, 5, 2, true, nil}}},
	}
	for _, tc := range cases {
		if got := planBuckets(bufs(tc.sizes...), tc.max); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("planBuckets(%v, %d) = %v, want %v", tc.sizes, tc.max, got, tc.want)
		}
	}
}

// multiBufs makes buffers of the given int64 counts holding values that
// identify (rank, buffer, index).
func multiBufs(rank int, counts []int) [][]byte {
	out := make([][]byte, len(counts))
	for i, n := range counts {
		out[i] = make([]byte, 8*n)
		for j := 0; j < n; j++ {
			putI64(out[i], j, int64(rank*1_000_000+i*1000+j))
		}
	}
	return out
}

func checkMulti(t *testing.T, size int, got [][]byte, counts []int) error {
	for i, n := range counts {
		for j := 0; j < n; j++ {
			var want int64
			for r := 0; r < size; r++ {
				want += int64(r*1_000_000 + i*1000 + j)
			}
			if v := i64(got[i], j); v != want {
				return fmt.Errorf("buffer %d [%d] = %d, want %d", i, j, v, want)
			}
		}
	}
	return nil
}

func TestAllreduceMulti(t *testing.T) {
	large := []int{3, 0, 17, 1, 64, 5, 0, 200, 2}
	small := []int{1, 2, 0, 3, 1, 4, 1, 5, 2, 6, 3, 1, 1, 1}
	ctx := context.Background()
	cases := []struct {
		counts []int
		bb     int
	}{
		// 0: the default (one bucket); 8: every buffer direct; 256: a
		// staged bucket, then direct ones for the large buffers.
		{large, 0}, {large, 8}, {large, 256},
		// many staged buckets in a row: the pipeline's every stage
		{small, 16}, {small, 24}, {small, 48},
	}
	for _, n := range []int{1, 2, 3, 5} {
		comms := newLocal(t, n)
		for _, tc := range cases {
			counts, bb := tc.counts, tc.bb
			t.Run(fmt.Sprintf("n%d/%d/bucket%d/inplace", n, len(counts), bb), func(t *testing.T) {
				mustAll(t, each(comms, func(c *Comm) error {
					bufs := multiBufs(c.Rank(), counts)
					if err := c.AllreduceMulti(ctx, nil, bufs, collective.Int64, collective.Sum, bb); err != nil {
						return err
					}
					return checkMulti(t, n, bufs, counts)
				}))
			})
			t.Run(fmt.Sprintf("n%d/%d/bucket%d/send", n, len(counts), bb), func(t *testing.T) {
				mustAll(t, each(comms, func(c *Comm) error {
					send := multiBufs(c.Rank(), counts)
					recv := make([][]byte, len(counts))
					for i := range recv {
						recv[i] = make([]byte, len(send[i]))
					}
					// Buffer 2 in place: its input is in recv.
					copy(recv[2], send[2])
					send[2] = nil
					if err := c.AllreduceMulti(ctx, send, recv, collective.Int64, collective.Sum, bb); err != nil {
						return err
					}
					return checkMulti(t, n, recv, counts)
				}))
			})
		}
	}
}

// A non-blocking bucketed call takes its places in the call order at once:
// a collective issued right after it, before it completes, is matched with
// the same collective on every rank.
func TestIAllreduceMultiOrder(t *testing.T) {
	counts := []int{100, 7, 300, 1}
	comms := newLocal(t, 3)
	mustAll(t, each(comms, func(c *Comm) error {
		bufs := multiBufs(c.Rank(), counts)
		req := c.IAllreduceMulti(nil, bufs, collective.Int64, collective.Sum, 64)
		one := make([]byte, 8)
		putI64(one, 0, int64(c.Rank()+1))
		if err := c.Allreduce(context.Background(), nil, one, collective.Int64, collective.Sum); err != nil {
			return err
		}
		if err := req.Wait(context.Background()); err != nil {
			return err
		}
		if v := i64(one, 0); v != 6 {
			return fmt.Errorf("allreduce after the bucketed call: %d, want 6", v)
		}
		return checkMulti(t, 3, bufs, counts)
	}))
}

func TestAllreduceMultiInvalid(t *testing.T) {
	comms := newLocal(t, 2)
	c := comms[0]
	ctx := context.Background()
	two := [][]byte{make([]byte, 8), make([]byte, 8)}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"op", c.AllreduceMulti(ctx, nil, two, collective.Float32, collective.Band, 0), "band"},
		{"dtype", c.AllreduceMulti(ctx, nil, two, collective.DType(99), collective.Sum, 0), "datatype"},
		{"ragged", c.AllreduceMulti(ctx, nil, [][]byte{make([]byte, 8), make([]byte, 6)}, collective.Float32, collective.Sum, 0), "recv[1]"},
		{"nsend", c.AllreduceMulti(ctx, [][]byte{nil}, two, collective.Float32, collective.Sum, 0), "1 send buffers for 2"},
		{"send len", c.AllreduceMulti(ctx, [][]byte{nil, make([]byte, 4)}, two, collective.Float32, collective.Sum, 0), "send[1]"},
		{"bucket", c.AllreduceMulti(ctx, nil, two, collective.Float32, collective.Sum, -1), "bucket size"},
		{"nonblocking", c.IAllreduceMulti(nil, two, collective.Float32, collective.Max, -5).Wait(ctx), "bucket size"},
	}
	for _, tc := range cases {
		var e *Error
		if !errors.As(tc.err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Msg, tc.want) || e.Op != "allreduce_multi" {
			t.Errorf("%s: got %v, want CodeInvalidArgument from allreduce_multi naming %q", tc.name, tc.err, tc.want)
		}
	}
	// Nothing was sent: both ranks still agree on the next call.
	mustAll(t, each(comms, func(c *Comm) error { return c.Barrier(ctx) }))
}

// Ranks whose buffer lists differ fail as mismatched, never hang.
func TestAllreduceMultiMismatch(t *testing.T) {
	comms := newLocal(t, 2)
	errs := each(comms, func(c *Comm) error {
		counts := []int{4, 4}
		if c.Rank() == 1 {
			counts = []int{4, 5}
		}
		return c.AllreduceMulti(context.Background(), nil, multiBufs(c.Rank(), counts), collective.Int64, collective.Sum, 0)
	})
	for r, err := range errs {
		if CodeOf(err) != CodeMismatch {
			t.Errorf("rank %d: %v, want a mismatch", r, err)
		}
	}
}
