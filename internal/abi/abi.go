// Package abi is the one source of truth for the values that cross nexar's
// C ABI: result codes, element types, reduction operators and the version.
//
// Go code uses the constants here (core.Code, collective.DType and
// collective.Op are defined from them). The copies other languages need are
// generated from the tables below by `go generate ./internal/abi`: the enums
// and version macros in include/nexar.h, the result strings in capi,
// bindings/python/nexar/_abi.py, the C++ traits in nexar.hpp and the version
// in CMakeLists.txt and pyproject.toml; from the description of the C
// functions (funcs.go), their prototypes in include/nexar.h and their shims
// in capi/entry.c. internal/abi/abigen's test fails when any generated copy
// differs from what these tables produce.
//
// Values are part of the ABI and of the wire: append, never renumber.
// Nothing here is mutable: the tables are returned as fresh slices.
package abi

//go:generate go run ./gen

// The library version (semantic versioning). Version is the same three
// numbers as a string (a test checks that they agree).
const (
	VersionMajor = 0
	VersionMinor = 1
	VersionPatch = 0
	Version      = "0.1.0"
)

// Result codes: nexar_result_t.
const (
	Success            = 0
	ErrInvalidArgument = 1
	ErrInvalidHandle   = 2
	ErrMismatch        = 3
	ErrPeerDown        = 4
	ErrTimeout         = 5
	ErrAborted         = 6
	ErrClosed          = 7
	ErrAuth            = 8
	ErrTruncated       = 9
	ErrUnavailable     = 10
	ErrInternal        = 11
	ErrForked          = 12 // returned by capi's C guard only (capi/entry.c)
	ErrRevoked         = 13
	ErrNoQuorum        = 14
	NumResults         = 15
)

// Element types: nexar_datatype_t.
const (
	Int8      = 0
	Uint8     = 1
	Int32     = 2
	Uint32    = 3
	Int64     = 4
	Uint64    = 5
	Float16   = 6
	BFloat16  = 7
	Float32   = 8
	Float64   = 9
	NumDTypes = 10
)

// Reduction operators: nexar_op_t.
const (
	OpSum  = 0
	OpProd = 1
	OpMin  = 2
	OpMax  = 3
	OpAvg  = 4
	OpBand = 5
	OpBor  = 6
	OpBxor = 7
	NumOps = 8
)

// Result describes one nexar_result_t value.
type Result struct {
	Value   int
	CName   string // enumerator in nexar.h
	Name    string // short lower-case name (core.Code's String)
	Doc     string // comment after the enumerator in nexar.h
	Message string // what nexar_result_string returns
	PyClass string // Python exception class (bindings/python/nexar/_errors.py)
}

// DType describes one nexar_datatype_t value.
type DType struct {
	Value   int
	CName   string // enumerator in nexar.h
	Name    string // lower-case name, as numpy and torch spell it
	Size    int    // bytes per element
	Float   bool   // a floating-point type
	CPPType string // the C++ element type of nexar.hpp's datatype_of
	Doc     string // comment after the enumerator in nexar.h, or ""
}

// Op describes one nexar_op_t value.
type Op struct {
	Value int
	CName string // enumerator in nexar.h
	Name  string // lower-case name
	Doc   string // comment after the enumerator in nexar.h, or ""
}

