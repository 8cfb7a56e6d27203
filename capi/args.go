package main

// #include "capi.h"
import "C"

import (
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
)

// maxBytes bounds one buffer: far beyond any real buffer, and below the
// limit where unsafe.Slice would panic.
const maxBytes = 1 << 46

// args checks the arguments of one call. The first failure is kept; later
// checks are skipped, so a call reports the first bad argument in order.
type args struct {
	fn     string
	code   C.int
	msg    string
	dev    hier.Call // the device side of the call (capi/devmem.go)
	devSet bool      // dev was begun
}

func (a *args) ok() bool { return a.code == resSuccess }

func (a *args) failf(code C.int, format string, v ...any) {
	if a.ok() {
		a.code, a.msg = code, fmt.Sprintf(format, v...)
	}
}

// fail reports the recorded failure as the call's result (returning any
// staging buffers lent to the call).
func (a *args) fail() C.int {
	a.dev.Release()
	return fail(a.fn, a.code, "%s", a.msg)
}

// comm returns the communicator handle h stands for now: the one it was
// made with or, under the shrink policy, the survivors' communicator that
// carries on for it (waiting for an automatic shrink in progress, bounded
// by its own deadline; a failed shrink is the call's error).
func (a *args) comm(h C.uintptr_t) *core.Comm {
	c := a.baseComm(h)
	if c == nil {
		return nil
	}
	cur, err := c.Successor(bg)
	if err != nil {
		a.failf(C.int(core.CodeOf(err)), "%v", err)
		return nil
	}
	return cur
}

// baseComm returns the communicator handle h was made with (failure
// handlers, nexar_comm_get_failed and nexar_comm_destroy use it).
func (a *args) baseComm(h C.uintptr_t) *core.Comm {
	if !a.ok() {
		return nil
	}
	c, ok := comms.get(uintptr(h))
	if !ok {
		a.failf(resInvalidHandle, "comm %#x is not a valid communicator (never created, or destroyed)", uintptr(h))
	}
	return c
}

func (a *args) dtype(dt C.int) collective.DType {
	if !a.ok() {
		return 0
	}
	if dt < 0 || !collective.DType(dt).Valid() || C.int(collective.DType(dt)) != dt {
		a.failf(resInvalidArgument, "dt %d is not a nexar_datatype_t", int(dt))
		return 0
	}
	return collective.DType(dt)
}

func (a *args) dtypeOp(dt, op C.int) (collective.DType, collective.Op) {
	t := a.dtype(dt)
	if !a.ok() {
		return 0, 0
	}
	if op < 0 || !collective.Op(op).Valid() || C.int(collective.Op(op)) != op {
		a.failf(resInvalidArgument, "op %d is not a nexar_op_t", int(op))
		return 0, 0
	}
	// Whether op is defined for dt is core's to check (core/validate.go):
	// arguments are validated once, there; capi only converts.
	return t, collective.Op(op)
}

// bytes returns count*mult elements of dt in bytes, failing on overflow.
func (a *args) bytes(name string, count C.size_t, mult int, dt collective.DType) int {
	if !a.ok() {
		return 0
	}
	hi, n := bits.Mul64(uint64(count), uint64(mult))
	hi2, n2 := bits.Mul64(n, uint64(dt.Size()))
	if hi != 0 || hi2 != 0 || n2 > maxBytes {
		if mult == 1 {
			a.failf(resInvalidArgument, "%s %d: %s elements overflow the byte size", name, uint64(count), dt)
		} else {
			a.failf(resInvalidArgument, "%s %d x %d ranks: %s elements overflow the byte size", name, uint64(count), mult, dt)
		}
		return 0
	}
	return int(n2)
}

// buf wraps n bytes of C memory at p. Empty buffers are a non-nil empty
// slice, because nil means "in place" to core. Device memory is refused, or
// staged where the entry point allows it (dbuf, capi/devmem.go): a
// "sendbuf" is only read, any other buffer is read and written.
func (a *args) buf(name string, p unsafe.Pointer, n int) []byte {
	return a.dbuf(name, p, n, true, name != "sendbuf")
}

// rank checks that r names a member of a world of size n.
func (a *args) rank(name string, r C.int, n int, anySource bool) int {
	if !a.ok() {
		return 0
	}
	if anySource && r == -1 {
		return core.AnySource
	}
	if r < 0 || int(r) >= n {
		a.failf(resInvalidArgument, "%s %d is out of range [0, %d)", name, int(r), n)
	}
	return int(r)
}

// out checks that an out-parameter is not NULL.
func (a *args) out(name string, p unsafe.Pointer) {
	if a.ok() && p == nil {
		a.failf(resInvalidArgument, "%s is NULL", name)
	}
}

// counts reads n size_t entries of a counts or displacements array.
func (a *args) counts(name string, p *C.size_t, n int) []int {
	if !a.ok() {
		return nil
	}
	if p == nil {
		a.failf(resInvalidArgument, "%s is NULL", name)
		return nil
	}
	src := unsafe.Slice(p, n)
	out := make([]int, n)
	for i, v := range src {
		if uint64(v) > maxBytes {
			a.failf(resInvalidArgument, "%s[%d] = %d is too large", name, i, uint64(v))
			return nil
		}
		out[i] = int(v)
	}
	return out
}

// extent returns the bytes a buffer must span for blocks (counts[i]
// elements at element offset displs[i]) of dt.
func (a *args) extent(name string, counts, displs []int, dt collective.DType) int {
	if !a.ok() {
		return 0
	}
	end := 0
	for i := range counts {
		if counts[i] == 0 {
			continue
		}
		if e := displs[i] + counts[i]; e > end {
			end = e
		}
	}
	return a.bytes(name+" extent", C.size_t(end), 1, dt)
}

// same reports whether p and q are the same non-NULL pointer: in place.
func same(p, q unsafe.Pointer) bool { return p != nil && p == q }
