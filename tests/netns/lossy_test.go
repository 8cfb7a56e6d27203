package netns

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	lossyA = "10.78.0.1"
	lossyB = "10.78.0.2"
)

// impairment is what the relay does to every IP packet, in each direction.
type impairment struct {
	loss  float64       // probability that a packet is dropped
	delay time.Duration // added to every packet that is not
}

// lossyHosts creates two namespaces joined through this process: each has a
// TUN device whose packets a relay here carries to the other one, dropping
// and delaying them as imp says. The kernel has no netem; the relay impairs
// every IP packet alike (TCP segments and QUIC datagrams, both at most the
// 1500-byte MTU because a TUN device without a virtio header gets no
// offloaded super-packets), so TCP and QUIC see the same link.
func lossyHosts(t *testing.T, imp impairment, seed uint64, st *[2]relayStats) (a, b host) {
	t.Helper()
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("netns: needs /dev/net/tun for the user-space lossy link")
	}
	a, b = twoNamespaces(t)
	id := strings.TrimPrefix(a.ns, "nexar-a-")
	ta, tb := "nta"+id, "ntb"+id
	fa, fb := openTUN(t, ta), openTUN(t, tb)
	a.addr, b.addr = lossyA, lossyB
	a.dev, b.dev = ta, tb
	for _, h := range []host{a, b} {
		ip(t, "link", "set", h.dev, "netns", h.ns)
		ip(t, "-n", h.ns, "addr", "add", h.addr+"/24", "dev", h.dev)
		// The relay's queue models the link's buffer. The TUN device's own
		// (500 packets by default) overflowed whenever a busy host kept
		// the relay from reading for a moment: up to 1,200 drops in a
		// "clean" run with the load average at 15, bursts of 5-8% of the
		// packets, which QUIC rightly took for a lossy link.
		ip(t, "-n", h.ns, "link", "set", h.dev, "mtu", "1500", "txqueuelen", "20000", "up")
		ip(t, "-n", h.ns, "link", "set", "lo", "up")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { relay(ctx, fa, fb, imp, seed, &st[0]) })
	wg.Go(func() { relay(ctx, fb, fa, imp, seed+1, &st[1]) })
	t.Cleanup(func() {
		cancel()
		fa.Close()
		fb.Close()
		wg.Wait()
	})
	return a, b
}

// twoNamespaces creates two empty namespaces, deleted when the test ends.
func twoNamespaces(t *testing.T) (a, b host) {
	t.Helper()
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("netns: needs Linux and root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("netns: needs iproute2's ip (apt-get install iproute2)")
	}
	id := fmt.Sprintf("%d%s", os.Getpid()%100000, randHex(2))
	a, b = host{ns: "nexar-a-" + id}, host{ns: "nexar-b-" + id}
	for _, h := range []host{a, b} {
		if out, err := exec.Command("ip", "netns", "add", h.ns).CombinedOutput(); err != nil {
			t.Skipf("netns: cannot create a network namespace here (%v: %s)", err, strings.TrimSpace(string(out)))
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", h.ns).Run() })
	}
	return a, b
}

func openTUN(t *testing.T, name string) *os.File {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("netns: cannot open /dev/net/tun: %v", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		t.Skipf("netns: cannot create TUN device %s: %v", name, err)
	}
	// Non-blocking only now: before TUNSETIFF the poller cannot take it,
	// and then Close would not end a pending Read.
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fd), name)
}

