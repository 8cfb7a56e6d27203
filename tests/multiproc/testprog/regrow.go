package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

// regrow is the grow chaos suite's rank (NEXAR_ON_FAILURE=manual): it
// allreduces and checks; on a loss it shrinks, the survivors' rank 0
// starts as many replacements (this program with NEXAR_JOIN=1) as ranks
// were lost, and every member grows until the world has its first size
// again (a failed grow, e.g. a member killed inside it, is followed by
// another shrink and grow). After a regrow it runs ROUNDS more checked
// allreduces, then prints DONE with the final members' pids (sum) and
// checks that closing leaked no goroutine or descriptor. A replacement
// prints JOINED with the time it entered the grown world.
func regrow(ctx context.Context, cfg core.Config, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: testprog regrow ROUNDS")
	}
	rounds, err := strconv.Atoi(args[0])
	if err != nil {
		return errors.New("usage: testprog regrow ROUNDS")
	}
	if cfg.OnFailure != core.PolicyManual {
		return errors.New("regrow needs NEXAR_ON_FAILURE=manual")
	}
	joiner := cfg.Join
	baseG, baseFD := runtime.NumGoroutine(), countFDs()
	t0 := time.Now()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		if joiner && core.CodeOf(err) == core.CodeTimeout {
			// One replacement too many (its starter died after starting
			// it, so a later rank 0 started another): never admitted.
			fmt.Printf("GIVEUP pid=%d err=%q\n", os.Getpid(), err.Error())
			return nil
		}
		return err
	}
	comms := []*core.Comm{c}
	want := c.Size()
	if joiner {
		// The size to grow back to comes from the member that started it.
		if want, err = strconv.Atoi(os.Getenv("REGROW_WANT")); err != nil {
			return fmt.Errorf("a replacement needs REGROW_WANT: %v", err)
		}
		fmt.Printf("JOINED pid=%d rank=%d size=%d at=%d wait_ms=%d\n", os.Getpid(), c.Rank(), c.Size(), time.Now().UnixNano(), time.Since(t0).Milliseconds())
	} else {
		fmt.Printf("READY rank=%d size=%d pid=%d\n", c.Rank(), c.Size(), os.Getpid())
		fmt.Printf("LOOPING rank=%d\n", c.Rank())
		// The first world's size is the size to grow back to.
		want = cfg.WorldSize
	}
	if joiner {
		// The members may still be short: settle with them.
		if c, comms, err = regrowSettle(ctx, c, comms, 0, true, want, rounds); err != nil {
			return err
		}
	}
	regrown := joiner
	done := 0
	const k = 256
	buf := make([]byte, 8*k)
	for i := 0; done < rounds; i++ {
		if i > 200000 {
			return fmt.Errorf("pid %d: no end after %d rounds (size %d)", os.Getpid(), i, c.Size())
		}
		for j := 0; j < k; j++ {
			binary.LittleEndian.PutUint64(buf[8*j:], uint64(c.Rank()+1+j))
		}
		err := c.Allreduce(ctx, nil, buf, collective.Int64, collective.Sum)
		if err == nil {
			n := c.Size()
			for j := 0; j < k; j++ {
				if got, w := binary.LittleEndian.Uint64(buf[8*j:]), uint64(n*(n+1)/2+n*j); got != w {
					return fmt.Errorf("pid %d: element %d on %d ranks: %d, want %d", os.Getpid(), j, n, got, w)
				}
			}
			if regrown && n == want {
				done++
			}
			continue
		}
		if code := core.CodeOf(err); code != core.CodePeerDown && code != core.CodeRevoked {
			return fmt.Errorf("pid %d: allreduce on %d ranks: %w", os.Getpid(), c.Size(), err)
		}
		fmt.Printf("FAULT pid=%d size=%d err=%q\n", os.Getpid(), c.Size(), err.Error())
		s, err := c.Shrink(ctx)
		if err != nil {
			return fmt.Errorf("pid %d: shrink of %d ranks: %w", os.Getpid(), c.Size(), err)
		}
		comms = append(comms, s)
		if c, comms, err = regrowSettle(ctx, s, comms, c.Size(), false, want, rounds); err != nil {
			return err
		}
		regrown, done = true, 0
	}
	// The members' pids, summed: the same on every member of the final world.
	ids := make([]byte, 16)
	binary.LittleEndian.PutUint64(ids, uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(ids[8:], 1)
	if err := c.Allreduce(ctx, nil, ids, collective.Int64, collective.Sum); err != nil {
		return fmt.Errorf("pid %d: members: %w", os.Getpid(), err)
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("pid %d: final barrier: %w", os.Getpid(), err)
	}
	for i := len(comms) - 1; i >= 0; i-- {
		_ = comms[i].Close()
	}
	if err := noLeaks(baseG, baseFD); err != nil {
		return fmt.Errorf("pid %d: %w", os.Getpid(), err)
	}
	fmt.Printf("DONE pid=%d size=%d count=%d pidsum=%d\n", os.Getpid(), c.Size(),
		binary.LittleEndian.Uint64(ids[8:]), binary.LittleEndian.Uint64(ids))
	return nil
}

