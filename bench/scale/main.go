// Command scale measures a job of N rank processes on one host per topology
// (docs/scale.md): bootstrap time, connections and file descriptors per
// rank, resident memory per rank, heartbeats per second, allreduce of 8 B
// and 1 MiB, payload relayed per rank, and the time to close.
//
//	go run ./bench/scale -n 64 -topologies full,kregular:8,hypercube,ondemand:16
//
// builds cmd/nexar, then for each topology starts `nexar run -n N` with
// itself in rank mode (NEXAR_TOPOLOGY set), collects one line of figures
// per rank and prints a table (medians over ranks; the allreduce times are
// the slowest rank's, median and p99 over the calls) and, with -csv, one
// CSV row per topology. Ranks run one after another topology, never two
// jobs at once.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

// figures is one rank's measurements.
type figures struct {
	Rank       int       `json:"rank"`
	BootMs     float64   `json:"boot_ms"`
	Conns      int       `json:"conns"`
	FDs        int       `json:"fds"`
	RSSKiB     int64     `json:"rss_kib"`
	HBPerSec   float64   `json:"hb_per_s"`
	AR8Ms      []float64 `json:"ar8_ms"`
	AR1MMs     []float64 `json:"ar1m_ms"`
	RelayedKiB float64   `json:"relayed_kib"`
	CloseMs    float64   `json:"close_ms"`
	Err        string    `json:"err,omitempty"`
}

const marker = "SCALEFIG "

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rank" {
		rank()
		return
	}
	n := flag.Int("n", 32, "ranks (processes) per job")
	topos := flag.String("topologies", "full,kregular:8,hypercube,ondemand:16", "comma-separated NEXAR_TOPOLOGY values")
	reps := flag.Int("reps", 20, "allreduce calls per size")
	csvOut := flag.String("csv", "", "also write the table as CSV to this file")
	timeout := flag.Duration("timeout", 10*time.Minute, "bound on one job")
	flag.Parse()
	dir, err := os.MkdirTemp("", "nexar-scale")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	nexar := filepath.Join(dir, "nexar")
	if out, err := exec.Command("go", "build", "-o", nexar, "./cmd/nexar").CombinedOutput(); err != nil {
		fail(fmt.Errorf("building cmd/nexar (run from the repository root): %v\n%s", err, out))
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("# %d rank processes on one host, %d allreduce calls per size; load average before: %s\n", *n, *reps, strings.TrimSpace(string(load)))
	header := "| topology | bootstrap ms | connections/rank | fds/rank | RSS MiB/rank | heartbeats/s (all ranks) | allreduce 8 B ms (med / p99) | allreduce 1 MiB ms (med / p99) | relayed KiB/rank | close ms |"
	fmt.Println(header)
	fmt.Println("|" + strings.Repeat("---|", strings.Count(header, "|")-1))
	var csv strings.Builder
	csv.WriteString("transport,ranks,topology,boot_ms,conns_per_rank,fds_per_rank,rss_mib_per_rank,heartbeats_per_s,ar8_med_ms,ar8_p99_ms,ar1m_med_ms,ar1m_p99_ms,relayed_kib_per_rank,close_ms\n")
	for _, topo := range strings.Split(*topos, ",") {
		figs, err := job(nexar, self, *n, topo, *reps, *timeout)
		if err != nil {
			fmt.Printf("| %s | failed: %s |\n", topo, strings.ReplaceAll(err.Error(), "\n", " "))
			fmt.Fprintf(&csv, "processes,%d,%s,failed\n", *n, topo)
			continue
		}
		s := summarize(figs)
		fmt.Printf("| %s | %.0f | %.1f | %.0f | %.1f | %.0f | %.2f / %.2f | %.1f / %.1f | %.1f | %.0f |\n",
			topo, s.boot, s.conns, s.fds, s.rss, s.hb, s.ar8[0], s.ar8[1], s.ar1m[0], s.ar1m[1], s.relayed, s.close)
		fmt.Fprintf(&csv, "processes,%d,%s,%.0f,%.1f,%.0f,%.1f,%.0f,%.3f,%.3f,%.2f,%.2f,%.1f,%.0f\n",
			*n, topo, s.boot, s.conns, s.fds, s.rss, s.hb, s.ar8[0], s.ar8[1], s.ar1m[0], s.ar1m[1], s.relayed, s.close)
	}
	if *csvOut != "" {
		if err := os.WriteFile(*csvOut, []byte(csv.String()), 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scale:", err)
	os.Exit(1)
}

// job runs one topology and returns every rank's figures.
func job(nexar, self string, n int, topo string, reps int, timeout time.Duration) ([]figures, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nexar, "run", "-n", strconv.Itoa(n), "--", self, "rank", strconv.Itoa(reps))
	cmd.Env = append(os.Environ(), "NEXAR_TOPOLOGY="+topo, "NEXAR_CONNECT_TIMEOUT=5m",
		"NEXAR_HEARTBEAT_TIMEOUT=60s", "NEXAR_TIMEOUT=10m")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	runErr := cmd.Run()
	var figs []figures
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, marker)
		if i < 0 {
			continue
		}
		var f figures
		if err := json.Unmarshal([]byte(line[i+len(marker):]), &f); err != nil {
			return nil, fmt.Errorf("bad figures line %q: %v", line, err)
		}
		if f.Err != "" {
			return nil, fmt.Errorf("rank %d: %s", f.Rank, f.Err)
		}
		figs = append(figs, f)
	}
	if runErr != nil || len(figs) != n {
		tail := errOut.String()
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return nil, fmt.Errorf("%d of %d ranks reported (%v): %s", len(figs), n, runErr, tail)
	}
	return figs, nil
}

