// Command testprog is the rank program of the multi-process and two-host
// tests. It reads its place in the job from the environment (core.ConfigFromEnv)
// and runs one mode, given as its first argument:
//
//	check      every collective and point-to-point pattern, verified (default)
//	fail R     rank R exits 1 once the job has formed; the others wait
//	loop [B [T]] allreduce B bytes (default 4096), each call with deadline T
//	           (default 60s), until an operation fails; prints FAULT with timing
//	soak D     allreduce for duration D, then verify and exit
//	auth       expect the seed to refuse this process's token
//	leave R H  rank R leaves as soon as New returns (H: "close" destroys its
//	           communicator first, "exit" just exits); the others print
//	           FORMATION with how long New and a first barrier took
//	elastic S M  under NEXAR_ON_FAILURE=shrink: allreduce and check until
//	           the communicator (followed through its automatic shrinks)
//	           has S ranks, then M more times; prints FAULT and RECOVERED
//	           (unix nanos) around each loss, then DONE with the final
//	           membership, after checking that closing leaked no goroutine
//	           or descriptor
//	regrow M   under NEXAR_ON_FAILURE=manual: allreduce and check; on a loss
//	           shrink, start replacements (this program, NEXAR_JOIN=1) and
//	           grow back to the first size; M more rounds after the last
//	           regrow, then DONE with the final members' pid sum (prints
//	           FAULT, GROWING, GROWN, SPAWNED, JOINED with unix nanos)
//	hold       print FORMED with the time core.New took, run an allreduce
//	           and a barrier twice, print HOLD with the time each round
//	           took, and wait for stdin to close
//
// It exits 0 when the mode's expectation holds and non-zero otherwise,
// printing one line that says why.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

func main() {
	mode := "check"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	if err := run(mode, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "testprog %s: FAIL: %v\n", mode, err)
		os.Exit(1)
	}
}

func run(mode string, args []string) error {
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if mode == "auth" {
		return expectAuth(ctx, cfg)
	}
	if mode == "leave" {
		return leave(ctx, cfg, args)
	}
	if mode == "elastic" {
		signal.Ignore(syscall.SIGTERM)
		return elastic(ctx, cfg, args)
	}
	if mode == "regrow" {
		signal.Ignore(syscall.SIGTERM)
		return regrow(ctx, cfg, args)
	}
	if mode == "loop" {
		// The launcher sends SIGTERM to every rank when one dies; stay up
		// to measure how long this rank's own detection takes.
		signal.Ignore(syscall.SIGTERM)
	}
	t0 := time.Now()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if mode == "hold" {
		fmt.Printf("FORMED rank=%d ms=%d\n", c.Rank(), time.Since(t0).Milliseconds())
	}
	fmt.Printf("READY rank=%d size=%d pid=%d\n", c.Rank(), c.Size(), os.Getpid())
	paths := c.Paths()
	for p := range c.Size() {
		fmt.Printf("PATH rank=%d peer=%d %s\n", c.Rank(), p, paths[p])
	}
	switch mode {
	case "check":
		err = check(ctx, c)
	case "fail":
		err = failRank(ctx, c, args)
	case "loop":
		err = loop(c, args)
	case "soak":
		err = soak(ctx, c, args)
	case "hold":
		err = hold(ctx, c)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		return err
	}
	return settle(ctx, c)
}

// settle ends a successful job with a barrier; Close (deferred) follows at
// once: a graceful departure must not fail a rank still finishing.
func settle(ctx context.Context, c *core.Comm) error {
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("final barrier: %w", err)
	}
	fmt.Printf("OK rank=%d\n", c.Rank())
	return nil
}

func expectAuth(ctx context.Context, cfg core.Config) error {
	cfg.ConnectTimeout = 20 * time.Second
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err == nil {
		c.Close()
		return errors.New("joined with the wrong token")
	}
	if core.CodeOf(err) != core.CodeAuth {
		return fmt.Errorf("want an authentication error, got code %v: %w", core.CodeOf(err), err)
	}
	fmt.Printf("AUTH-REFUSED %v\n", err)
	return nil
}

