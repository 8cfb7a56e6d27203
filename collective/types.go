// Package collective holds nexar's collective algorithms as pure schedules
// over a small Link interface, plus the element-wise reduction kernels.
//
// Nothing in this package does network I/O of its own: an algorithm is a
// sequence of Send/Recv calls on a Link, so it can be run by N goroutines
// over an in-memory Link in a unit test and by core over a real transport in
// production. The other packages of the module it imports are
// internal/dtype (DType and Op, re-exported here as aliases) and
// internal/hugepage, for large scratch buffers (huge.go).
package collective

import (
	"context"
	"fmt"

	"github.com/nexar-go/nexar/internal/dtype"
)

// DType and Op live in internal/dtype, a leaf, so that hw/nccl names them
// without importing the algorithms; the aliases and constants below keep
// collective.DType and collective.Sum working for every caller.
type (
	DType = dtype.DType
	Op    = dtype.Op
)

const (
	Int8      = dtype.Int8
	Uint8     = dtype.Uint8
	Int32     = dtype.Int32
	Uint32    = dtype.Uint32
	Int64     = dtype.Int64
	Uint64    = dtype.Uint64
	Float16   = dtype.Float16
	BFloat16  = dtype.BFloat16
	Float32   = dtype.Float32
	Float64   = dtype.Float64
	numDTypes = dtype.NumDTypes

	Sum    = dtype.Sum
	Prod   = dtype.Prod
	Min    = dtype.Min
	Max    = dtype.Max
	Avg    = dtype.Avg // floating types only: sum, then divide by the number of ranks
	Band   = dtype.Band
	Bor    = dtype.Bor
	Bxor   = dtype.Bxor
	numOps = dtype.NumOps
)

// Check returns an error when op makes no sense for dt (bitwise ops on
// floats, avg on integers) or either is unknown.
func Check(dt DType, op Op) error {
	switch {
	case !dt.Valid():
		return fmt.Errorf("collective: invalid datatype %d", uint8(dt))
	case !op.Valid():
		return fmt.Errorf("collective: invalid op %d", uint8(op))
	case dt.IsFloat() && (op == Band || op == Bor || op == Bxor):
		return fmt.Errorf("collective: op %s is not defined for floating type %s", op, dt)
	case !dt.IsFloat() && op == Avg:
		return fmt.Errorf("collective: op avg is only defined for floating types, not %s", dt)
	}
	return nil
}

// Link is what an algorithm needs from the world: this rank's place in the
// group, the Tuning of the call, and reliable, ordered, matched byte
// transfer to and from peers.
//
// A message is identified by (peer, step). step is chosen by the algorithm
// and must be unique per direction within one collective call; the caller of
// the algorithm (core) scopes it by communicator and operation sequence
// number, so steps of different calls never meet.
//
// Send may return once data is handed off (it must not alias data after
// returning). A Send of at most InlineSendMax bytes must not wait for the
// matching Recv (schedules rely on it: they send small messages before
// receiving, in one goroutine); larger ones may. Recv fills buf completely with the message sent under the same
// step and returns an error if the message length differs from len(buf).
// Both are safe to call concurrently from several goroutines for different
// (peer, step) pairs.
type Link interface {
	Rank() int
	Size() int
	// Tuning has its defaults filled in (Tuning.WithDefaults); it must
	// be equal on every rank and not change while a call runs.
	Tuning() *Tuning
	Send(ctx context.Context, peer int, step uint32, data []byte) error
	Recv(ctx context.Context, peer int, step uint32, buf []byte) error
}

// Preparer is an optional Link extension for a link whose transport
// registers memory with a NIC (RDMA): Prepare says that pieces of b are
// about to be sent or received by the call, so that b is registered whole,
// once, and its pieces share that registration (as ncclCommRegister does
// for a user buffer) where each piece would make its own. A hint: it
// changes no result.
type Preparer interface {
	Prepare(b []byte)
}

// prepare hands a call's buffers to l's Preparer, if it has one.
func prepare(l Link, bufs ...[]byte) {
	if p, ok := l.(Preparer); ok {
		for _, b := range bufs {
			if len(b) > 0 {
				p.Prepare(b)
			}
		}
	}
}

// Exchanger is an optional Link extension for a send and a receive that
// move together (the step of most schedules): Exchange sends data to `to`
// as messages of at most chunk bytes under steps sbase, sbase+1, ... while
// it receives buf from `from` likewise under rbase, rbase+1, ..., and
// returns once both are done. A Link implements it when it can do better
// than a goroutine per direction (post the receive first, progress both
// from one goroutine). Empty data or buf is one empty message, as in Send
// and Recv.
type Exchanger interface {
	Exchange(ctx context.Context, to int, sbase uint32, data []byte, from int, rbase uint32, buf []byte, chunk int) error
}
