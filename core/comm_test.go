package core

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/mesh"
)

// testConfig keeps failure detection fast and every wait short. It leaves
// sysmon alone (NormalSysmon): the policy is process-wide, and in a test
// binary that runs dozens of ranks under -race beside another package's
// tests, an idle sysmon set by one 2-rank test starves the preemption and
// network polling of every later test (internal/sched tests IdleSysmon;
// the multi-process tests run it as users do).
func testConfig() Config {
	return Config{Timeout: 20 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler), NormalSysmon: true, Mesh: mesh.Builder{}}
}

// each runs f on every rank concurrently and returns the errors by rank.
func each(comms []*Comm, f func(c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(c)
		}()
	}
	wg.Wait()
	return errs
}

func mustAll(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// closeAll closes every communicator at once, as the ranks of a job do
// (under a sparse topology a rank that closes alone relays for the others
// until they said goodbye, or for a while: core/topo.go).
func closeAll(t testing.TB, comms []*Comm) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range comms {
		if c != nil {
			wg.Go(func() { c.Close() })
		}
	}
	wg.Wait()
}

func f32s(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func getF32(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

func i64(b []byte, i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }

func putI64(b []byte, i int, v int64) { binary.LittleEndian.PutUint64(b[8*i:], uint64(v)) }

// newLocal makes a mem world and registers its Close.
func newLocal(t *testing.T, n int) []*Comm {
	t.Helper()
	comms, err := testNewLocal(n, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, comms) })
	return comms
}