func leave(ctx context.Context, cfg core.Config, args []string) error {
	if len(args) != 2 || (args[1] != "close" && args[1] != "exit") {
		return errors.New("usage: testprog leave RANK close|exit")
	}
	r, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	t0 := time.Now()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	newMS := time.Since(t0).Milliseconds()
	if cfg.Rank == r {
		if err != nil {
			return err
		}
		fmt.Printf("LEFT rank=%d new_ms=%d\n", r, newMS)
		if args[1] == "exit" {
			os.Exit(0)
		}
		return c.Close()
	}
	report := func(formed bool, firstMS int64, err error) {
		var ce *core.Error
		dead := -1
		if errors.As(err, &ce) {
			dead = ce.Rank
		}
		fmt.Printf("FORMATION rank=%d formed=%v new_ms=%d first_call_ms=%d dead=%d code=%q err=%v\n",
			cfg.Rank, formed, newMS, firstMS, dead, core.CodeOf(err).String(), err)
	}
	if err != nil {
		report(false, 0, err)
		return nil
	}
	defer c.Close()
	t1 := time.Now()
	err = c.Barrier(ctx)
	report(true, time.Since(t1).Milliseconds(), err)
	return nil
}

func failRank(ctx context.Context, c *core.Comm, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: testprog fail RANK")
	}
	r, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	if c.Rank() == r {
		fmt.Println("failing on purpose")
		os.Exit(1)
	}
	// Wait for the launcher to stop us; the dead rank makes this fail.
	return c.Barrier(ctx)
}

// loop runs allreduces until one fails (a peer was killed), then prints how
// long the failing operation was pending and when it failed (Unix ns) so
// the test can compare with the time of the kill.
func loop(c *core.Comm, args []string) error {
	size, warm, deadline := 4<<10, 10, 60*time.Second
	if len(args) > 0 {
		n, err := strconv.Atoi(args[0])
		if err != nil || n <= 0 || n%4 != 0 {
			return fmt.Errorf("loop: size %q: want a positive multiple of 4", args[0])
		}
		size, warm = n, 2
	}
	if len(args) > 1 {
		d, err := time.ParseDuration(args[1])
		if err != nil || d <= 0 {
			return fmt.Errorf("loop: deadline %q: want a positive duration", args[1])
		}
		deadline = d
	}
	buf := make([]byte, size)
	started := false
	for i := 0; ; i++ {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum)
		cancel()
		if err != nil {
			now := time.Now()
			var ce *core.Error
			dead := -1
			if errors.As(err, &ce) {
				dead = ce.Rank
			}
			fmt.Printf("FAULT rank=%d dead=%d code=%q pending_ms=%d at_unix_ns=%d err=%v\n",
				c.Rank(), dead, core.CodeOf(err).String(), now.Sub(t0).Milliseconds(), now.UnixNano(), err)
			// Stay up a while: an exit now is a connection lost to the
			// survivors still detecting, which they could blame instead.
			time.Sleep(3 * time.Second)
			os.Exit(3)
		}
		if !started && i >= warm {
			started = true
			fmt.Printf("LOOPING rank=%d\n", c.Rank())
		}
	}
}

// hold runs an allreduce and a barrier twice (the first round makes the
// shared-memory rings), then keeps the rank (and its memory) up until stdin
// closes, for the test to measure.
func hold(ctx context.Context, c *core.Comm) error {
	n := c.Size()
	var took [2]time.Duration
	for i := range took {
		t0 := time.Now()
		v := fill32(1024, func(i int) float32 { return float32(c.Rank() + i) })
		if err := c.Allreduce(ctx, nil, v, collective.Float32, collective.Sum); err != nil {
			return err
		}
		if err := expect32("hold allreduce", v, func(i int) float32 { return float32(n*(n-1)/2 + n*i) }); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		took[i] = time.Since(t0)
	}
	fmt.Printf("HOLD rank=%d first_ms=%d again_ms=%d\n", c.Rank(), took[0].Milliseconds(), took[1].Milliseconds())
	io.Copy(io.Discard, os.Stdin)
	return nil
}

