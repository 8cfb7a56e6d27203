package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

// elastic is the chaos suite's rank: it allreduces (rank+1, world rank)
// and checks the result on the communicator that carries on for the world
// (Successor), through every loss, until that has want ranks; then more
// rounds, and a clean close counted for leaks.
func elastic(ctx context.Context, cfg core.Config, args []string) error {
	if len(args) != 2 {
		return errors.New("usage: testprog elastic FINAL_SIZE ROUNDS")
	}
	want, err1 := strconv.Atoi(args[0])
	rounds, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil {
		return errors.New("usage: testprog elastic FINAL_SIZE ROUNDS")
	}
	if cfg.OnFailure != core.PolicyShrink {
		return errors.New("elastic needs NEXAR_ON_FAILURE=shrink")
	}
	baseG, baseFD := runtime.NumGoroutine(), countFDs()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	world, err := core.New(ctx, cfg)
	if err != nil {
		return err
	}
	me := world.Rank()
	fmt.Printf("READY rank=%d size=%d pid=%d\n", me, world.Size(), os.Getpid())
	fmt.Printf("LOOPING rank=%d\n", me)
	c := world
	faulted := false
	done := 0
	const k = 256
	buf := make([]byte, 16*k)
	for i := 0; done < rounds; i++ {
		if i > 100000 {
			return fmt.Errorf("rank %d: still %d ranks after %d rounds, want %d", me, c.Size(), i, want)
		}
		for j := 0; j < k; j++ {
			binary.LittleEndian.PutUint64(buf[16*j:], uint64(c.Rank()+1+j))
			binary.LittleEndian.PutUint64(buf[16*j+8:], uint64(me))
		}
		err := c.Allreduce(ctx, nil, buf, collective.Int64, collective.Sum)
		if err != nil {
			var e *core.Error
			if !errors.As(err, &e) || (e.Code != core.CodePeerDown && e.Code != core.CodeRevoked) {
				return fmt.Errorf("rank %d: allreduce on %d ranks: %w", me, c.Size(), err)
			}
			if !faulted {
				fmt.Printf("FAULT rank=%d at=%d size=%d err=%q\n", me, time.Now().UnixNano(), c.Size(), err.Error())
			}
			faulted = true
			next, serr := c.Successor(ctx)
			if serr != nil {
				switch code := core.CodeOf(serr); {
				case code == core.CodeNoQuorum:
					fmt.Printf("NOQUORUM rank=%d at=%d err=%q\n", me, time.Now().UnixNano(), serr.Error())
				case code == core.CodePeerDown && e.Rank == me:
					fmt.Printf("EXCLUDED rank=%d err=%q\n", me, serr.Error())
				}
				return fmt.Errorf("rank %d: no successor: %w", me, serr)
			}
			if next == c {
				return fmt.Errorf("rank %d: the shrink policy gave no successor after %v", me, err)
			}
			c = next
			continue
		}
		n := c.Size()
		for j := 0; j < k; j++ {
			if got, w := binary.LittleEndian.Uint64(buf[16*j:]), uint64(n*(n+1)/2+n*j); got != w {
				return fmt.Errorf("rank %d: element %d on %d ranks: %d, want %d", me, j, n, got, w)
			}
		}
		if faulted {
			fmt.Printf("RECOVERED rank=%d at=%d size=%d\n", me, time.Now().UnixNano(), n)
			faulted = false
		}
		if n == want {
			done++
		}
		if n < want {
			return fmt.Errorf("rank %d: %d ranks left, want %d", me, n, want)
		}
	}
	// The members: the world ranks of the final communicator, summed and
	// xored, the same on every survivor.
	ids := make([]byte, 16)
	binary.LittleEndian.PutUint64(ids, uint64(me))
	binary.LittleEndian.PutUint64(ids[8:], 1<<uint(me))
	if err := c.Allreduce(ctx, nil, ids, collective.Int64, collective.Sum); err != nil {
		return fmt.Errorf("rank %d: members: %w", me, err)
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("rank %d: final barrier: %w", me, err)
	}
	members := binary.LittleEndian.Uint64(ids[8:])
	_ = world.CloseChain()
	// Everything closed: goroutines and descriptors back where they were.
	if err := noLeaks(baseG, baseFD); err != nil {
		return fmt.Errorf("rank %d: %w", me, err)
	}
	fmt.Printf("DONE rank=%d size=%d members=%#x\n", me, want, members)
	return nil
}

// noLeaks waits up to 5 s for the goroutines (one more is allowed) and
// descriptors to be back at their counts from before the job.
func noLeaks(baseG, baseFD int) error {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseG+1 || countFDs() > baseFD {
		if time.Now().After(deadline) {
			return fmt.Errorf("leaked: %d goroutines (%d before), %d descriptors (%d before)",
				runtime.NumGoroutine(), baseG, countFDs(), baseFD)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func countFDs() int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(es)
}
