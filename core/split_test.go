package core

import (
	"context"
	"fmt"
	"testing"

	"github.com/nexar-go/nexar/collective"
)

func TestSplit(t *testing.T) {
	comms := newLocal(t, 5)
	ctx := context.Background()
	mustAll(t, each(comms, func(c *Comm) error {
		color := c.Rank() % 2
		if c.Rank() == 4 {
			color = -1
		}
		ch, err := c.Split(ctx, color, -c.Rank()) // keys reverse the order
		if err != nil {
			return err
		}
		// A parent collective in flight while the children work.
		preq := c.IAllreduce(nil, make([]byte, 8), collective.Int64, collective.Sum)
		if color < 0 {
			if ch != nil {
				return fmt.Errorf("color -1 got a communicator")
			}
			return preq.Wait(ctx)
		}
		defer ch.Close()
		if ch.Size() != 2 || ch.Rank() != 1-c.Rank()/2 {
			return fmt.Errorf("child rank %d size %d", ch.Rank(), ch.Size())
		}
		a := make([]byte, 8)
		putI64(a, 0, int64(c.Rank()))
		if err := ch.Allreduce(ctx, nil, a, collective.Int64, collective.Sum); err != nil {
			return err
		}
		if want := int64(2*color + 2); i64(a, 0) != want {
			return fmt.Errorf("child sum %d, want %d", i64(a, 0), want)
		}
		if err := preq.Wait(ctx); err != nil {
			return err
		}
		sreq := ch.ISend([]byte{byte(c.Rank())}, 1-ch.Rank(), 5)
		b := make([]byte, 1)
		if _, err := ch.Recv(ctx, b, 1-ch.Rank(), 5); err != nil {
			return err
		}
		if int(b[0]) != c.Rank()^2 {
			return fmt.Errorf("child p2p got %d", b[0])
		}
		return sreq.Wait(ctx)
	}))
}