func soak(ctx context.Context, c *core.Comm, args []string) error {
	d := 3 * time.Second
	if len(args) > 0 {
		var err error
		if d, err = time.ParseDuration(args[0]); err != nil {
			return err
		}
	}
	// Rank 0 decides when to stop so every rank runs the same number of
	// operations.
	stop := make([]byte, 4)
	deadline := time.Now().Add(d)
	n := c.Size()
	for iter := 0; ; iter++ {
		if c.Rank() == 0 && time.Now().After(deadline) {
			binary.NativeEndian.PutUint32(stop, 1)
		}
		if err := c.Broadcast(ctx, stop, collective.Uint32, 0); err != nil {
			return err
		}
		if binary.NativeEndian.Uint32(stop) == 1 {
			fmt.Printf("SOAKED rank=%d iterations=%d\n", c.Rank(), iter)
			return nil
		}
		v := fill32(1024, func(i int) float32 { return float32(c.Rank() + i) })
		if err := c.Allreduce(ctx, nil, v, collective.Float32, collective.Sum); err != nil {
			return err
		}
		if err := expect32("soak allreduce", v, func(i int) float32 { return float32(n*(n-1)/2 + n*i) }); err != nil {
			return err
		}
	}
}

// check runs every collective the multi-process test covers and verifies
// each result against a value computed here.
func check(ctx context.Context, c *core.Comm) error {
	r, n := c.Rank(), c.Size()
	tri := n * (n - 1) / 2 // sum of ranks
	for _, count := range []int{0, 1, 7, 1000, 1<<16 + 3} {
		// allreduce, out of place, float32 sum.
		send := fill32(count, func(i int) float32 { return float32(r*count + i) })
		recv := make([]byte, len(send))
		if err := c.Allreduce(ctx, send, recv, collective.Float32, collective.Sum); err != nil {
			return fmt.Errorf("allreduce count %d: %w", count, err)
		}
		if err := expect32(fmt.Sprintf("allreduce sum count %d", count), recv, func(i int) float32 {
			return float32(tri*count + n*i)
		}); err != nil {
			return err
		}
		// allreduce in place, int32 max.
		buf := fillI32(count, func(i int) int32 { return int32((r + i) % n) })
		if err := c.Allreduce(ctx, nil, buf, collective.Int32, collective.Max); err != nil {
			return fmt.Errorf("allreduce max count %d: %w", count, err)
		}
		if err := expectI32(fmt.Sprintf("allreduce max count %d", count), buf, func(i int) int32 { return int32(n - 1) }); err != nil {
			return err
		}
		// broadcast from the last rank.
		root := n - 1
		b := fillI32(count, func(i int) int32 {
			if r == root {
				return int32(7*i + 1)
			}
			return -1
		})
		if err := c.Broadcast(ctx, b, collective.Int32, root); err != nil {
			return fmt.Errorf("broadcast count %d: %w", count, err)
		}
		if err := expectI32(fmt.Sprintf("broadcast count %d", count), b, func(i int) int32 { return int32(7*i + 1) }); err != nil {
			return err
		}
		// allgather.
		mine := fillI32(count, func(i int) int32 { return int32(r*1000000 + i) })
		all := make([]byte, n*len(mine))
		if err := c.Allgather(ctx, mine, all, collective.Int32); err != nil {
			return fmt.Errorf("allgather count %d: %w", count, err)
		}
		if err := expectI32(fmt.Sprintf("allgather count %d", count), all, func(i int) int32 {
			return int32((i/max(count, 1))*1000000 + i%max(count, 1))
		}); err != nil {
			return err
		}
		// reduce_scatter: block j of rank r holds r+j+i; rank r gets block r summed.
		full := fill32(n*count, func(i int) float32 { return float32(r + i/max(count, 1) + i%max(count, 1)) })
		part := make([]byte, 4*count)
		if err := c.ReduceScatter(ctx, full, part, collective.Float32, collective.Sum); err != nil {
			return fmt.Errorf("reduce_scatter count %d: %w", count, err)
		}
		if err := expect32(fmt.Sprintf("reduce_scatter count %d", count), part, func(i int) float32 {
			return float32(tri + n*(r+i))
		}); err != nil {
			return err
		}
		// alltoall: rank r sends block j = r*100+j repeated; receives block j = j*100+r.
		out := fillI32(n*count, func(i int) int32 { return int32(r*100 + i/max(count, 1)) })
		in := make([]byte, len(out))
		if err := c.Alltoall(ctx, out, in, collective.Int32); err != nil {
			return fmt.Errorf("alltoall count %d: %w", count, err)
		}
		if err := expectI32(fmt.Sprintf("alltoall count %d", count), in, func(i int) int32 {
			return int32((i/max(count, 1))*100 + r)
		}); err != nil {
			return err
		}
	}
	if err := checkP2P(ctx, c); err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	fmt.Printf("CHECKED rank=%d size=%d\n", r, n)
	return nil
}

