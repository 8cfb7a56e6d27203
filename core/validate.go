package core

import (
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/compress"
)

// This file checks the arguments of the public calls. Arguments are
// validated once, here, before a call takes a sequence number: core is the
// API every binding reaches. capi only converts C values (ranges of C ints,
// null pointers, handles, byte sizes that overflow) and Python only
// converts objects to buffers.

// elems checks that a buffer holds whole elements and returns the count.
func elems(op, name string, b []byte, dt collective.DType) (int, error) {
	if !dt.Valid() {
		return 0, invalidArg(op, "invalid datatype %d", uint8(dt))
	}
	if len(b)%dt.Size() != 0 {
		return 0, invalidArg(op, "%s: length %d bytes is not a multiple of the %s size %d", name, len(b), dt, dt.Size())
	}
	return len(b) / dt.Size(), nil
}

func (c *Comm) checkRoot(op string, root int) error {
	if root < 0 || root >= c.size {
		return invalidArg(op, "root %d is out of range [0, %d)", root, c.size)
	}
	return nil
}

func checkOp(op string, dt collective.DType, o collective.Op) error {
	if err := collective.Check(dt, o); err != nil {
		return &Error{Code: CodeInvalidArgument, Op: op, Rank: -1, Msg: err.Error(), Cause: err}
	}
	return nil
}

// bytesV converts element counts and displacements to bytes, checking that
// every block lies within a buffer of n elements.
func (c *Comm) bytesV(op, what string, counts, displs []int, n int, dt collective.DType) ([]int, []int, int, error) {
	if len(counts) != c.size || len(displs) != c.size {
		return nil, nil, 0, invalidArg(op, "%scounts and %sdispls need %d entries, got %d and %d", what, what, c.size, len(counts), len(displs))
	}
	es := dt.Size()
	bc, bd := make([]int, c.size), make([]int, c.size)
	total := 0
	for i := range counts {
		if counts[i] < 0 || displs[i] < 0 || counts[i] > n || displs[i] > n-counts[i] {
			return nil, nil, 0, invalidArg(op, "%scounts[%d]=%d, %sdispls[%d]=%d do not fit the %d-element buffer", what, i, counts[i], what, i, displs[i], n)
		}
		bc[i], bd[i] = counts[i]*es, displs[i]*es
		total += counts[i]
	}
	return bc, bd, total, nil
}

func (c *Comm) invalid(op string, err error) *Request { return doneRequest(c, op, err) }

func (c *Comm) sameShape(name string, send, recv []byte, dt collective.DType, op collective.Op) (int, error) {
	if err := checkOp(name, dt, op); err != nil {
		return 0, err
	}
	n, err := elems(name, "recv", recv, dt)
	if err != nil {
		return 0, err
	}
	if send != nil && len(send) != len(recv) {
		return 0, invalidArg(name, "send has %d bytes but recv has %d", len(send), len(recv))
	}
	return n, nil
}

// blocks checks small == nil or len(big) == Size()*len(small) and returns
// the elements per block.
func (c *Comm) blocks(name string, small, big []byte, dt collective.DType) (int, error) {
	n, err := elems(name, "recv", big, dt)
	if err != nil {
		return 0, err
	}
	if n%c.size != 0 {
		return 0, invalidArg(name, "%d elements do not split into %d equal blocks", n, c.size)
	}
	if small != nil && len(small)*c.size != len(big) {
		return 0, invalidArg(name, "block of %d bytes times %d ranks != %d bytes", len(small), c.size, len(big))
	}
	return n / c.size, nil
}

// multiShape checks the buffers of a bucketed allreduce: send is nil (all
// in place) or has one entry per recv, each nil (in place) or as long as
// its recv; every recv holds whole elements; bucketBytes >= 0 (0: the
// default). It returns the total element count.
func multiShape(name string, send, recv [][]byte, dt collective.DType, op collective.Op, bucketBytes int) (int, error) {
	if err := checkOp(name, dt, op); err != nil {
		return 0, err
	}
	if bucketBytes < 0 {
		return 0, invalidArg(name, "bucket size %d bytes is negative", bucketBytes)
	}
	if send != nil && len(send) != len(recv) {
		return 0, invalidArg(name, "%d send buffers for %d recv buffers", len(send), len(recv))
	}
	total := 0
	for i, r := range recv {
		n, err := elems(name, fmt.Sprintf("recv[%d]", i), r, dt)
		if err != nil {
			return 0, err
		}
		if send != nil && send[i] != nil && len(send[i]) != len(r) {
			return 0, invalidArg(name, "send[%d] has %d bytes but recv[%d] has %d", i, len(send[i]), i, len(r))
		}
		total += n
	}
	return total, nil
}

// compressedArgs checks the arguments of a compressed allreduce: float32
// buffers (4-byte aligned, whole elements), a residual as long as buf or
// nil, a known method and a ratio in (0, 1]. It returns the element count.
func compressedArgs(name string, buf, residual []byte, dt collective.DType, m compress.Method, ratio float64) (int, error) {
	if dt != collective.Float32 {
		return 0, invalidArg(name, "datatype %s is not supported (float32 only)", dt)
	}
	n, err := elems(name, "buf", buf, dt)
	if err != nil {
		return 0, err
	}
	if residual != nil && len(residual) != len(buf) {
		return 0, invalidArg(name, "residual has %d bytes but buf has %d", len(residual), len(buf))
	}
	if misaligned(buf) || misaligned(residual) {
		return 0, invalidArg(name, "buf and residual must be 4-byte aligned")
	}
	if !m.Valid() {
		return 0, invalidArg(name, "invalid compression method %d", uint8(m))
	}
	if err := compress.CheckRatio(ratio); err != nil {
		return 0, invalidArg(name, "%v", err)
	}
	return n, nil
}

func misaligned(b []byte) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%4 != 0
}
