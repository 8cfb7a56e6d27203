package core

import (
	"errors"
	"fmt"

	"github.com/nexar-go/nexar/internal/abi"
)

// Code classifies an Error. Its values are nexar_result_t's (internal/abi
// is the one source of both), so capi returns a Code as it is; they also
// travel on the wire (an abort carries its code), so they are appended,
// never renumbered.
type Code int

const (
	CodeOK              Code = abi.Success            // not an error; never carried by an *Error
	CodeInvalidArgument Code = abi.ErrInvalidArgument // bad argument; nothing was sent
	CodeMismatch        Code = abi.ErrMismatch        // ranks made incompatible collective calls
	CodePeerDown        Code = abi.ErrPeerDown        // a peer died or became unreachable
	CodeTimeout         Code = abi.ErrTimeout         // a deadline passed
	CodeAborted         Code = abi.ErrAborted         // Abort was called (here or on a peer)
	CodeClosed          Code = abi.ErrClosed          // the communicator was closed
	CodeAuth            Code = abi.ErrAuth            // rendezvous authentication failed
	CodeTruncated       Code = abi.ErrTruncated       // a receive buffer was smaller than the message
	CodeUnavailable     Code = abi.ErrUnavailable     // a feature or device is not available
	CodeInternal        Code = abi.ErrInternal        // a bug or an unexpected transport error
	CodeRevoked         Code = abi.ErrRevoked         // the communicator was revoked (Revoke, here or on a peer)
	CodeNoQuorum        Code = abi.ErrNoQuorum        // this side of a failure lacks a quorum of the membership
	numCodes            Code = abi.NumResults
)

func (c Code) String() string {
	if c < 0 || c >= numCodes {
		return fmt.Sprintf("code(%d)", int(c))
	}
	return abi.Results()[c].Name
}

// Error is the type of every error that core returns. Rank is the rank the
// error is about (the dead peer, the mismatching caller), or -1.
type Error struct {
	Code  Code
	Op    string // the operation that failed, e.g. "allreduce", "rendezvous"
	Rank  int
	Msg   string
	Cause error
}

func (e *Error) Error() string {
	op := e.Op
	if op == "" {
		op = "comm"
	}
	return "core: " + op + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Cause }

// Is makes errors.Is(err, &Error{Code: c}) match by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Msg == "" && t.Code == e.Code
}

// CodeOf returns the Code of err: CodeOK for nil, CodeInternal for an error
// that is not an *Error.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

func newError(code Code, op string, rank int, format string, args ...any) *Error {
	return &Error{Code: code, Op: op, Rank: rank, Msg: fmt.Sprintf(format, args...)}
}

func invalidArg(op, format string, args ...any) *Error {
	return newError(CodeInvalidArgument, op, -1, format, args...)
}

// withOp returns err re-labelled for op, keeping code, rank and message, so
// a sticky failure reports the operation that ran into it.
func withOp(err error, op string) error {
	var e *Error
	if !errors.As(err, &e) {
		return &Error{Code: CodeInternal, Op: op, Rank: -1, Msg: err.Error(), Cause: err}
	}
	if e.Op == op {
		return e
	}
	c := *e
	c.Op = op
	c.Cause = e
	return &c
}