// tunDrops returns how many packets h's TUN device dropped because the
// relay did not read them in time (its transmit queue was full): losses
// the impairment did not model.
func tunDrops(h host) string {
	out, err := exec.Command("ip", "netns", "exec", h.ns, "cat", "/sys/class/net/"+h.dev+"/statistics/tx_dropped").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

// relayStats counts what one direction of the relay did with the packets it
// read: carried, dropped as the impairment says, or dropped because its
// queue was full.
type relayStats struct{ carried, lost, full atomic.Int64 }

func (s *relayStats) String() string {
	return fmt.Sprintf("%d carried, %d lost, %d over the queue", s.carried.Load(), s.lost.Load(), s.full.Load())
}

func (s *relayStats) reset() {
	s.carried.Store(0)
	s.lost.Store(0)
	s.full.Store(0)
}

// relay copies packets from in to out, dropping each with probability
// imp.loss (a seeded generator, so runs are repeatable) and holding the rest
// for imp.delay. Up to 1000 packets wait (netem's default limit); beyond
// that it drops at the tail, as a router queue does.
func relay(ctx context.Context, in, out *os.File, imp impairment, seed uint64, st *relayStats) {
	type pkt struct {
		due time.Time
		b   []byte
	}
	q := make(chan pkt, 1000)
	go func() {
		for p := range q {
			time.Sleep(time.Until(p.due))
			out.Write(p.b)
		}
	}()
	defer close(q)
	rng := rand.New(rand.NewPCG(seed, 0x6e65786172))
	for ctx.Err() == nil {
		b := make([]byte, 2048)
		n, err := in.Read(b)
		if err != nil {
			return
		}
		if rng.Float64() < imp.loss {
			st.lost.Add(1)
			continue
		}
		select {
		case q <- pkt{due: time.Now().Add(imp.delay), b: b[:n]}:
			st.carried.Add(1)
		default:
			st.full.Add(1)
		}
	}
}

// benchTimes is what rank 0 of `nexar bench` reports for one size: the
// total time of the timed iterations, and the median and p99 of one.
type benchTimes struct{ total, median, p99 time.Duration }

// allreduceTime runs `nexar bench` for iters allreduces of size bytes on two
// ranks, one per namespace, with NEXAR_BULK=bulk, and returns rank 0's
// times and the data path it reports.
func allreduceTime(t *testing.T, nexar string, a, b host, bulk string, size, iters int) (benchTimes, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	token := randHex(32)
	seed := a.addr + ":29600"
	var procs []*proc
	for r, h := range []host{a, b} {
		env := cleanEnv("NEXAR_RANK="+strconv.Itoa(r), "NEXAR_WORLD_SIZE=2", "NEXAR_SEED="+seed,
			"NEXAR_TOKEN="+token, "NEXAR_BIND_ADDR="+h.addr+":0", "NEXAR_ADVERTISE_ADDR="+h.addr, "NEXAR_BULK="+bulk)
		procs = append(procs, startIn(t, ctx, fmt.Sprintf("rank %d in %s", r, h.ns), h.ns, env, nexar, "bench",
			"--ops", "allreduce", "--sizes", strconv.Itoa(size), "--iters", strconv.Itoa(iters), "--warmup", "1", "--json"))
	}
	var cpu time.Duration
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			// Every rank's output: the one that failed first may be
			// another (a crash there shows here as a silent peer).
			cancel()
			var all strings.Builder
			for _, q := range procs[i+1:] {
				_ = q.cmd.Wait()
			}
			for _, q := range procs {
				fmt.Fprintf(&all, "--- %s:\n%s", q.name, q.out.String())
			}
			t.Fatalf("%s: %v\n%s", p.name, err, all.String())
		}
		cpu += p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
	}
	t.Logf("NEXAR_BULK=%s: both ranks used %v of CPU", bulk, cpu.Round(time.Millisecond))
	for line := range strings.Lines(procs[0].out.String()) {
		var res struct {
			Mean   float64 `json:"mean_us"`
			Median float64 `json:"time_us"`
			P99    float64 `json:"p99_us"`
			Iters  int     `json:"iters"`
			Wrong  int     `json:"wrong"`
			Path   string  `json:"path"`
		}
		if json.Unmarshal([]byte(line), &res) != nil || res.Iters == 0 {
			continue
		}
		if res.Wrong != 0 {
			t.Fatalf("bench: %d wrong results", res.Wrong)
		}
		us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
		return benchTimes{total: us(res.Mean * float64(res.Iters)), median: us(res.Median), p99: us(res.P99)}, res.Path
	}
	t.Fatalf("no result from rank 0:\n%s", procs[0].out.String())
	return benchTimes{}, ""
}