// regrowSettle brings c back to want members: every member (and a joiner just
// admitted, newHere) counts who came in with the last change and who was
// lost since from (the size before it; 0 from a joiner, which does not
// know it), c's rank 0 starts a replacement per lost rank, and all grow;
// a failed grow or count is followed by a shrink and another round.
//
// A rank 0 that dies between its count and starting the replacements
// leaves them unstarted, and no later count sees that loss again: after
// orphanGrows grows in a row that admitted nobody, rank 0 starts as many
// as the world lacks. (Should the dead rank 0's replacements come after
// all, the one too many is never admitted and gives up: GIVEUP.)
func regrowSettle(ctx context.Context, c *core.Comm, comms []*core.Comm, from int, newHere bool, want, rounds int) (*core.Comm, []*core.Comm, error) {
	const orphanGrows = 40 // about 3 s of nobody coming
	idle := 0
	for {
		in, before, err := census(ctx, c, from, newHere)
		if err == nil {
			start := before + in - c.Size() // lost since the last change
			if idle >= orphanGrows {
				start, idle = want-c.Size(), 0
			}
			for i := 0; i < start && c.Rank() == 0; i++ {
				if err := startReplacement(c, want, rounds); err != nil {
					return c, comms, err
				}
			}
			if c.Size() >= want {
				return c, comms, nil
			}
			fmt.Printf("GROWING pid=%d size=%d at=%d\n", os.Getpid(), c.Size(), time.Now().UnixNano())
			var g *core.Comm
			if g, err = c.Grow(ctx); err == nil {
				comms = append(comms, g)
				if g.Size() != c.Size() {
					fmt.Printf("GROWN pid=%d size=%d at=%d\n", os.Getpid(), g.Size(), time.Now().UnixNano())
					idle = 0
				} else {
					idle++
					time.Sleep(50 * time.Millisecond) // the replacements are starting
				}
				from, newHere, c = c.Size(), false, g
				continue
			}
			fmt.Printf("GROWFAILED pid=%d err=%q\n", os.Getpid(), err.Error())
		}
		// A member or joiner failed: shrink, and count again.
		s, serr := c.Shrink(ctx)
		if serr != nil {
			return c, comms, fmt.Errorf("pid %d: shrink of %d ranks after %v: %w", os.Getpid(), c.Size(), err, serr)
		}
		comms = append(comms, s)
		from, newHere, c = c.Size(), false, s
	}
}

// census returns how many ranks of c came in with its last change and the
// size before it (the largest from any member gives).
func census(ctx context.Context, c *core.Comm, from int, newHere bool) (int, int, error) {
	b := make([]byte, 16)
	if newHere {
		binary.LittleEndian.PutUint64(b, 1)
	}
	if err := c.Allreduce(ctx, nil, b[:8], collective.Int64, collective.Sum); err != nil {
		return 0, 0, err
	}
	binary.LittleEndian.PutUint64(b[8:], uint64(from))
	if err := c.Allreduce(ctx, nil, b[8:], collective.Int64, collective.Max); err != nil {
		return 0, 0, err
	}
	return int(binary.LittleEndian.Uint64(b)), int(binary.LittleEndian.Uint64(b[8:])), nil
}

// startReplacement starts this program as a process that joins c's job
// through its members' lobbies; it writes to this process's output.
func startReplacement(c *core.Comm, want, rounds int) error {
	var addrs []string
	for _, a := range c.JoinAddrs() {
		if a != "" {
			addrs = append(addrs, a)
		}
	}
	cmd := exec.Command(os.Args[0], "regrow", strconv.Itoa(rounds))
	// A replacement too many gives up after 20 s (NEXAR_TIMEOUT bounds Join).
	cmd.Env = append(os.Environ(), "NEXAR_JOIN=1", "NEXAR_SEED="+strings.Join(addrs, ","), "REGROW_WANT="+strconv.Itoa(want), "NEXAR_TIMEOUT=20s")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting a replacement: %w", err)
	}
	fmt.Printf("SPAWNED pid=%d by=%d\n", cmd.Process.Pid, os.Getpid())
	go func() { _ = cmd.Wait() }()
	return nil
}
