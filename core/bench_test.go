package core

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// BenchmarkAllreduce2 times an allreduce between two ranks of this process
// connected as two processes on one host would be (loopback QUIC, shared-
// memory rings), and reports allocations per call on rank 0.
func BenchmarkAllreduce2(b *testing.B) {
	for _, size := range []int{8, 4096, 1 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			bufs := [2][2][]byte{{make([]byte, size), make([]byte, size)}, {make([]byte, size), make([]byte, size)}}
			benchPair(b, size, func(c *Comm, r int) error {
				return c.Allreduce(context.Background(), bufs[r][0], bufs[r][1], collective.Float32, collective.Sum)
			})
		})
	}
}

// benchPair times call(comms[0], 0) while another goroutine runs
// call(comms[1], 1) as many times, over two ranks of this process meshed
// as two processes on one host would be (loopback QUIC, shared-memory
// rings); it reports allocations per call.
func benchPair(b *testing.B, size int, call func(c *Comm, r int) error) {
	comms, err := testNewLocalQUIC(2, testConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer closeAll(b, comms)
	var wg sync.WaitGroup
	start := make(chan int)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := range start {
			for range n {
				if err := call(comms[1], 1); err != nil {
					b.Error(err)
					return
				}
			}
		}
	}()
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	start <- b.N
	for range b.N {
		if err := call(comms[0], 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	close(start)
	wg.Wait()
}

// BenchmarkRPC times a round trip of CallRPC to the other rank (an echo
// handler) over loopback QUIC, as between two processes on one host.
func BenchmarkRPC(b *testing.B) {
	for _, size := range []int{8, 4096, 1 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			comms, err := testNewLocalQUIC(2, testConfig())
			if err != nil {
				b.Fatal(err)
			}
			defer closeAll(b, comms)
			comms[1].Register(1, func(_ context.Context, _ int, req []byte) ([]byte, error) { return req, nil })
			req := make([]byte, size)
			ctx := context.Background()
			b.SetBytes(int64(2 * size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := comms[0].CallRPC(ctx, 1, 1, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllreduceLate times how long rank 0, blocked in an 8-byte
// allreduce because rank 1 computes for late before calling, takes to
// return after rank 1 calls: the wake-up of a waiter whose spin window has
// passed. Reported as wake-median-ns and wake-p99-ns (ns/op includes the
// late time).
func BenchmarkAllreduceLate(b *testing.B) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
		late := time.Millisecond
		b.Run(fmt.Sprintf("late=%v/spin=%v", late, spin), func(b *testing.B) {
			cfg := testConfig()
			cfg.SpinWait = spin
			comms, err := testNewLocalQUIC(2, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer closeAll(b, comms)
			ctx := context.Background()
			bufs := [2][2][]byte{{make([]byte, 8), make([]byte, 8)}, {make([]byte, 8), make([]byte, 8)}}
			called := make([]int64, b.N) // when rank 1 called, ns since base
			ended := make([]int64, b.N)  // when rank 0 returned
			base := time.Now()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range b.N {
					for t := time.Now(); time.Since(t) < late; {
					} // compute
					called[i] = int64(time.Since(base))
					if err := comms[1].Allreduce(ctx, bufs[1][0], bufs[1][1], collective.Float32, collective.Sum); err != nil {
						b.Error(err)
						return
					}
				}
			}()
			b.ResetTimer()
			for i := range b.N {
				if err := comms[0].Allreduce(ctx, bufs[0][0], bufs[0][1], collective.Float32, collective.Sum); err != nil {
					b.Fatal(err)
				}
				ended[i] = int64(time.Since(base))
			}
			b.StopTimer()
			wg.Wait()
			wake := make([]int64, b.N)
			for i := range wake {
				wake[i] = ended[i] - called[i]
			}
			slices.Sort(wake)
			b.ReportMetric(float64(wake[len(wake)/2]), "wake-median-ns")
			b.ReportMetric(float64(wake[(99*len(wake)+99)/100-1]), "wake-p99-ns")
		})
	}
}

// BenchmarkRPCLent is BenchmarkRPC the way the C and Python layers call:
// a lent handler (request borrowed, reply lent back) and CallRPCInto
// copying the reply out, so large payloads come from the RPC pool.
func BenchmarkRPCLent(b *testing.B) {
	for _, size := range []int{8, 4096, 1 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			comms, err := testNewLocalQUIC(2, testConfig())
			if err != nil {
				b.Fatal(err)
			}
			defer closeAll(b, comms)
			comms[1].RegisterLent(1, func(_ context.Context, _ int, req []byte) ([]byte, func(), error) { return req, nil, nil })
			req := make([]byte, size)
			out := make([]byte, size)
			use := func(r []byte) error { copy(out, r); return nil }
			ctx := context.Background()
			b.SetBytes(int64(2 * size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := comms[0].CallRPCInto(ctx, 1, 1, req, use); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIAllreduceWait2 times IAllreduce followed at once by Wait on
// both ranks (torch's async_op=True then wait(), MPI_Iallreduce then
// MPI_Wait) over loopback QUIC; compare with BenchmarkAllreduce2.
func BenchmarkIAllreduceWait2(b *testing.B) {
	for _, size := range []int{8, 1 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			bufs := [2][]byte{make([]byte, size), make([]byte, size)}
			benchPair(b, size, func(c *Comm, r int) error {
				return c.IAllreduce(nil, bufs[r], collective.Float32, collective.Sum).Wait(context.Background())
			})
		})
	}
}
