package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the launcher's concurrent writers.
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

func needSh(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh on this machine")
	}
}

func runSh(t *testing.T, n int, script string, sigs <-chan os.Signal) (stdout, stderr string, err error) {
	t.Helper()
	var o, e syncBuffer
	err = launch(runOptions{n: n, bind: "127.0.0.1", grace: 2 * time.Second,
		prog: []string{"sh", "-c", script}, stdout: &o, stderr: &e, signals: sigs})
	return o.String(), e.String(), err
}

func TestRunEnvAndPrefix(t *testing.T) {
	needSh(t)
	script := `echo "env $NEXAR_RANK $RANK $LOCAL_RANK $NEXAR_WORLD_SIZE $WORLD_SIZE $LOCAL_WORLD_SIZE $NEXAR_SEED $MASTER_ADDR $MASTER_PORT ${#NEXAR_TOKEN}"; echo oops >&2; printf 'no newline'`
	out, errOut, err := runSh(t, 3, script, nil)
	if err != nil {
		t.Fatalf("launch: %v\nstderr:\n%s", err, errOut)
	}
	re := regexp.MustCompile(`(?m)^\[(\d)\] env (\d) (\d) (\d) 3 3 3 127\.0\.0\.1:(\d+) 127\.0\.0\.1 (\d+) 64$`)
	ms := re.FindAllStringSubmatch(out, -1)
	if len(ms) != 3 {
		t.Fatalf("want 3 env lines, got:\n%s", out)
	}
	seen := map[string]bool{}
	for _, m := range ms {
		if m[1] != m[2] || m[2] != m[3] || m[3] != m[4] {
			t.Errorf("prefix and rank variables disagree: %q", m[0])
		}
		if m[5] == m[6] {
			t.Errorf("NEXAR_SEED and MASTER_PORT share port %s", m[5])
		}
		seen[m[1]] = true
	}
	if len(seen) != 3 {
		t.Errorf("ranks seen %v, want 0, 1, 2", seen)
	}
	for r := range 3 {
		p := "[" + string(rune('0'+r)) + "] "
		if !strings.Contains(out, p+"no newline\n") {
			t.Errorf("rank %d: unterminated last line not flushed with its prefix:\n%s", r, out)
		}
		if !strings.Contains(errOut, p+"oops\n") {
			t.Errorf("rank %d: stderr line missing:\n%s", r, errOut)
		}
	}
}

func TestRunFailureStopsOthers(t *testing.T) {
	needSh(t)
	start := time.Now()
	_, errOut, err := runSh(t, 4, `if [ "$NEXAR_RANK" = 2 ]; then sleep 0.2; exit 7; fi; exec sleep 60`, nil)
	var ee *exitError
	if !errors.As(err, &ee) {
		t.Fatalf("launch = %v, want an exit error", err)
	}
	if ee.code != 7 || !strings.Contains(ee.msg, "rank 2 exited with status 7") {
		t.Errorf("exit = %d %q, want 7 naming rank 2", ee.code, ee.msg)
	}
	if !strings.Contains(errOut, "rank 2 exited with status 7") {
		t.Errorf("stderr does not name rank 2:\n%s", errOut)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stopping the others took %v", d)
	}
}

func TestRunKillsAfterGrace(t *testing.T) {
	needSh(t)
	// Rank 1 ignores SIGTERM, so it needs the SIGKILL after the grace;
	// rank 0 fails only once rank 1's trap is set.
	ready := filepath.Join(t.TempDir(), "ready")
	script := `if [ "$NEXAR_RANK" = 0 ]; then while [ ! -e ` + ready + ` ]; do sleep 0.02; done; exit 1; fi
trap '' TERM; touch ` + ready + `; while :; do sleep 0.1; done`
	_, errOut, err := runSh(t, 2, script, nil)
	if err == nil {
		t.Fatal("launch succeeded, want failure")
	}
	if !strings.Contains(errOut, "rank 1 still running") {
		t.Errorf("no SIGKILL after the grace period:\n%s", errOut)
	}
}

func TestRunSignalForwarded(t *testing.T) {
	needSh(t)
	dir := t.TempDir()
	sigs := make(chan os.Signal, 1)
	go func() {
		// Signal once both ranks have set their trap (bounded wait).
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_, e0 := os.Stat(filepath.Join(dir, "0"))
			_, e1 := os.Stat(filepath.Join(dir, "1"))
			if e0 == nil && e1 == nil {
				break
			}
		}
		sigs <- syscall.SIGTERM
	}()
	out, _, err := runSh(t, 2, `trap 'echo got-term; exit 0' TERM; touch `+dir+`/$NEXAR_RANK; while :; do sleep 0.05; done`, sigs)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("launch = %v, want exit %d", err, 128+int(syscall.SIGTERM))
	}
	if strings.Count(out, "got-term") != 2 {
		t.Errorf("SIGTERM not forwarded to both ranks:\n%s", out)
	}
}

func TestRunKilledRank(t *testing.T) {
	needSh(t)
	_, _, err := runSh(t, 2, `if [ "$NEXAR_RANK" = 1 ]; then kill -9 $$; fi; exec sleep 60`, nil)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 128+9 || !strings.Contains(ee.msg, "rank 1 was killed by signal 9") {
		t.Fatalf("launch = %v, want rank 1 killed by signal 9", err)
	}
}