// TestLossyLink: the QUIC data path between two hosts must stand 5% packet
// loss and 5 ms of delay each way about as well as the TCP path over the
// same link. On one QUIC connection 10 x 1 MiB took 16 s (50 took 78 s, the
// TCP path 5.9 s): one congestion window under random loss; striped over
// 32 connections without parity parts, every step waited for its slowest
// part. The quick form runs iters x 1 MiB allreduces on each path over the
// lossy link, in two rounds that alternate QUIC and TCP, and fails if QUIC
// takes more than maxTotalRatio times as long as TCP in all AND more than
// maxMedianRatio times in the median allreduce. Either ratio alone is noisy
// on a busy host: the TCP path's total rides on its occasional
// retransmission timeouts (its p99 allreduce took 0.15-1.6 s), and QUIC's
// median on scheduling. Measured (total, median) ratios, old and new code
// alternating in the same session:
//
//   - as make test runs it (-race), load average 3-9.5, 9 runs each:
//     without parity parts 1.37-2.77 and 1.69-2.47, all failing; with them
//     0.91-1.41 and 1.22-1.48, all passing (never both over the bounds:
//     the highest total, 1.41, came with a median of 1.41).
//   - without -race, load 7.5-15, 5 runs each: without 1.95-3.17 and
//     1.95-2.81; with 0.91-0.99 and 1.14-1.33.
//
// Set NEXAR_LOSSY_FULL=1 for the full measurement (one round of 50 on each
// path, clean and lossy links, the same check on the lossy one;
// docs/bulk-path.md, "Under loss").
func TestLossyLink(t *testing.T) {
	const (
		iters          = 50
		maxTotalRatio  = 1.3
		maxMedianRatio = 1.6
	)
	nexar, _ := build(t)
	full := os.Getenv("NEXAR_LOSSY_FULL") != ""
	rounds := 2 // of iters/2 on each path
	imps := []impairment{{loss: 0.05, delay: 5 * time.Millisecond}}
	if full {
		rounds = 1
		imps = append([]impairment{{delay: 5 * time.Millisecond}, {}}, imps...)
	}
	for _, imp := range imps {
		var st [2]relayStats
		a, b := lossyHosts(t, imp, 1, &st)
		// The paths take turns, rounds times each, so that a change in the
		// host's load weighs on both alike.
		took := map[string]benchTimes{}
		for range rounds {
			for _, bulk := range []string{"off", "tcp"} {
				d, path := allreduceTime(t, nexar, a, b, bulk, 1<<20, iters/rounds)
				sum := took[bulk]
				sum.total += d.total
				sum.median += d.median / time.Duration(rounds)
				sum.p99 = max(sum.p99, d.p99)
				took[bulk] = sum
				t.Logf("loss %.0f%%, delay %v, NEXAR_BULK=%s (%s): %d x 1 MiB allreduce in %v (one: median %v, p99 %v)", imp.loss*100, imp.delay, bulk, path, iters/rounds,
					d.total.Round(time.Millisecond), d.median.Round(100*time.Microsecond), d.p99.Round(100*time.Microsecond))
				t.Logf("relay a->b: %v; b->a: %v; TUN queue drops so far: a %s, b %s", &st[0], &st[1], tunDrops(a), tunDrops(b))
				for i := range st {
					st[i].reset()
				}
			}
		}
		q, tcp := took["off"], took["tcp"]
		total, median := float64(q.total)/float64(tcp.total), float64(q.median)/float64(tcp.median)
		t.Logf("loss %.0f%%, delay %v: QUIC/TCP %.2f (medians %.2f, p99 %.2f)", imp.loss*100, imp.delay, total, median, float64(q.p99)/float64(tcp.p99))
		if imp.loss > 0 && total > maxTotalRatio && median > maxMedianRatio {
			t.Errorf("%d x 1 MiB allreduce over QUIC with %.0f%% loss took %v, %.2f times the TCP path's %v, and %v in the median, %.2f times TCP's %v; want at most %.1f times in all or %.1f times in the median",
				iters, imp.loss*100, q.total.Round(time.Millisecond), total, tcp.total.Round(time.Millisecond),
				q.median.Round(100*time.Microsecond), median, tcp.median.Round(100*time.Microsecond), maxTotalRatio, maxMedianRatio)
		}
	}
}
