// Package collective holds nexar's collective algorithms as pure schedules
// over a small Link interface, plus the element-wise reduction kernels.
//
// Nothing in this package does network I/O of its own: an algorithm is a
// sequence of Send/Recv calls on a Link, so it can be run by N goroutines
// over an in-memory Link in a unit test and by core over a real transport in
// production. The only other package of the module it imports is
// internal/hugepage, for large scratch buffers (huge.go).
package collective

import (
	"context"
	"fmt"

	"github.com/nexar-go/nexar/internal/abi"
)

// DType is an element type. The numeric values are part of the C ABI
// (nexar_datatype_t) and of the wire signature: append, never renumber.
type DType uint8

const (
	Int8      DType = abi.Int8
	Uint8     DType = abi.Uint8
	Int32     DType = abi.Int32
	Uint32    DType = abi.Uint32
	Int64     DType = abi.Int64
	Uint64    DType = abi.Uint64
	Float16   DType = abi.Float16
	BFloat16  DType = abi.BFloat16
	Float32   DType = abi.Float32
	Float64   DType = abi.Float64
	numDTypes DType = abi.NumDTypes
)

// dtypeInfo is internal/abi's table, indexed by value (read-only).
var dtypeInfo = func() (t [numDTypes]abi.DType) {
	for _, d := range abi.DTypes() {
		t[d.Value] = d
	}
	return t
}()

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d < numDTypes }

// Size is the element size in bytes (0 for an invalid type).
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].Size
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d.Valid() && dtypeInfo[d].Float
}

func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].Name
}

// Op is a reduction operator. Values are part of the C ABI (nexar_op_t).
type Op uint8

const (
	Sum    Op = abi.OpSum
	Prod   Op = abi.OpProd
	Min    Op = abi.OpMin
	Max    Op = abi.OpMax
	Avg    Op = abi.OpAvg // floating types only: sum, then divide by the number of ranks
	Band   Op = abi.OpBand
	Bor    Op = abi.OpBor
	Bxor   Op = abi.OpBxor
	numOps Op = abi.NumOps
)

// opNames is internal/abi's names, indexed by value (read-only).
var opNames = func() (t [numOps]string) {
	for _, o := range abi.Ops() {
		t[o.Value] = o.Name
	}
	return t
}()

// Valid reports whether o is a known operator.
func (o Op) Valid() bool { return o < numOps }

func (o Op) String() string {
	if !o.Valid() {
		return fmt.Sprintf("op(%d)", uint8(o))
	}
	return opNames[o]
}

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
