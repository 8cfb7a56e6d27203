package membership

import "fmt"

// Error is a failure to form or change the membership. Code is a
// nexar_result_t value (package internal/abi); core turns an Error into its own
// *core.Error with the same code, message and cause.
type Error struct {
	Code  int    // an abi result code, never abi.Success
	Op    string // "seed" or "rendezvous"
	Msg   string
	Cause error
}

func (e *Error) Error() string { return fmt.Sprintf("nexar: %s: %s", e.Op, e.Msg) }

func (e *Error) Unwrap() error { return e.Cause }

func errorf(code int, op string, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Op: op, Msg: fmt.Sprintf(format, args...), Cause: cause}
}
