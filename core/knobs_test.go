package core

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nexar-go/nexar/topology"
)

var updateKnobDocs = flag.Bool("update-knobs", false, "rewrite docs/reference/env.md, README's table and nexar/_knobs.py from the knob table")

// envOf is a lookup over kv pairs.
func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestKnobTable checks every row: a unique name, docs, a Config field that
// exists, and a parser exactly where libnexar applies the knob.
func TestKnobTable(t *testing.T) {
	seen := map[string]bool{}
	ct := reflect.TypeOf(Config{})
	for _, k := range Knobs() {
		for _, n := range append([]string{k.Name}, k.Aliases...) {
			if seen[n] || !strings.HasPrefix(n, "NEXAR_") {
				t.Errorf("%s: duplicate or not NEXAR_*", n)
			}
			seen[n] = true
		}
		if k.Forms == "" || k.Doc == "" || k.Default == "" || k.Group == "" {
			t.Errorf("%s: forms, doc, default and group are all needed: %+v", k.Name, k)
		}
		applied := k.Scope == ScopeJob || k.Scope == ScopeProcess
		if applied != (k.set != nil) {
			t.Errorf("%s: scope %s, parser %v", k.Name, k.Scope, k.set != nil)
		}
		if k.Scope == ScopeBinding {
			if k.Field != "" || !k.Python {
				t.Errorf("%s: a binding knob has no Config field and is read by Python", k.Name)
			}
			continue
		}
		typ := ct
		for _, part := range strings.Split(k.Field, ".") {
			f, ok := typ.FieldByName(part)
			if !ok {
				t.Fatalf("%s: Config has no field %s", k.Name, k.Field)
			}
			typ = f.Type
		}
	}
}