// checkP2P sends around a ring with two tags posted in reverse order, then
// every rank sends to rank 0, which receives from any source.
func checkP2P(ctx context.Context, c *core.Comm) error {
	r, n := c.Rank(), c.Size()
	if n < 2 {
		return nil
	}
	next, prev := (r+1)%n, (r+n-1)%n
	s1 := fillI32(100, func(i int) int32 { return int32(r*10 + 1) })
	s2 := fillI32(50000, func(i int) int32 { return int32(r*10 + 2) })
	q1, q2 := c.ISend(s1, next, 1), c.ISend(s2, next, 2)
	r2 := make([]byte, len(s2))
	if _, err := c.Recv(ctx, r2, prev, 2); err != nil {
		return fmt.Errorf("p2p recv tag 2: %w", err)
	}
	r1 := make([]byte, len(s1))
	if _, err := c.Recv(ctx, r1, prev, 1); err != nil {
		return fmt.Errorf("p2p recv tag 1: %w", err)
	}
	for _, q := range []*core.Request{q1, q2} {
		if err := q.Wait(ctx); err != nil {
			return fmt.Errorf("p2p send: %w", err)
		}
	}
	if err := expectI32("p2p tag 1", r1, func(int) int32 { return int32(prev*10 + 1) }); err != nil {
		return err
	}
	if err := expectI32("p2p tag 2", r2, func(int) int32 { return int32(prev*10 + 2) }); err != nil {
		return err
	}
	if err := checkLargeP2P(ctx, c); err != nil {
		return err
	}
	const tag = 9
	if r != 0 {
		return c.Send(ctx, fillI32(3, func(int) int32 { return int32(r) }), 0, tag)
	}
	seen := make([]bool, n)
	for range n - 1 {
		b := make([]byte, 12)
		st, err := c.Recv(ctx, b, core.AnySource, tag)
		if err != nil {
			return fmt.Errorf("p2p any-source: %w", err)
		}
		if st.Source <= 0 || st.Source >= n || seen[st.Source] || st.Count != 12 {
			return fmt.Errorf("p2p any-source: bad status %+v", st)
		}
		seen[st.Source] = true
		if err := expectI32("p2p any-source", b, func(int) int32 { return int32(st.Source) }); err != nil {
			return err
		}
	}
	return nil
}

// checkLargeP2P sends one 256 MiB message from the last rank to rank 0
// (several transport frames and, on one host, the cross-memory path).
func checkLargeP2P(ctx context.Context, c *core.Comm) error {
	const size = 256 << 20
	last := c.Size() - 1
	switch c.Rank() {
	case last:
		b := make([]byte, size)
		for i := 0; i < size; i += 4096 {
			b[i] = byte(i>>12) ^ 0x5a
		}
		b[size-1] = 0xa5
		return c.Send(ctx, b, 0, 77)
	case 0:
		b := make([]byte, size)
		st, err := c.Recv(ctx, b, last, 77)
		if err != nil {
			return fmt.Errorf("256 MiB p2p: %w", err)
		}
		if st.Count != size || b[size-1] != 0xa5 {
			return fmt.Errorf("256 MiB p2p: status %+v, last byte %#x", st, b[size-1])
		}
		for i := 0; i < size; i += 4096 {
			if b[i] != byte(i>>12)^0x5a {
				return fmt.Errorf("256 MiB p2p: byte %d is %#x, want %#x", i, b[i], byte(i>>12)^0x5a)
			}
		}
	}
	return nil
}

func fill32(n int, f func(int) float32) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(f(i)))
	}
	return b
}

func fillI32(n int, f func(int) int32) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.NativeEndian.PutUint32(b[4*i:], uint32(f(i)))
	}
	return b
}

func expect32(what string, b []byte, want func(int) float32) error {
	for i := range len(b) / 4 {
		if got := math.Float32frombits(binary.NativeEndian.Uint32(b[4*i:])); got != want(i) {
			return fmt.Errorf("%s: element %d = %v, want %v", what, i, got, want(i))
		}
	}
	return nil
}

func expectI32(what string, b []byte, want func(int) int32) error {
	for i := range len(b) / 4 {
		if got := int32(binary.NativeEndian.Uint32(b[4*i:])); got != want(i) {
			return fmt.Errorf("%s: element %d = %d, want %d", what, i, got, want(i))
		}
	}
	return nil
}
