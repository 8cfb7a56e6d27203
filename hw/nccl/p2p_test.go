//go:build cgo

package nccl

import (
	"bytes"
	"testing"
	"time"

	"github.com/nexar-go/nexar/internal/dtype"
)

// TestFakeSendRecv: ncclSend and ncclRecv between 3 processes of the fake:
// a ring exchange in one group (each rank sends to the next and receives
// from the previous: without the group's joint progress, a message of
// several slots would deadlock), a message larger than the fake's slot, an
// empty one, and a collective after them (its ranks' sequences are not
// shifted by point-to-point work that not every rank made).
func TestFakeSendRecv(t *testing.T) {
	k := asRank(t)
	if k == nil {
		runRanks(t, "TestFakeSendRecv", 3, 2*time.Minute)
		return
	}
	if !k.lib.HasP2P() {
		t.Fatal("the fake NCCL lacks ncclSend/ncclRecv")
	}
	r, n := k.r, k.n
	next, prev := (r+1)%n, (r+n-1)%n
	const count = 200003 // int64: about 1.5 MiB, 25 of the fake's 64 KiB slots
	msg := func(from int) []byte {
		v := make([]float64, count)
		for i := range v {
			v[i] = float64(from*1000000 + i)
		}
		return vals(dtype.Int64, v)
	}
	send := k.dev(msg(r))
	recv := k.dev(make([]byte, count*8))
	err := k.lib.Group(func() error {
		if err := k.c.Send(send, count, dtype.Int64, next, k.stream); err != nil {
			return err
		}
		return k.c.Recv(recv, count, dtype.Int64, prev, k.stream)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := k.read(recv, count*8); !bytes.Equal(got, msg(prev)) {
		t.Fatalf("ring exchange: received the wrong bytes from rank %d", prev)
	}
	// Only ranks 0 and 1 exchange; then every rank makes an allreduce.
	if r < 2 {
		small := k.dev(msg(r)[:64])
		if r == 0 {
			err = k.c.Send(small, 8, dtype.Int64, 1, k.stream)
		} else {
			err = k.c.Recv(small, 8, dtype.Int64, 0, k.stream)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := k.c.Send(small, 0, dtype.Int64, 1-r, k.stream); err != nil { // empty: launches nothing
			t.Fatal(err)
		}
		if got := k.read(small, 64); !bytes.Equal(got, msg(0)[:64]) {
			t.Fatalf("rank %d: the pair's message is wrong", r)
		}
	}
	one := k.dev(vals(dtype.Int64, []float64{float64(r + 1)}))
	if err := k.c.AllReduce(one, one, 1, dtype.Int64, dtype.Sum, k.stream); err != nil {
		t.Fatal(err)
	}
	if got := k.read(one, 8); !bytes.Equal(got, vals(dtype.Int64, []float64{float64(n * (n + 1) / 2)})) {
		t.Fatalf("allreduce after point-to-point work: %v", got)
	}
	if err := k.c.Send(send, 1, dtype.Int64, r, k.stream); err == nil {
		t.Fatal("a send to this rank itself was taken")
	}
}