// Results returns every result code, in value order.
func Results() []Result {
	return []Result{
		{Success, "NEXAR_SUCCESS", "ok", "", "success", ""},
		{ErrInvalidArgument, "NEXAR_ERR_INVALID_ARGUMENT", "invalid argument",
			"bad pointer, count, datatype, op, root, peer, config",
			"invalid argument (see nexar_last_error)", "InvalidArgumentError"},
		{ErrInvalidHandle, "NEXAR_ERR_INVALID_HANDLE", "invalid handle",
			"unknown, NULL or destroyed comm/request handle",
			"invalid handle: unknown, NULL or already destroyed", "InvalidHandleError"},
		{ErrMismatch, "NEXAR_ERR_MISMATCH", "mismatched collective calls",
			"ranks made different collective calls",
			"ranks made mismatched collective calls", "MismatchError"},
		{ErrPeerDown, "NEXAR_ERR_PEER_DOWN", "peer down",
			"a peer process died or became unreachable", "peer down", "PeerDownError"},
		{ErrTimeout, "NEXAR_ERR_TIMEOUT", "timeout",
			"the operation did not finish in time", "timeout", "TimeoutError"},
		{ErrAborted, "NEXAR_ERR_ABORTED", "aborted",
			"the communicator was aborted", "communicator aborted", "AbortedError"},
		{ErrClosed, "NEXAR_ERR_CLOSED", "closed",
			"the communicator was closed", "communicator closed", "ClosedError"},
		{ErrAuth, "NEXAR_ERR_AUTH", "authentication failed",
			"authentication with the seed or a peer failed", "authentication failed", "AuthError"},
		{ErrTruncated, "NEXAR_ERR_TRUNCATED", "message truncated",
			"a message was larger than the receive buffer",
			"message truncated: larger than the receive buffer", "TruncatedError"},
		{ErrUnavailable, "NEXAR_ERR_UNAVAILABLE", "unavailable",
			"a feature or device is not available", "feature or device unavailable", "UnavailableError"},
		{ErrInternal, "NEXAR_ERR_INTERNAL", "internal error",
			"a bug in nexar; the message says more",
			"internal error (see nexar_last_error)", "InternalError"},
		{ErrForked, "NEXAR_ERR_FORKED", "used after fork",
			"called in a child made by fork() without exec()",
			"called in a child made by fork() without exec(); the library is unusable there", "ForkedProcessError"},
		{ErrRevoked, "NEXAR_ERR_REVOKED", "revoked",
			"the communicator was revoked; agree and shrink still work on it",
			"communicator revoked", "RevokedError"},
		{ErrNoQuorum, "NEXAR_ERR_NO_QUORUM", "no quorum",
			"this side of a failure or partition lacks a quorum of the last membership",
			"no quorum: this side of the job must not continue", "NoQuorumError"},
	}
}

// DTypes returns every element type, in value order.
func DTypes() []DType {
	return []DType{
		{Int8, "NEXAR_INT8", "int8", 1, false, "std::int8_t", ""},
		{Uint8, "NEXAR_UINT8", "uint8", 1, false, "std::uint8_t", ""},
		{Int32, "NEXAR_INT32", "int32", 4, false, "std::int32_t", ""},
		{Uint32, "NEXAR_UINT32", "uint32", 4, false, "std::uint32_t", ""},
		{Int64, "NEXAR_INT64", "int64", 8, false, "std::int64_t", ""},
		{Uint64, "NEXAR_UINT64", "uint64", 8, false, "std::uint64_t", ""},
		{Float16, "NEXAR_FLOAT16", "float16", 2, true, "float16", "IEEE 754 binary16"},
		{BFloat16, "NEXAR_BFLOAT16", "bfloat16", 2, true, "bfloat16", "bfloat16 (upper half of a float32)"},
		{Float32, "NEXAR_FLOAT32", "float32", 4, true, "float", ""},
		{Float64, "NEXAR_FLOAT64", "float64", 8, true, "double", ""},
	}
}

// Ops returns every reduction operator, in value order.
func Ops() []Op {
	return []Op{
		{OpSum, "NEXAR_SUM", "sum", ""},
		{OpProd, "NEXAR_PROD", "prod", ""},
		{OpMin, "NEXAR_MIN", "min", ""},
		{OpMax, "NEXAR_MAX", "max", ""},
		{OpAvg, "NEXAR_AVG", "avg", "sum divided by the number of ranks"},
		{OpBand, "NEXAR_BAND", "band", ""},
		{OpBor, "NEXAR_BOR", "bor", ""},
		{OpBxor, "NEXAR_BXOR", "bxor", ""},
	}
}
