// Package netns runs a nexar job across two "hosts": two Linux network
// namespaces joined by a veth pair with real addresses (10.77.0.1/24 and
// 10.77.0.2/24, visible only inside the namespaces the test creates). It
// needs root and iproute2's ip, and skips with a message otherwise.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	addrA = "10.77.0.1"
	addrB = "10.77.0.2"
)

// host is one network namespace.
type host struct {
	ns, addr string
	dev      string // its end of the veth pair
}

// twoHosts creates the namespaces and the veth pair, or skips the test. The
// namespaces (and with them the veth pair) are deleted when the test ends.
func twoHosts(t *testing.T) (a, b host) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("netns: network namespaces are Linux only")
	}
	if os.Geteuid() != 0 {
		t.Skip("netns: needs root to create network namespaces (run make test as root to include this test)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("netns: needs iproute2's ip (apt-get install iproute2)")
	}
	id := fmt.Sprintf("%d%s", os.Getpid()%100000, randHex(2))
	a = host{ns: "nexar-a-" + id, addr: addrA}
	b = host{ns: "nexar-b-" + id, addr: addrB}
	if out, err := exec.Command("ip", "netns", "add", a.ns).CombinedOutput(); err != nil {
		t.Skipf("netns: cannot create a network namespace here (%v: %s)", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", a.ns).Run() })
	ip(t, "netns", "add", b.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", b.ns).Run() })
	va, vb := "nxa"+id, "nxb"+id // interface names: at most 15 bytes
	a.dev, b.dev = va, vb
	ip(t, "link", "add", va, "type", "veth", "peer", "name", vb)
	ip(t, "link", "set", va, "netns", a.ns)
	ip(t, "link", "set", vb, "netns", b.ns)
	for _, h := range []struct {
		host
		dev string
	}{{a, va}, {b, vb}} {
		ip(t, "-n", h.ns, "addr", "add", h.addr+"/24", "dev", h.dev)
		ip(t, "-n", h.ns, "link", "set", h.dev, "up")
		ip(t, "-n", h.ns, "link", "set", "lo", "up")
	}
	return a, b
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// build compiles the launcher and the multi-process test program.
func build(t *testing.T) (nexar, testprog string) {
	t.Helper()
	dir := t.TempDir()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	nexar, testprog = filepath.Join(dir, "nexar"), filepath.Join(dir, "testprog")
	for _, b := range []struct{ out, pkg string }{
		{nexar, "github.com/nexar-go/nexar/cmd/nexar"},
		{testprog, "github.com/nexar-go/nexar/tests/multiproc/testprog"},
	} {
		if out, err := exec.Command(gobin, "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nexar, testprog
}

func cleanEnv(extra ...string) []string {
	drop := regexp.MustCompile(`^(NEXAR_|RANK=|LOCAL_RANK=|WORLD_SIZE=|LOCAL_WORLD_SIZE=|MASTER_ADDR=|MASTER_PORT=|SLURM_|OMPI_COMM_WORLD_)`)
	var env []string
	for _, kv := range os.Environ() {
		if !drop.MatchString(kv) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

type proc struct {
	name string
	ns   string
	cmd  *exec.Cmd
	out  syncBuffer
}

// syncBuffer is a bytes.Buffer that may be read while the process writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startIn runs prog in namespace ns with env, bounded by ctx.
func startIn(t *testing.T, ctx context.Context, name, ns string, env []string, prog ...string) *proc {
	t.Helper()
	p := &proc{name: name, ns: ns, cmd: exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, prog...)...)}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return p
}

// onePerHost starts one rank on each of hosts (rank r on hosts[r]), joined
// through a seed embedded in rank 0 on port, each running prog with
// extra in its environment.
func onePerHost(t *testing.T, ctx context.Context, hosts []host, port int, extra []string, prog ...string) []*proc {
	t.Helper()
	token := randHex(32)
	seed := fmt.Sprintf("%s:%d", hosts[0].addr, port)
	var procs []*proc
	for r, h := range hosts {
		env := cleanEnv(append([]string{"NEXAR_RANK=" + strconv.Itoa(r), "NEXAR_WORLD_SIZE=" + strconv.Itoa(len(hosts)),
			"NEXAR_SEED=" + seed, "NEXAR_TOKEN=" + token, "NEXAR_ADVERTISE_ADDR=" + h.addr}, extra...)...)
		procs = append(procs, startIn(t, ctx, fmt.Sprintf("rank %d in %s", r, h.ns), h.ns, env, prog...))
	}
	return procs
}

func TestTwoHosts(t *testing.T) {
	a, b := twoHosts(t)
	nexar, testprog := build(t)
	if out, err := exec.Command("ip", "netns", "exec", a.ns, "ping", "-c", "1", "-W", "2", b.addr).CombinedOutput(); err == nil {
		t.Logf("veth up: %s", firstLine(out))
	}
	const n = 4
	onHost := func(r int) host {
		if r < 2 {
			return a
		}
		return b
	}
	tests := []struct {
		name       string
		standalone bool   // nexar seed in host a; ranks assigned in join order
		advertise  bool   // NEXAR_ADVERTISE_ADDR set explicitly
		bulk       string // NEXAR_BULK; empty: the default (auto)
	}{
		{name: "embedded seed, explicit advertise", advertise: true},
		{name: "embedded seed, advertise from route"},
		{name: "stand-alone seed", standalone: true, advertise: true},
		{name: "quic data path", advertise: true, bulk: "off"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			token := randHex(32)
			seed := fmt.Sprintf("%s:%d", a.addr, 29500+i)
			var procs []*proc
			if tc.standalone {
				procs = append(procs, startIn(t, ctx, "seed", a.ns, cleanEnv("NEXAR_TOKEN="+token),
					nexar, "seed", "--listen", seed, "--world-size", strconv.Itoa(n)))
			}
			for r := range n {
				h := onHost(r)
				rank := strconv.Itoa(r)
				if tc.standalone {
					rank = "-1"
				}
				env := cleanEnv("NEXAR_RANK="+rank, "NEXAR_WORLD_SIZE="+strconv.Itoa(n), "NEXAR_SEED="+seed,
					"NEXAR_TOKEN="+token)
				if tc.standalone {
					// Asked for every interface; the other cases bind the
					// default: the address that reaches the seed.
					env = append(env, "NEXAR_BIND_ADDR=0.0.0.0:0")
				}
				if tc.advertise {
					env = append(env, "NEXAR_ADVERTISE_ADDR="+h.addr)
				}
				if tc.bulk != "" {
					env = append(env, "NEXAR_BULK="+tc.bulk)
				}
				procs = append(procs, startIn(t, ctx, fmt.Sprintf("rank %d in %s", r, h.ns), h.ns, env, testprog, "check"))
			}
			checked := 0
			paths := map[[2]int]string{} // (rank, peer) -> data path
			where := map[int]string{}    // rank -> namespace (join order may differ from r)
			for _, p := range procs {
				if err := p.cmd.Wait(); err != nil {
					t.Errorf("%s: %v\n%s", p.name, err, p.out.String())
				}
				checked += strings.Count(p.out.String(), "CHECKED")
				for rp, path := range dataPaths(p.out.String()) {
					paths[rp] = path
					where[rp[0]] = p.ns
				}
			}
			if checked != n {
				t.Errorf("%d ranks reported CHECKED, want %d", checked, n)
			}
			// The data must really cross the link: over TCP between the
			// namespaces by default (shared memory within one), over QUIC
			// with the bulk path off.
			for r := range n {
				for p := range n {
					want := "quic"
					switch {
					case p == r:
						want = "loopback"
					case tc.bulk == "off":
					case where[p] == where[r]:
						want = "shm"
					default:
						want = "tcp"
					}
					got, ok := paths[[2]int{r, p}]
					if !ok {
						t.Errorf("rank %d reported no data path to rank %d", r, p)
					} else if !strings.HasPrefix(got, want) {
						t.Errorf("rank %d (in %s) reaches rank %d (in %s) by %q, want %s", r, where[r], p, where[p], got, want)
					}
				}
			}
		})
	}
}

var pathRE = regexp.MustCompile(`(?m)^PATH rank=(\d+) peer=(\d+) (.*)$`)

// dataPaths collects the "PATH rank=R peer=P desc" lines of testprog: the
// path that carries R's data to P.
func dataPaths(out string) map[[2]int]string {
	m := map[[2]int]string{}
	for _, sm := range pathRE.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(sm[1])
		p, _ := strconv.Atoi(sm[2])
		m[[2]int{r, p}] = sm[3]
	}
	return m
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}