// checkCollectives runs every collective once through the Comm wiring with
// int64 values that identify (rank, index), and checks the results.
func checkCollectives(t *testing.T, comms []*Comm, count int) {
	n := len(comms)
	ctx := context.Background()
	t.Run("allreduce", func(t *testing.T) {
		mustAll(t, each(comms, func(c *Comm) error {
			send := make([]byte, 8*count)
			for i := 0; i < count; i++ {
				putI64(send, i, int64(c.Rank()*1000+i))
			}
			recv := make([]byte, 8*count)
			if err := c.Allreduce(ctx, send, recv, collective.Int64, collective.Sum); err != nil {
				return err
			}
			for i := 0; i < count; i++ {
				want := int64(n*(n-1)/2*1000 + n*i)
				if got := i64(recv, i); got != want {
					return fmt.Errorf("recv[%d] = %d, want %d", i, got, want)
				}
			}
			return nil
		}))
	})
	t.Run("allreduce_inplace_f32_max", func(t *testing.T) {
		mustAll(t, each(comms, func(c *Comm) error {
			vals := make([]float32, count)
			for i := range vals {
				vals[i] = float32(c.Rank() + i)
			}
			buf := f32s(vals...)
			if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Max); err != nil {
				return err
			}
			for i := 0; i < count; i++ {
				if got := getF32(buf, i); got != float32(n-1+i) {
					return fmt.Errorf("buf[%d] = %v, want %v", i, got, n-1+i)
				}
			}
			return nil
		}))
	})
	for _, root := range []int{0, n - 1} {
		t.Run(fmt.Sprintf("broadcast_root%d", root), func(t *testing.T) {
			mustAll(t, each(comms, func(c *Comm) error {
				buf := make([]byte, 8*count)
				if c.Rank() == root {
					for i := 0; i < count; i++ {
						putI64(buf, i, int64(7*i+1))
					}
				}
				if err := c.Broadcast(ctx, buf, collective.Int64, root); err != nil {
					return err
				}
				for i := 0; i < count; i++ {
					if got := i64(buf, i); got != int64(7*i+1) {
						return fmt.Errorf("buf[%d] = %d", i, got)
					}
				}
				return nil
			}))
		})
		t.Run(fmt.Sprintf("reduce_root%d", root), func(t *testing.T) {
			mustAll(t, each(comms, func(c *Comm) error {
				send := make([]byte, 8*count)
				for i := 0; i < count; i++ {
					putI64(send, i, int64(c.Rank()+i))
				}
				var recv []byte
				if c.Rank() == root {
					recv = make([]byte, 8*count)
				}
				if err := c.Reduce(ctx, send, recv, collective.Int64, collective.Sum, root); err != nil {
					return err
				}
				if c.Rank() == root {
					for i := 0; i < count; i++ {
						if got, want := i64(recv, i), int64(n*(n-1)/2+n*i); got != want {
							return fmt.Errorf("recv[%d] = %d, want %d", i, got, want)
						}
					}
				}
				return nil
			}))
		})
		t.Run(fmt.Sprintf("gather_scatter_root%d", root), func(t *testing.T) {
			mustAll(t, each(comms, func(c *Comm) error {
				send := make([]byte, 8*count)
				for i := 0; i < count; i++ {
					putI64(send, i, int64(c.Rank()*100+i))
				}
				var all []byte
				if c.Rank() == root {
					all = make([]byte, 8*count*n)
				}
				if err := c.Gather(ctx, send, all, collective.Int64, root); err != nil {
					return err
				}
				if c.Rank() == root {
					for r := 0; r < n; r++ {
						for i := 0; i < count; i++ {
							if got := i64(all, r*count+i); got != int64(r*100+i) {
								return fmt.Errorf("gather[%d][%d] = %d", r, i, got)
							}
						}
					}
				}
				back := make([]byte, 8*count)
				if err := c.Scatter(ctx, all, back, collective.Int64, root); err != nil {
					return err
				}
				if !bytes.Equal(back, send) {
					return fmt.Errorf("scatter returned a different block")
				}
				return nil
			}))
		})
	}
	t.Run("allgather_alltoall_reducescatter", func(t *testing.T) {
		mustAll(t, each(comms, func(c *Comm) error {
			send := make([]byte, 8*count)
			for i := 0; i < count; i++ {
				putI64(send, i, int64(c.Rank()*100+i))
			}
			all := make([]byte, 8*count*n)
			if err := c.Allgather(ctx, send, all, collective.Int64); err != nil {
				return err
			}
			for r := 0; r < n; r++ {
				for i := 0; i < count; i++ {
					if got := i64(all, r*count+i); got != int64(r*100+i) {
						return fmt.Errorf("allgather[%d][%d] = %d", r, i, got)
					}
				}
			}
			// alltoall: block j of rank r = r*100+j; rank r receives j*100+r.
			a := make([]byte, 8*n*count)
			for j := 0; j < n; j++ {
				for i := 0; i < count; i++ {
					putI64(a, j*count+i, int64(c.Rank()*100+j))
				}
			}
			b := make([]byte, len(a))
			if err := c.Alltoall(ctx, a, b, collective.Int64); err != nil {
				return err
			}
			for j := 0; j < n; j++ {
				for i := 0; i < count; i++ {
					if got := i64(b, j*count+i); got != int64(j*100+c.Rank()) {
						return fmt.Errorf("alltoall[%d][%d] = %d", j, i, got)
					}
				}
			}
			out := make([]byte, 8*count)
			if err := c.ReduceScatter(ctx, a, out, collective.Int64, collective.Sum); err != nil {
				return err
			}
			for i := 0; i < count; i++ {
				if got, want := i64(out, i), int64(n*(n-1)/2*100+n*c.Rank()); got != want {
					return fmt.Errorf("reduce_scatter[%d] = %d, want %d", i, got, want)
				}
			}
			return nil
		}))
	})
	t.Run("scan_exscan", func(t *testing.T) {
		mustAll(t, each(comms, func(c *Comm) error {
			send := make([]byte, 8*count)
			for i := 0; i < count; i++ {
				putI64(send, i, int64(c.Rank()+1))
			}
			recv := make([]byte, 8*count)
			if err := c.Scan(ctx, send, recv, collective.Int64, collective.Sum); err != nil {
				return err
			}
			r := c.Rank()
			for i := 0; i < count; i++ {
				if got, want := i64(recv, i), int64((r+1)*(r+2)/2); got != want {
					return fmt.Errorf("scan[%d] = %d, want %d", i, got, want)
				}
			}
			for i := range recv {
				recv[i] = 0xEE
			}
			if err := c.Exscan(ctx, send, recv, collective.Int64, collective.Sum); err != nil {
				return err
			}
			for i := 0; i < count && r > 0; i++ {
				if got, want := i64(recv, i), int64(r*(r+1)/2); got != want {
					return fmt.Errorf("exscan[%d] = %d, want %d", i, got, want)
				}
			}
			return nil
		}))
	})
	t.Run("v_forms", func(t *testing.T) {
		// rank r contributes r%3 elements (some ranks none).
		counts, displs := make([]int, n), make([]int, n)
		total := 0
		for r := range counts {
			counts[r], displs[r] = r%3, total
			total += r % 3
		}
		mustAll(t, each(comms, func(c *Comm) error {
			r := c.Rank()
			send := make([]byte, 8*counts[r])
			for i := 0; i < counts[r]; i++ {
				putI64(send, i, int64(r*10+i))
			}
			all := make([]byte, 8*total)
			if err := c.Allgatherv(ctx, send, all, counts, displs, collective.Int64); err != nil {
				return err
			}
			for q := 0; q < n; q++ {
				for i := 0; i < counts[q]; i++ {
					if got := i64(all, displs[q]+i); got != int64(q*10+i) {
						return fmt.Errorf("allgatherv[%d][%d] = %d", q, i, got)
					}
				}
			}
			g := make([]byte, 8*total)
			if err := c.Gatherv(ctx, send, g, counts, displs, collective.Int64, 0); err != nil {
				return err
			}
			if r == 0 && !bytes.Equal(g, all) {
				return fmt.Errorf("gatherv differs from allgatherv")
			}
			back := make([]byte, 8*counts[r])
			if err := c.Scatterv(ctx, all, counts, displs, back, collective.Int64, 0); err != nil {
				return err
			}
			if !bytes.Equal(back, send) {
				return fmt.Errorf("scatterv returned a different block")
			}
			// alltoallv: send one element (r) to every rank.
			one, ones := make([]int, n), make([]int, n)
			for q := range one {
				one[q], ones[q] = 1, q
			}
			s := make([]byte, 8*n)
			for q := 0; q < n; q++ {
				putI64(s, q, int64(r))
			}
			d := make([]byte, 8*n)
			if err := c.Alltoallv(ctx, s, one, ones, d, one, ones, collective.Int64); err != nil {
				return err
			}
			for q := 0; q < n; q++ {
				if i64(d, q) != int64(q) {
					return fmt.Errorf("alltoallv[%d] = %d", q, i64(d, q))
				}
			}
			return nil
		}))
	})
	t.Run("barrier", func(t *testing.T) {
		mustAll(t, each(comms, func(c *Comm) error { return c.Barrier(ctx) }))
	})
}