type summary struct {
	boot, conns, fds, rss, hb, relayed, close float64
	ar8, ar1m                                 [2]float64
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// p99 is the 99th percentile (nearest rank) of v.
func p99(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[min(len(v)-1, (len(v)*99+99)/100-1)]
}

func summarize(figs []figures) summary {
	var s summary
	col := func(f func(figures) float64) []float64 {
		out := make([]float64, len(figs))
		for i, g := range figs {
			out[i] = f(g)
		}
		return out
	}
	s.boot = median(col(func(g figures) float64 { return g.BootMs }))
	s.conns = median(col(func(g figures) float64 { return float64(g.Conns) }))
	s.fds = median(col(func(g figures) float64 { return float64(g.FDs) }))
	s.rss = median(col(func(g figures) float64 { return float64(g.RSSKiB) / 1024 }))
	for _, g := range figs {
		s.hb += g.HBPerSec
	}
	s.relayed = median(col(func(g figures) float64 { return g.RelayedKiB }))
	s.close = median(col(func(g figures) float64 { return g.CloseMs }))
	// A call takes as long as its slowest rank.
	slowest := func(get func(figures) []float64) [2]float64 {
		calls := len(get(figs[0]))
		per := make([]float64, calls)
		for i := range calls {
			for _, g := range figs {
				per[i] = max(per[i], get(g)[i])
			}
		}
		return [2]float64{median(per), p99(per)}
	}
	s.ar8 = slowest(func(g figures) []float64 { return g.AR8Ms })
	s.ar1m = slowest(func(g figures) []float64 { return g.AR1MMs })
	return s
}

// rank is one process of a job: it forms the job, measures, and prints its
// figures as one line.
func rank() {
	start := time.Now()
	reps, _ := strconv.Atoi(os.Args[2])
	f := figures{Rank: -1}
	defer func() {
		b, _ := json.Marshal(f)
		fmt.Println(marker + string(b))
	}()
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		f.Err = err.Error()
		return
	}
	ctx := context.Background()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		f.Err = err.Error()
		return
	}
	f.Rank = c.Rank()
	f.BootMs = ms(time.Since(start))
	if err := c.Barrier(ctx); err != nil {
		f.Err = err.Error()
		return
	}
	hb0 := c.Stats().HeartbeatsSent
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	f.HBPerSec = float64(c.Stats().HeartbeatsSent-hb0) / time.Since(t0).Seconds()
	timeAR := func(size int) ([]float64, error) {
		in, out := make([]byte, size), make([]byte, size)
		var ds []float64
		for range reps {
			if err := c.Barrier(ctx); err != nil {
				return nil, err
			}
			t := time.Now()
			if err := c.Allreduce(ctx, in, out, collective.Float32, collective.Sum); err != nil {
				return nil, err
			}
			ds = append(ds, ms(time.Since(t)))
		}
		return ds, nil
	}
	if f.AR8Ms, err = timeAR(8); err == nil {
		f.AR1MMs, err = timeAR(1 << 20)
	}
	if err != nil {
		f.Err = err.Error()
		return
	}
	// Connections, descriptors and memory after the calls: on demand the
	// connections are the ones the calls left open.
	st := c.Stats()
	f.Conns = st.Connections
	f.RelayedKiB = float64(st.RelayedBytes) / 1024
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		f.FDs = len(ents)
	}
	f.RSSKiB = rssKiB()
	if err := c.Barrier(ctx); err != nil {
		f.Err = err.Error()
		return
	}
	t := time.Now()
	c.Close()
	f.CloseMs = ms(time.Since(t))
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// rssKiB is this process's resident set (VmRSS), 0 where /proc lacks it.
func rssKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}