func TestRankEnv(t *testing.T) {
	base := []string{"PATH=/bin", "RANK=99", "NEXAR_BIND_ADDR=10.0.0.1:0", "KEEP=1"}
	env := rankEnv(base, map[string]string{"WORLD_SIZE": "2"}, map[string]string{"NEXAR_BIND_ADDR": "127.0.0.1:0", "PYTHONUNBUFFERED": "1"}, 1)
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Errorf("variable %s set twice", k)
		}
		got[k] = v
	}
	for k, want := range map[string]string{"RANK": "1", "NEXAR_RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
		"NEXAR_BIND_ADDR": "10.0.0.1:0", "PYTHONUNBUFFERED": "1", "KEEP": "1", "PATH": "/bin"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
}

func TestPrefixerLongLines(t *testing.T) {
	var p prefixer
	var out bytes.Buffer
	long := strings.Repeat("x", maxLine+10)
	p.copyLines(&out, strings.NewReader("a\n"+long+"\nb"), []byte("[3] "))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 4 || lines[0] != "[3] a" || lines[3] != "[3] b" {
		t.Fatalf("got %d lines, first %q", len(lines), lines[0])
	}
	if !strings.HasPrefix(lines[2], "[3] x") || len(lines[1])+len(lines[2]) != 2*4+len(long) {
		t.Errorf("long line split wrongly: %d + %d bytes", len(lines[1]), len(lines[2]))
	}
}

func TestMainUsage(t *testing.T) {
	var o, e bytes.Buffer
	if c := mainErr(nil, &o, &e); c != 2 {
		t.Errorf("no args: status %d, want 2", c)
	}
	if c := mainErr([]string{"run", "--", "true"}, &o, &e); c != 2 || !strings.Contains(e.String(), "-n N is required") {
		t.Errorf("run without -n: status %d, stderr %q", c, e.String())
	}
	o.Reset()
	if c := mainErr([]string{"version"}, &o, &e); c != 0 || strings.TrimSpace(o.String()) != "nexar "+version {
		t.Errorf("version: status %d, %q", c, o.String())
	}
	o.Reset()
	if c := mainErr([]string{"info"}, &o, &e); c != 0 || !strings.Contains(o.String(), "quic") || !strings.Contains(o.String(), "rdma") {
		t.Errorf("info: status %d, %q", c, o.String())
	}
}

// TestMain lets the launcher tests start this test binary as the nexar
// command: nexar bench starts its ranks as copies of os.Executable().
func TestMain(m *testing.M) {
	if os.Getenv("NEXAR_TEST_AS_MAIN") == "1" {
		os.Exit(mainErr(os.Args[1:], os.Stdout, os.Stderr))
	}
	if mode := os.Getenv("NEXAR_TEST_RANK_MODE"); mode != "" {
		os.Exit(testRank(mode)) // diagnose_test.go
	}
	os.Exit(m.Run())
}

var benchRow = regexp.MustCompile(`(?m)^\s+\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+0$`)

func TestBench(t *testing.T) {
	t.Setenv("NEXAR_TEST_AS_MAIN", "1") // for the ranks, not this process
	for _, tc := range []struct {
		name string
		args []string
		rows int
	}{
		// 5 collectives x sizes 8, 64, 512, 4096.
		{"processes", []string{"-n", "3", "--min", "8", "--max", "4K", "--factor", "8", "--iters", "2"}, 5 * 4},
		{"inproc", []string{"-n", "2", "--inproc", "--sizes", "4,1000", "--iters", "1"}, 5 * 2},
		{"bfloat16_max", []string{"-n", "2", "--ops", "allreduce,reduce_scatter", "--dtype", "bfloat16", "--op", "max", "--sizes", "2,3000"}, 2 * 2},
		{"float16_avg", []string{"-n", "3", "--ops", "allreduce", "--dtype", "float16", "--op", "avg", "--sizes", "600K"}, 1},
		// In place the timed calls sum their own results: the check runs
		// one more call on fresh input, and a wrong one is counted.
		{"inplace", []string{"-n", "3", "--ops", "allreduce,broadcast", "--inplace", "--sizes", "8,300K,3M", "--iters", "5"}, 2 * 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o, e syncBuffer
			if c := mainErr(append([]string{"bench"}, tc.args...), &o, &e); c != 0 {
				t.Fatalf("bench: status %d\n%s%s", c, o.String(), e.String())
			}
			if rows := benchRow.FindAllString(o.String(), -1); len(rows) != tc.rows {
				t.Errorf("got %d rows with no wrong element, want %d:\n%s", len(rows), tc.rows, o.String())
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		var o, e syncBuffer
		if c := mainErr([]string{"bench", "-n", "2", "--json", "--ops", "allreduce", "--sizes", "8,1M"}, &o, &e); c != 0 {
			t.Fatalf("bench: status %d\n%s%s", c, o.String(), e.String())
		}
		lines := strings.Split(strings.TrimSpace(o.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("want 2 JSON lines, got:\n%s", o.String())
		}
		for _, l := range lines {
			var r struct {
				System, Op, Path string
				Bytes, Ranks     int
				TimeUS           float64 `json:"time_us"`
				Wrong            int
				Stats            map[string]int64
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil || r.System != "nexar" || r.Op != "allreduce" || r.Ranks != 2 || r.TimeUS <= 0 || r.Wrong != 0 || !strings.HasPrefix(r.Path, "shm") ||
				r.Stats["bytes_sent"] <= 0 || r.Stats["ring_bytes"] <= 0 {
				t.Errorf("bad line %q (%v)", l, err)
			}
		}
	})
}