func TestCollectivesMem(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 8} {
		for _, count := range []int{0, 1, 7, 1000} {
			t.Run(fmt.Sprintf("n%d/count%d", n, count), func(t *testing.T) {
				checkCollectives(t, newLocal(t, n), count)
			})
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	comms := newLocal(t, 2)
	c := comms[0]
	ctx := context.Background()
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"bad dtype", c.Allreduce(ctx, nil, make([]byte, 8), collective.DType(99), collective.Sum), "datatype"},
		{"float band", c.Allreduce(ctx, nil, make([]byte, 8), collective.Float32, collective.Band), "band"},
		{"ragged", c.Allreduce(ctx, nil, make([]byte, 7), collective.Float32, collective.Sum), "multiple"},
		{"send len", c.Allreduce(ctx, make([]byte, 4), make([]byte, 8), collective.Float32, collective.Sum), "send"},
		{"root", c.Broadcast(ctx, make([]byte, 8), collective.Int32, 2), "root 2"},
		{"peer", c.Send(ctx, nil, 5, 0), "peer 5"},
		{"allgather", c.Allgather(ctx, make([]byte, 8), make([]byte, 8), collective.Int32), "block"},
		{"displs", c.Allgatherv(ctx, nil, make([]byte, 8), []int{1, 1}, []int{0, 5}, collective.Int32), "displs[1]"},
	}
	for _, tc := range cases {
		var e *Error
		if !errors.As(tc.err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Msg, tc.want) {
			t.Errorf("%s: got %v, want CodeInvalidArgument naming %q", tc.name, tc.err, tc.want)
		}
	}
	// Nothing was sent: both ranks still agree on the next call.
	mustAll(t, each(comms, func(c *Comm) error { return c.Barrier(ctx) }))
}

func TestLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		comms, err := testNewLocal(4, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		mustAll(t, each(comms, func(c *Comm) error {
			buf := make([]byte, 64)
			return c.Allreduce(context.Background(), nil, buf, collective.Uint8, collective.Sum)
		}))
		closeAll(t, comms)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestWantIdleSysmon: sysmon is made idle only for a rank that spins on
// shared memory with a core per local rank, unless the config opts out.
func TestWantIdleSysmon(t *testing.T) {
	for _, c := range []struct {
		poll, oversub, normal bool
		spin                  time.Duration
		want                  bool
	}{
		{poll: true, spin: spinWaitDedicated, want: true},
		{poll: true, spin: spinWaitDedicated, normal: true},
		{poll: true, spin: spinWaitShared, oversub: true},
		{poll: true, spin: -1},
		{spin: spinWaitDedicated},
	} {
		n := &node{caps: transport.Caps{Poll: c.poll}, spinWait: c.spin, oversubscribed: c.oversub,
			cfg: Config{NormalSysmon: c.normal}}
		if got := n.wantIdleSysmon(); got != c.want {
			t.Errorf("%+v: %v, want %v", c, got, c.want)
		}
	}
}
