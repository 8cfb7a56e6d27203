// Package dtype holds nexar's element types and reduction operators, the
// values of internal/abi as Go types. It is a leaf, so that packages which
// name a dtype or an op (hw/nccl, collective) need not import the
// algorithms; collective re-exports both as aliases.
package dtype

import (
	"fmt"

	"github.com/nexar-go/nexar/internal/abi"
)

// DType is an element type. The numeric values are part of the C ABI
// (nexar_datatype_t) and of the wire signature: append, never renumber.
type DType uint8

const (
	Int8     DType = abi.Int8
	Uint8    DType = abi.Uint8
	Int32    DType = abi.Int32
	Uint32   DType = abi.Uint32
	Int64    DType = abi.Int64
	Uint64   DType = abi.Uint64
	Float16  DType = abi.Float16
	BFloat16 DType = abi.BFloat16
	Float32  DType = abi.Float32
	Float64  DType = abi.Float64
	// NumDTypes is one past the last element type (array bounds).
	NumDTypes DType = abi.NumDTypes
)

// dtypeInfo is internal/abi's table, indexed by value (read-only).
var dtypeInfo = func() (t [NumDTypes]abi.DType) {
	for _, d := range abi.DTypes() {
		t[d.Value] = d
	}
	return t
}()

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d < NumDTypes }

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
	Sum  Op = abi.OpSum
	Prod Op = abi.OpProd
	Min  Op = abi.OpMin
	Max  Op = abi.OpMax
	Avg  Op = abi.OpAvg // floating types only: sum, then divide by the number of ranks
	Band Op = abi.OpBand
	Bor  Op = abi.OpBor
	Bxor Op = abi.OpBxor
	// NumOps is one past the last operator (array bounds).
	NumOps Op = abi.NumOps
)

// opNames is internal/abi's names, indexed by value (read-only).
var opNames = func() (t [NumOps]string) {
	for _, o := range abi.Ops() {
		t[o.Value] = o.Name
	}
	return t
}()

// Valid reports whether o is a known operator.
func (o Op) Valid() bool { return o < NumOps }

func (o Op) String() string {
	if !o.Valid() {
		return fmt.Sprintf("op(%d)", uint8(o))
	}
	return opNames[o]
}
