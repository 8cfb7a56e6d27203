// Package nccl is nexar's optional binding to NCCL, loaded at run time with
// dlopen (Default: libnccl.so.2 or libnccl.so; Open: a
// given path) so that nexar builds and runs where NCCL is not installed. It
// binds what the hierarchical device collectives (package hier) need:
// version, unique id, communicator init, destroy and abort, the
// asynchronous error, allreduce, reduce, broadcast, allgather,
// reduce-scatter and groups, with nexar's DType and Op mapped onto NCCL's
// enums. Collectives follow NCCL's semantics: they enqueue work on a CUDA
// stream and return; the results are there once the stream has passed.
//
// Available fails unless both the library loads and hw/cuda sees a device.
// A Comm follows NCCL's rules (see Comm); a Library and the package-level
// functions are safe for concurrent use. tests/fakes/nccl is a stand-in
// that runs against the fake CUDA runtime.
package nccl

import (
	"errors"
	"fmt"

	"github.com/nexar-go/nexar/internal/dtype"
)

// Verified says, for `nexar info`, where the hierarchical device
// collectives over NCCL (package hier) have run: kept in step with
// docs/device-memory.md.
const Verified = "hierarchical device collectives (NCCL within a host, nexar between hosts): tested against the fake NCCL and CUDA runtime (tests/fakes) only, not verified on hardware"

// ErrNoLibrary is returned (wrapped) when libnccl cannot be loaded.
var ErrNoLibrary = errors.New("hw/nccl: libnccl.so not found")

// UniqueID is ncclUniqueId: the opaque bootstrap token rank 0 creates and
// every rank passes to NewComm (nexar sends it over its control plane).
type UniqueID [128]byte

var libNames = []string{"libnccl.so.2", "libnccl.so"}

// ncclDataType_t values (nccl.h, NCCL 2.x).
const (
	ncclInt8     = 0
	ncclUint8    = 1
	ncclInt32    = 2
	ncclUint32   = 3
	ncclInt64    = 4
	ncclUint64   = 5
	ncclFloat16  = 6
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBfloat16 = 9
)

// ncclRedOp_t values; ncclAvg needs NCCL ≥ 2.10.
const (
	ncclSum  = 0
	ncclProd = 1
	ncclMax  = 2
	ncclMin  = 3
	ncclAvg  = 4
)

// DType maps a nexar element type to ncclDataType_t.
func DType(d dtype.DType) (int, error) {
	switch d {
	case dtype.Int8:
		return ncclInt8, nil
	case dtype.Uint8:
		return ncclUint8, nil
	case dtype.Int32:
		return ncclInt32, nil
	case dtype.Uint32:
		return ncclUint32, nil
	case dtype.Int64:
		return ncclInt64, nil
	case dtype.Uint64:
		return ncclUint64, nil
	case dtype.Float16:
		return ncclFloat16, nil
	case dtype.BFloat16:
		return ncclBfloat16, nil
	case dtype.Float32:
		return ncclFloat32, nil
	case dtype.Float64:
		return ncclFloat64, nil
	}
	return 0, fmt.Errorf("hw/nccl: no NCCL datatype for %v", d)
}

// Op maps a nexar reduction to ncclRedOp_t. NCCL has no bitwise
// reductions: those fail here, and the caller falls back to the host path.
func Op(o dtype.Op) (int, error) {
	switch o {
	case dtype.Sum:
		return ncclSum, nil
	case dtype.Prod:
		return ncclProd, nil
	case dtype.Max:
		return ncclMax, nil
	case dtype.Min:
		return ncclMin, nil
	case dtype.Avg:
		return ncclAvg, nil
	}
	return 0, fmt.Errorf("hw/nccl: op %v is not supported by NCCL", o)
}

// Version splits NCCL's version code (major*10000+minor*100+patch since
// 2.9, major*1000+minor*100+patch before).
func Version(code int) (major, minor, patch int) {
	if code >= 10000 {
		return code / 10000, code % 10000 / 100, code % 100
	}
	return code / 1000, code % 1000 / 100, code % 100
}

// Error is an NCCL result code with its message.
type Error struct {
	Func string
	Code int
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("hw/nccl: %s: %s (ncclResult %d)", e.Func, e.Msg, e.Code)
}
