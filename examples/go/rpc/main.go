// Command rpc shows nexar's RPC: every rank serves function 1, which squares
// an int64, and rank 0 calls every rank at once and prints the replies.
// Start it with the launcher:
//
//	nexar run -n 4 -- ./rpc
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"github.com/nexar-go/nexar/core"

	"github.com/nexar-go/nexar/transport/mesh"
)

const square = 1 // the function id

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rpc:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	comm, err := core.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer comm.Close()

	comm.Register(square, func(_ context.Context, from int, req []byte) ([]byte, error) {
		if len(req) != 8 {
			return nil, fmt.Errorf("want an 8-byte int64, got %d bytes", len(req))
		}
		v := int64(binary.LittleEndian.Uint64(req))
		return binary.LittleEndian.AppendUint64(nil, uint64(v*v)), nil
	})
	if err := comm.Barrier(ctx); err != nil { // every rank serves from here
		return err
	}
	if comm.Rank() == 0 {
		calls := make([]*core.Call, comm.Size())
		for r := range calls { // all in flight at once
			calls[r] = comm.ICall(r, square, binary.LittleEndian.AppendUint64(nil, uint64(r+2)))
		}
		for r, call := range calls {
			reply, err := call.Wait(ctx)
			if err != nil {
				return err
			}
			got := int64(binary.LittleEndian.Uint64(reply))
			if want := int64((r + 2) * (r + 2)); got != want {
				return fmt.Errorf("rank %d answered %d, want %d", r, got, want)
			}
			fmt.Printf("rank %d: %d squared is %d\n", r, r+2, got)
		}
		if _, err := comm.CallRPC(ctx, 0, square, []byte("x")); err != nil {
			fmt.Printf("a bad request fails at the caller: %v\n", err)
		} else {
			return fmt.Errorf("a bad request succeeded")
		}
	}
	return comm.Barrier(ctx) // nobody leaves while rank 0 still calls
}
