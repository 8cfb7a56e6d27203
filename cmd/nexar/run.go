package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"github.com/nexar-go/nexar/core"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const runSynopsis = "run -n N [--seed-port P] [--bind ADDR] [--grace D] [--flight-dir DIR] [--hang-timeout D] -- prog args..."

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", runSynopsis, stderr)
	opt := runOptions{stdout: stdout, stderr: stderr}
	fs.IntVar(&opt.n, "n", 0, "number of ranks to start (required, >= 1)")
	fs.IntVar(&opt.seedPort, "seed-port", 0, "UDP port of the seed that rank 0 embeds (default: a free port)")
	fs.StringVar(&opt.bind, "bind", "127.0.0.1", "IP address the seed and the ranks listen on; 0.0.0.0 for every interface")
	fs.DurationVar(&opt.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when stopping ranks")
	fs.StringVar(&opt.flightDir, "flight-dir", "", "directory the ranks dump their flight records to (NEXAR_FLIGHT_RECORDER_DIR; SIGUSR1 dumps them)")
	fs.DurationVar(&opt.hang, "hang-timeout", 0, "report who waits for whom when no rank progressed for this long (0: never)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	opt.prog = fs.Args()
	if opt.n < 1 {
		return usageError("run: -n N is required and must be >= 1")
	}
	if len(opt.prog) == 0 {
		return usageError("run: no program given (nexar %s)", runSynopsis)
	}
	if opt.seedPort < 0 || opt.seedPort > 65535 {
		return usageError("run: --seed-port %d is not a port", opt.seedPort)
	}
	if net.ParseIP(opt.bind) == nil {
		return usageError("run: --bind %q is not an IP address", opt.bind)
	}
	if opt.hang < 0 {
		return usageError("run: --hang-timeout %v is negative", opt.hang)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	opt.signals = sigs
	return launch(opt)
}

// runOptions is one `nexar run` invocation.
type runOptions struct {
	n        int
	seedPort int
	bind     string
	grace    time.Duration
	prog     []string
	stdout   io.Writer
	stderr   io.Writer
	signals  <-chan os.Signal // signals to forward to the ranks
	plain    bool             // stdout lines without the "[rank] " prefix (nexar bench)
	// flightDir and hang: the ranks' flight records and nexar run's
	// watchdog (diagnose.go).
	flightDir string
	hang      time.Duration
}

// rankProc is one started rank.
type rankProc struct {
	rank    int
	cmd     *exec.Cmd
	readers sync.WaitGroup // output copiers
}

type rankExit struct {
	rank  int
	state *os.ProcessState
	err   error // Wait failed for a reason other than the exit status
}

func (e rankExit) failed() bool { return e.err != nil || !e.state.Success() }

// killed reports whether the rank was killed by a signal (a lost rank,
// which an elastic job outlives), not a rank that failed on its own.
func (e rankExit) killed() bool {
	ws, ok := e.state.Sys().(syscall.WaitStatus)
	return e.err == nil && ok && ws.Signaled()
}

// describe says how a rank ended, e.g. "exited with status 1" or "was
// killed by signal: killed".
func (e rankExit) describe() string {
	if e.err != nil {
		return "failed: " + e.err.Error()
	}
	if ws, ok := e.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("was killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", e.state.ExitCode())
}

// code is the status nexar run exits with when this rank failed first:
// the rank's own exit status, or 128+signal like a shell.
func (e rankExit) code() int {
	if e.err != nil {
		return 1
	}
	if ws, ok := e.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if c := e.state.ExitCode(); c > 0 {
		return c
	}
	return 1
}

// launch starts the ranks and supervises them until every one has exited.
//
// The seed and torch's TCPStore get two different ports: rank 0 embeds the
// nexar seed on NEXAR_SEED's UDP port, and torch.distributed (env://) binds
// its TCPStore on MASTER_PORT on rank 0 too, so a torch script that uses
// both would otherwise collide with itself.
func launch(opt runOptions) error {
	token, err := newToken()
	if err != nil {
		return err
	}
	host := opt.bind
	if ip := net.ParseIP(host); ip.IsUnspecified() {
		host = "127.0.0.1" // listen everywhere, reach the seed locally
	}
	seedPort := opt.seedPort
	if seedPort == 0 {
		if seedPort, err = freePort("udp", host, 0); err != nil {
			return fmt.Errorf("run: no free UDP port for the seed: %w", err)
		}
	}
	masterPort, err := freePort("tcp", host, seedPort)
	if err != nil {
		return fmt.Errorf("run: no free TCP port for MASTER_PORT: %w", err)
	}
	seed := net.JoinHostPort(host, strconv.Itoa(seedPort))
	vars := map[string]string{
		"NEXAR_WORLD_SIZE": strconv.Itoa(opt.n),
		"NEXAR_SEED":       seed,
		"NEXAR_TOKEN":      token,
		"WORLD_SIZE":       strconv.Itoa(opt.n),
		"LOCAL_WORLD_SIZE": strconv.Itoa(opt.n),
		"GROUP_RANK":       "0",
		"MASTER_ADDR":      host,
		"MASTER_PORT":      strconv.Itoa(masterPort),
	}
	// Defaults a user may override from the environment: bind on the
	// requested address only, and unbuffered Python so prefixed lines show
	// up as they are printed.
	defaults := map[string]string{
		"NEXAR_BIND_ADDR":  net.JoinHostPort(opt.bind, "0"),
		"PYTHONUNBUFFERED": "1",
	}
	flight, err := flightDir(opt.flightDir, opt.hang)
	if err != nil {
		return err
	}
	if flight != "" {
		vars["NEXAR_FLIGHT_RECORDER_DIR"] = flight
		vars["NEXAR_FLIGHT_RECORDER_DUMP_ON_SIGNAL"] = "1"
	}

	out := &prefixer{}
	exits := make(chan rankExit, opt.n)
	procs := make([]*rankProc, 0, opt.n)
	for r := 0; r < opt.n; r++ {
		env := rankEnv(os.Environ(), vars, defaults, r)
		p, err := startRank(r, opt.prog, env, out, opt.stdout, opt.stderr, opt.plain)
		if err != nil {
			for _, q := range procs {
				q.signal(syscall.SIGKILL)
			}
			for range procs {
				<-exits
			}
			return fmt.Errorf("run: starting rank %d: %w", r, err)
		}
		procs = append(procs, p)
		go func() {
			err := p.cmd.Wait()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = nil
			}
			exits <- rankExit{rank: p.rank, state: p.cmd.ProcessState, err: err}
		}()
	}

	if opt.hang > 0 {
		stop := make(chan struct{})
		watched := make(chan struct{})
		groups := make([]int, len(procs)) // each rank leads its process group (sysProcAttr)
		for i, p := range procs {
			groups[i] = p.cmd.Process.Pid
		}
		go func() {
			defer close(watched)
			watchProgress(flight, opt.hang, groups, opt.stderr, stop)
		}()
		defer func() { close(stop); <-watched }()
	}
	running := make([]bool, opt.n)
	for i := range running {
		running[i] = true
	}
	signalRunning := func(sig syscall.Signal) {
		for _, p := range procs {
			if running[p.rank] {
				p.signal(sig)
			}
		}
	}
	// An elastic job (NEXAR_ON_FAILURE=shrink or manual) outlives a rank
	// killed by a signal: the others carry on without it, and nexar run
	// does not stop them (docs/fault-tolerance.md).
	policy, _ := core.LookupKnob(nil, "NEXAR_ON_FAILURE")
	elastic := false
	if p, err := core.ParseFailurePolicy(policy); err == nil && p != core.PolicyAbort {
		elastic = true
	}
	var lost []int
	var (
		first     *rankExit             // the first rank seen to fail
		together  = make([]bool, opt.n) // ranks already gone when first was seen
		failed    []rankExit            // first and those of together that failed
		caught    os.Signal             // a signal nexar itself received
		killTimer <-chan time.Time
		left      = opt.n
	)
	for left > 0 {
		select {
		case e := <-exits:
			left--
			running[e.rank] = false
			if elastic && e.killed() && caught == nil && first == nil {
				lost = append(lost, e.rank)
				fmt.Fprintf(opt.stderr, "nexar run: rank %d %s; the others carry on (NEXAR_ON_FAILURE=%s)\n",
					e.rank, e.describe(), policy)
				continue
			}
			if together[e.rank] {
				if e.failed() {
					failed = append(failed, e)
					fmt.Fprintf(opt.stderr, "nexar run: rank %d %s\n", e.rank, e.describe())
				}
				continue
			}
			if e.failed() && first == nil && caught == nil {
				first = &e
				failed = append(failed, e)
				// Ranks that exit within the same moment are reaped in
				// no particular order, so the first exit seen need not
				// be the first failure (a rank that loses a peer fails
				// right after it). Those already gone are named too.
				var gone []int
				for _, p := range procs {
					if running[p.rank] && exitedNow(p.cmd.Process.Pid) {
						together[p.rank] = true
						gone = append(gone, p.rank)
					}
				}
				if len(gone) > 0 {
					fmt.Fprintf(opt.stderr, "nexar run: rank %d %s; ranks %v had exited too; stopping the other ranks\n", e.rank, e.describe(), gone)
				} else {
					fmt.Fprintf(opt.stderr, "nexar run: rank %d %s; stopping the other ranks\n", e.rank, e.describe())
				}
				signalRunning(syscall.SIGTERM)
				killTimer = time.After(opt.grace)
			}
		case s := <-opt.signals:
			if caught != nil || first != nil {
				signalRunning(syscall.SIGKILL) // asked twice: no more grace
				continue
			}
			caught = s
			fmt.Fprintf(opt.stderr, "nexar run: got %v; forwarding it to the ranks\n", s)
			if ss, ok := s.(syscall.Signal); ok {
				signalRunning(ss)
			} else {
				signalRunning(syscall.SIGTERM)
			}
			killTimer = time.After(opt.grace)
		case <-killTimer:
			for _, p := range procs {
				if running[p.rank] {
					fmt.Fprintf(opt.stderr, "nexar run: rank %d still running after %v; killing it\n", p.rank, opt.grace)
				}
			}
			signalRunning(syscall.SIGKILL)
			killTimer = nil
		}
	}
	if first != nil || caught != nil {
		// Leftover children of the ranks (same process group) go too.
		for _, p := range procs {
			p.signal(syscall.SIGKILL)
		}
	}
	waitOutput(procs, 2*time.Second)

	if len(lost) == opt.n && first == nil && caught == nil {
		return &exitError{code: 1, msg: fmt.Sprintf("run: every rank was lost: %v", lost)}
	}
	if len(lost) > 0 && first == nil && caught == nil {
		fmt.Fprintf(opt.stderr, "nexar run: the job finished without the ranks it lost: %v\n", lost)
	}
	switch {
	case first != nil && len(failed) > 1:
		sort.Slice(failed, func(i, j int) bool { return failed[i].rank < failed[j].rank })
		parts := make([]string, len(failed))
		for i, e := range failed {
			parts[i] = fmt.Sprintf("rank %d %s", e.rank, e.describe())
		}
		return &exitError{code: first.code(), msg: "run: ranks failed at the same moment (which was first is not known): " + strings.Join(parts, "; ")}
	case first != nil:
		return &exitError{code: first.code(), msg: fmt.Sprintf("run: rank %d %s", first.rank, first.describe())}
	case caught != nil:
		code := 1
		if ss, ok := caught.(syscall.Signal); ok {
			code = 128 + int(ss)
		}
		return &exitError{code: code, msg: fmt.Sprintf("run: interrupted by %v", caught)}
	}
	return nil
}

// rankEnv is base with vars and the per-rank variables set (replacing any
// inherited value) and defaults set where base has no value.
func rankEnv(base []string, vars, defaults map[string]string, rank int) []string {
	set := map[string]string{
		"NEXAR_RANK": strconv.Itoa(rank),
		"RANK":       strconv.Itoa(rank),
		"LOCAL_RANK": strconv.Itoa(rank),
	}
	for k, v := range vars {
		set[k] = v
	}
	env := make([]string, 0, len(base)+len(set)+len(defaults))
	present := map[string]bool{}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; ok {
			continue
		}
		present[k] = true
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	for k, v := range defaults {
		if !present[k] {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func startRank(rank int, prog, env []string, out *prefixer, stdout, stderr io.Writer, plain bool) (*rankProc, error) {
	cmd := exec.Command(prog[0], prog[1:]...)
	cmd.Env = env
	cmd.Stdin = nil
	cmd.SysProcAttr = sysProcAttr()
	p := &rankProc{rank: rank, cmd: cmd}
	// Own pipes rather than cmd.StdoutPipe: Wait must not wait for (or
	// close) the readers, which drain until every holder of the pipe is gone.
	var files []*os.File
	for range 2 {
		r, wf, err := os.Pipe()
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, r, wf)
	}
	cmd.Stdout, cmd.Stderr = files[1], files[3]
	err := cmd.Start()
	files[1].Close()
	files[3].Close()
	if err != nil {
		files[0].Close()
		files[2].Close()
		return nil, err
	}
	for i, w := range []io.Writer{stdout, stderr} {
		r := files[2*i]
		prefix := []byte("[" + strconv.Itoa(rank) + "] ")
		if i == 0 && plain {
			prefix = nil
		}
		p.readers.Add(1)
		go func() {
			defer p.readers.Done()
			defer r.Close()
			out.copyLines(w, r, prefix)
		}()
	}
	return p, nil
}

// signal sends sig to the rank's whole process group.
func (p *rankProc) signal(sig syscall.Signal) {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		_ = p.cmd.Process.Signal(sig) // not a group leader after all
	}
}

// waitOutput waits up to d for the ranks' output to drain; a background
// grandchild that keeps a pipe open must not hang the launcher.
func waitOutput(procs []*rankProc, d time.Duration) {
	done := make(chan struct{})
	go func() {
		for _, p := range procs {
			p.readers.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// prefixer writes whole lines, each behind its rank prefix; its mutex keeps
// lines from different ranks and streams from interleaving. Safe for
// concurrent use.
type prefixer struct {
	mu sync.Mutex
}

// maxLine bounds a line held in memory; longer lines are split.
const maxLine = 1 << 20

func (p *prefixer) copyLines(w io.Writer, r io.Reader, prefix []byte) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > 0 && (err == nil || len(line) >= maxLine || (err != nil && !errors.Is(err, bufio.ErrBufferFull))) {
			p.writeLine(w, prefix, line)
			line = line[:0]
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (p *prefixer) writeLine(w io.Writer, prefix, line []byte) {
	buf := make([]byte, 0, len(prefix)+len(line)+1)
	buf = append(buf, prefix...)
	buf = append(buf, line...)
	if !bytes.HasSuffix(buf, []byte("\n")) {
		buf = append(buf, '\n')
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = w.Write(buf)
}

// newToken returns 32 random bytes, hex encoded: the job's shared secret.
func newToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("run: generating the token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// freePort asks the kernel for a free port on host, other than avoid. The
// port is released before it is used, so another process could take it in
// between; torchrun has the same window.
func freePort(network, host string, avoid int) (int, error) {
	for range 16 {
		var port int
		switch network {
		case "udp":
			c, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
			if err != nil {
				return 0, err
			}
			port = c.LocalAddr().(*net.UDPAddr).Port
			c.Close()
		default:
			l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				return 0, err
			}
			port = l.Addr().(*net.TCPAddr).Port
			l.Close()
		}
		if port != avoid {
			return port, nil
		}
	}
	return 0, errors.New("the kernel kept returning the same port")
}