// TestWithEnv shows the one precedence (explicit field > environment >
// profile > default), every kind of knob taking effect, the aliases, and
// errors that name the variable and the forms.
func TestWithEnv(t *testing.T) {
	env := envOf(
		"NEXAR_TOPOLOGY", "k_regular:2", "NEXAR_BULK", "tcp", "NEXAR_BULK_PLAINTEXT", "1",
		"NEXAR_TIMEOUT", "20s", "NEXAR_SCHEDULES", "rank", "NEXAR_RECOVERY_POLICY", "shrink",
		"NEXAR_RING_BUDGET", "2097152", "NEXAR_MEMORY_PROFILE", "inference", "NEXAR_IB_HCA", "mlx5_1:2",
		"NEXAR_IB_GID_INDEX", "3", "NEXAR_CUDART", "/opt/cudart.so", "NEXAR_SPIN_WAIT", "-1ns",
		"NEXAR_IDLE_SYSMON", "0", "NEXAR_NCCL_HIER", "off")
	cfg, err := Config{Env: env}.WithEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Topology != (topology.Spec{Kind: topology.KRegular, N: 2}) || cfg.Bulk != "tcp" || !cfg.BulkPlaintext ||
		cfg.Timeout != 20*time.Second || cfg.Schedules != "rank" || cfg.OnFailure != PolicyShrink ||
		cfg.RDMA.Device != "mlx5_1" || cfg.RDMA.Port != 2 || !cfg.RDMA.SetGIDIndex || cfg.RDMA.GIDIndex != 3 ||
		cfg.CUDARuntime != "/opt/cudart.so" || cfg.SpinWait >= 0 || !cfg.NormalSysmon || cfg.NCCLHier != "off" {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	// The environment beats the profile, the profile the default.
	r := cfg.withDefaults()
	if r.RingBudget != 2<<20 || r.RingSize != 1<<20 || r.MaxBufferedBytes != 32<<20 {
		t.Errorf("env > profile > default: ring budget %d, ring size %d, buffered %d", r.RingBudget, r.RingSize, r.MaxBufferedBytes)
	}
	// An explicit field beats the environment.
	cfg, err = Config{Env: env, Bulk: "shm", Timeout: time.Second, Topology: topology.Spec{Kind: topology.Hypercube},
		OnFailure: PolicyManual, MemoryProfile: "training"}.WithEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bulk != "shm" || cfg.Timeout != time.Second || cfg.Topology.Kind != topology.Hypercube || cfg.OnFailure != PolicyManual ||
		cfg.MemoryProfile != "training" {
		t.Errorf("the environment overrode an explicit field: %+v", cfg)
	}
	// The first name of a knob beats its alias.
	if cfg, _ := (Config{Env: envOf("NEXAR_ON_FAILURE", "manual", "NEXAR_RECOVERY_POLICY", "shrink")}).WithEnv(); cfg.OnFailure != PolicyManual {
		t.Errorf("NEXAR_ON_FAILURE lost to its alias: %v", cfg.OnFailure)
	}
	// Launcher knobs are not WithEnv's.
	if cfg, _ := (Config{Env: envOf("NEXAR_RANK", "3", "NEXAR_SEED", "h:1")}).WithEnv(); cfg.Rank != 0 || cfg.Seed != "" {
		t.Errorf("WithEnv read a launcher knob: %+v", cfg)
	}
	for _, bad := range [][2]string{
		{"NEXAR_TOPOLOGY", "ring"}, {"NEXAR_BULK", "ib"}, {"NEXAR_BULK_PLAINTEXT", "maybe"}, {"NEXAR_TIMEOUT", "soon"},
		{"NEXAR_TIMEOUT", "-1s"}, {"NEXAR_SCHEDULES", "tree"}, {"NEXAR_BULK_CONNS", "17"}, {"NEXAR_IB_HCA", "mlx5_0:x"},
		{"NEXAR_IB_GID_INDEX", "-1"}, {"NEXAR_RECOVERY_POLICY", "retry"}, {"NEXAR_MEMORY_PROFILE", "huge"},
		{"NEXAR_DEBUG", "LOUD"}, {"NEXAR_NCCL_HIER", "yes"}, {"NEXAR_JOIN_ADDR", "nowhere"}, {"NEXAR_IDLE_SYSMON", "2"},
	} {
		in := Config{Env: envOf(bad[0], bad[1]), Timeout: 0}
		out, err := in.WithEnv()
		if err == nil {
			t.Errorf("%s=%s accepted", bad[0], bad[1])
			continue
		}
		var k Knob
		for _, kk := range Knobs() {
			if kk.Name == bad[0] || (len(kk.Aliases) > 0 && kk.Aliases[0] == bad[0]) {
				k = kk
			}
		}
		if msg := err.Error(); !strings.Contains(msg, bad[0]) || !strings.Contains(msg, k.Forms) {
			t.Errorf("%s=%s: %q does not name the variable and the forms %q", bad[0], bad[1], msg, k.Forms)
		}
		if !reflect.DeepEqual(fmt.Sprintf("%+v", out), fmt.Sprintf("%+v", in)) {
			t.Errorf("%s=%s: a failed WithEnv changed the config", bad[0], bad[1])
		}
	}
	// New reports it as an invalid argument.
	if _, err := testNewLocal(1, Config{Env: envOf("NEXAR_BULK", "fast")}); err == nil || !strings.Contains(err.Error(), "NEXAR_BULK") {
		t.Errorf("NewLocal with NEXAR_BULK=fast: %v", err)
	}
}

// TestSetKnob: the bindings' explicit settings parse like the variables.
func TestSetKnob(t *testing.T) {
	var cfg Config
	if err := cfg.SetKnob("NEXAR_TOPOLOGY", "hypercube"); err != nil || cfg.Topology.Kind != topology.Hypercube {
		t.Fatalf("%v %+v", err, cfg.Topology)
	}
	if err := cfg.SetKnob("NEXAR_TOPOLOGY", "ring"); err == nil || !strings.Contains(err.Error(), "kregular:K") {
		t.Errorf("bad topology: %v", err)
	}
	if err := cfg.SetKnob("NEXAR_RANK", "1"); err == nil {
		t.Error("a launcher knob was set")
	}
	if err := cfg.SetKnob("NEXAR_NOPE", "1"); err == nil {
		t.Error("an unknown knob was set")
	}
}

// TestConfigFromLookupAppliesTable: ConfigFromEnv is the launcher knobs
// plus WithEnv, through the same lookup.
func TestConfigFromLookupAppliesTable(t *testing.T) {
	cfg, err := ConfigFromLookup(envOf("WORLD_SIZE", "1", "NEXAR_TOPOLOGY", "hypercube", "NEXAR_BULK_PLAINTEXT", "true"))
	if err != nil || cfg.Topology.Kind != topology.Hypercube || !cfg.BulkPlaintext || cfg.WorldSize != 1 {
		t.Fatalf("%v %+v", err, cfg)
	}
	if _, err := ConfigFromLookup(envOf("WORLD_SIZE", "1", "NEXAR_SCHEDULES", "spiral")); err == nil || !strings.Contains(err.Error(), "NEXAR_SCHEDULES") {
		t.Errorf("bad NEXAR_SCHEDULES: %v", err)
	}
}

// moduleRoot is the repository root (core's parent).
func moduleRoot(t *testing.T) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestKnobFilesGenerated fails when docs/reference/env.md, README's
// variable table or bindings/python/nexar/_knobs.py differ from what the
// table makes; `go test ./core -run TestKnobFilesGenerated -update-knobs`
// rewrites them.
func TestKnobFilesGenerated(t *testing.T) {
	root := moduleRoot(t)
	readme := filepath.Join(root, "README.md")
	rb, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- knobs: generated from core/knobs.go; do not edit -->\n", "<!-- knobs: end -->\n"
	i, j := strings.Index(string(rb), begin), strings.Index(string(rb), end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no generated knob table between %q and %q", begin, end)
	}
	files := map[string]string{
		filepath.Join(root, "docs", "reference", "env.md"):              envMarkdown(),
		filepath.Join(root, "bindings", "python", "nexar", "_knobs.py"): knobsPython(),
		readme: string(rb[:i]) + begin + readmeTable() + string(rb[j:]),
	}
	for path, want := range files {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) == want {
			continue
		}
		if *updateKnobDocs {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("rewrote %s", path)
			continue
		}
		t.Errorf("%s differs from the knob table: run go test ./core -run TestKnobFilesGenerated -update-knobs", path)
	}
}

