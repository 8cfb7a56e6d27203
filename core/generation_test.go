package core

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nexar-go/nexar/transport"
)

// A message sent in another membership generation is dropped by the
// receiver, even one that a posted receive would match; the same message
// sent in the receiver's generation is taken.
func TestOtherGenerationDropped(t *testing.T) {
	comms, err := testNewLocal(2, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	r0, r1 := comms[0], comms[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(gen uint32, data []byte) {
		var th transport.Header
		(&header{kind: kindP2P, comm: r1.id, seqOrTag: 7, total: uint64(len(data))}).encode(&th, r1.gen)
		th[48] = byte(gen) // overwrite the generation encode wrote
		if err := r1.n.ep.Send(ctx, 0, transport.LaneData, &th, data); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 4)
	req := r0.IRecv(buf, 1, 7)
	send(uint32(r1.gen)+1, []byte("late")) // a later membership's
	send(uint32(r1.gen), []byte("good"))
	if err := req.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, []byte("good")) {
		t.Fatalf("received %q, want %q: a message of another generation was taken", buf, "good")
	}
	if n := r0.n.stale.Load(); n != 1 {
		t.Fatalf("%d messages counted as another generation's, want 1", n)
	}
}
