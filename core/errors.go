package core

import (
	"errors"
	"fmt"
)

// Code classifies an Error. Values are stable: capi maps them one to one to
// nexar_result_t, so append, never renumber.
type Code int

const (
	CodeOK              Code = iota // not an error; never carried by an *Error
	CodeInvalidArgument             // bad argument; nothing was sent
	CodeMismatch                    // ranks made incompatible collective calls
	CodePeerDown                    // a peer died or became unreachable
	CodeTimeout                     // a deadline passed
	CodeAborted                     // Abort was called (here or on a peer)
	CodeClosed                      // the communicator was closed
	CodeAuth                        // rendezvous authentication failed
	CodeInternal                    // a bug or an unexpected transport error
	CodeTruncated                   // a receive buffer was smaller than the message
	numCodes
)

// codeNames is the one table of code names; capi maps codes, not names.
var codeNames = [numCodes]string{
	CodeOK:              "ok",
	CodeInvalidArgument: "invalid argument",
	CodeMismatch:        "mismatched collective calls",
	CodePeerDown:        "peer down",
	CodeTimeout:         "timeout",
	CodeAborted:         "aborted",
	CodeClosed:          "closed",
	CodeAuth:            "authentication failed",
	CodeInternal:        "internal error",
	CodeTruncated:       "message truncated",
}

func (c Code) String() string {
	if c < 0 || c >= numCodes {
		return fmt.Sprintf("code(%d)", int(c))
	}
	return codeNames[c]
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