func knobNames(k Knob) string {
	s := "`" + k.Name + "`"
	for _, a := range k.Aliases {
		s += " (alias `" + a + "`)"
	}
	return s
}

func envMarkdown() string {
	var b strings.Builder
	b.WriteString(`# Environment variables

<!-- Generated from core/knobs.go (go test ./core -run TestKnobFilesGenerated -update-knobs); do not edit. -->

Every ` + "`NEXAR_*`" + ` knob, declared once in the table of ` + "`core/knobs.go`" + `. The same rule holds on
every entry point (Go ` + "`core.New`" + `, ` + "`nexar_comm_init`" + ` and ` + "`nexar_comm_init_from_env`" + `, C++,
Python ` + "`nexar.Comm(...)`" + ` and ` + "`nexar.init()`" + `, the torch backend, ` + "`nexar run`" + `): a setting
made explicitly (a ` + "`Config`" + ` field, a ` + "`nexar_config_t`" + ` field, a keyword argument, torch's
` + "`pg_options`" + `) beats the environment, the environment beats the memory profile, and the
profile beats the default. An unset (zero) setting takes the environment's value, so an explicit
` + "`false`" + `, ` + "`0`" + ` or ` + "`full`" + ` cannot override a variable: unset it instead. A value that does not
parse fails the call with an error naming the variable and the forms below. The C ABI reads the
environment when the call is made (` + "`getenv`" + `), so variables set with ` + "`setenv()`" + ` before the call
count.

Scopes: **launcher** knobs say which job this process belongs to and are read only where a
communicator is made from the environment (` + "`nexar_comm_init_from_env`" + `, ` + "`nexar.init()`" + `,
` + "`core.ConfigFromEnv`" + `); **job** knobs must be the same on every rank; **process** knobs are
this process's own; **binding** knobs are read by the Python package itself.
`)
	group := ""
	for _, k := range Knobs() {
		if k.Group != group {
			group = k.Group
			fmt.Fprintf(&b, "\n## %s\n\n| variable | scope | default | accepted | meaning |\n|---|---|---|---|---|\n", group)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", knobNames(k), k.Scope, k.Default, k.Forms, k.Doc)
	}
	b.WriteString(`
## Tests only

Read by the test suites, not by the library: ` + "`NEXAR_TEST_QUICK`, `NEXAR_TEST_EXHAUSTIVE`" + `,
` + "`NEXAR_TEST_SCALE`, `NEXAR_LOSSY_FULL`, `NEXAR_CHAOS_ROUNDS`, `NEXAR_TEST_AS_MAIN`" + `,
` + "`NEXAR_TEST_RANK_MODE`, `NEXAR_TEST_TIMEOUT`, `NEXAR_CLI`" + ` (see README's *make test*),
` + "`NEXAR_STRESS_CALLS` and `NEXAR_ASAN_EXT`" + ` (the torch stress test and ` + "`make test-asan`" + `:
[torch compatibility](../torch-compat.md)), and
` + "`NEXAR_FAKE_CUDA_DELAY_US` and `NEXAR_FAKE_CUDA_DMABUF`" + `, read by the fake CUDA runtime ([CUDA device
memory](../device-memory.md)), and ` + "`NEXAR_FAKE_IBV_DEVICES`, `NEXAR_FAKE_IBV_PORT_DOWN`" + `,
` + "`NEXAR_FAKE_IBV_PEERMEM`, `NEXAR_FAKE_IBV_DMABUF` and `NEXAR_FAKE_IBV_DIR`" + `, read by the fake
libibverbs (` + "`tests/fakes/ibverbs/src/fake_ibverbs.c`" + `).
`)
	return b.String()
}

func readmeTable() string {
	var b strings.Builder
	b.WriteString("| variable | meaning |\n|---|---|\n")
	for _, k := range Knobs() {
		fmt.Fprintf(&b, "| %s | %s (%s; default %s) |\n", knobNames(k), k.Doc, k.Forms, k.Default)
	}
	return b.String()
}

func knobsPython() string {
	var names []string
	for _, k := range Knobs() {
		if k.Python {
			names = append(names, k.Name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(`"""The environment knobs that the Python layers read themselves (the rest
are read by libnexar, from the same table: core/knobs.go).

Generated from core/knobs.go (go test ./core -run TestKnobFilesGenerated
-update-knobs); do not edit.

env(name) is the one place in the Python package that reads a NEXAR_*
variable; a name that is not in the table is a KeyError, so a knob cannot be
read without being declared and documented (docs/reference/env.md).
"""

from __future__ import annotations

import os
from typing import Optional

# The knobs the Python package reads itself.
PYTHON = frozenset({
`)
	for _, n := range names {
		fmt.Fprintf(&b, "    %q,\n", n)
	}
	b.WriteString(`})


def env(name: str) -> Optional[str]:
    """The value of the knob name in the environment, stripped; None when
    it is unset or blank. KeyError for a name the table does not declare."""
    if name not in PYTHON:
        raise KeyError(f"nexar: {name} is not a knob the Python package reads (core/knobs.go)")
    v = os.environ.get(name, "").strip()
    return v or None
`)
	return b.String()
}

// TestNoStrayEnvRead greps the library's code (Go, C, C++, Python; not
// tests, benchmarks or examples) for environment reads of NEXAR_* knobs (or
// of a name not written out) outside the one
// reader of each language: core's table (lookupKnob, reached through
// WithEnv, LookupKnob and ConfigFromLookup), capi's cEnv, which it is
// handed, and the Python package's nexar._knobs.env.
func TestNoStrayEnvRead(t *testing.T) {
	root := moduleRoot(t)
	read := regexp.MustCompile(`(os\.Getenv|os\.LookupEnv|C\.getenv|\bgetenv|os\.environ\.get|os\.getenv)\(|os\.environ\[`)
	// A read of a literal name other than NEXAR_* is a launcher's
	// variable (MASTER_ADDR, TORCHELASTIC_RESTART_COUNT), not a knob.
	launcher := regexp.MustCompile(`(\(|\[)\s*"[A-Z][A-Z0-9_]*"`)
	// Reads allowed, and why: each is the one reader of its language, or
	// reads no NEXAR_* knob.
	allowed := map[string]string{
		"core/knobs.go":                   "the table's reader (os.LookupEnv when Config.Env is nil)",
		"capi/comm.go":                    "cEnv: the C environment, handed to core as Config.Env",
		"bindings/python/nexar/_knobs.py": "the Python package's one reader",
		"cmd/nexar/bench.go":              "launcher variables (WORLD_SIZE, SLURM_NTASKS, ...), not knobs",
		"bindings/python/build_backend/nexar_build_backend.py": "the build's GO and NEXAR_GO_BIN, not runtime knobs",
	}
	var offenders []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case ".git", ".venv", "build", "tests", "bench", "examples", "docs", "dist", "scripts":
				return filepath.SkipDir
			}
			if strings.HasSuffix(rel, "tests") || strings.HasSuffix(rel, "cudatest") || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(path)
		if (ext != ".go" && ext != ".py" && ext != ".c" && ext != ".cpp" && ext != ".h" && ext != ".hpp") ||
			strings.HasSuffix(path, "_test.go") || strings.HasPrefix(filepath.Base(path), "test_") {
			return nil
		}
		if _, ok := allowed[filepath.ToSlash(rel)]; ok {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for n, line := range strings.Split(string(b), "\n") {
			if read.MatchString(line) && (strings.Contains(line, "NEXAR_") || !launcher.MatchString(line)) {
				offenders = append(offenders, fmt.Sprintf("%s:%d: %s", rel, n+1, strings.TrimSpace(line)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(offenders) > 0 {
		t.Errorf("environment read outside the knob table's readers (declare the knob in core/knobs.go and read it through it):\n%s",
			strings.Join(offenders, "\n"))
	}
}
