package core

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// Scope says where a knob applies and who reads it.
type Scope string

const (
	// ScopeJob knobs shape what ranks exchange (topology, schedules, the
	// data path): every rank of a job must set the same.
	ScopeJob Scope = "job"
	// ScopeProcess knobs are this process's own (addresses, timeouts,
	// memory, diagnostics, libraries).
	ScopeProcess Scope = "process"
	// ScopeLauncher knobs say which job this process belongs to (rank,
	// size, seed, token); only ConfigFromEnv and the bindings' "from the
	// environment" entry points read them, never an explicit config.
	ScopeLauncher Scope = "launcher"
	// ScopeBinding knobs are read by a binding itself (the Python
	// package's nexar._knobs.env), not by libnexar.
	ScopeBinding Scope = "binding"
)

// Knob is one row of the configuration table: an environment variable,
// the Config field it sets, how it is parsed, its default and scope.
// Knobs returns the table; docs/reference/env.md, README's table and the
// Python package's nexar/_knobs.py are generated from it (knobs_test.go
// fails on drift).
type Knob struct {
	Name    string   // the environment variable
	Aliases []string // other names read when Name is unset (nexar-rs's, former ones)
	Field   string   // the Config field it sets ("" where a binding reads it)
	Scope   Scope
	Default string // the default, as a reader of the docs wants it
	Forms   string // the accepted values, for the docs and for errors
	Doc     string // one line
	Group   string // the section of the docs
	// Python: the Python package reads it itself as well (nexar._knobs).
	Python bool
	// set parses v into cfg's field when that field is unset (explicit
	// beats the environment); nil for launcher and binding knobs.
	set func(cfg *Config, v string) error
}

// errForms is the error for a value v of knob k that does not parse.
func (k *Knob) errForms(name, v string) error {
	return fmt.Errorf("core: %s=%q: want %s", name, v, k.Forms)
}

// Knobs returns the configuration table, one row per knob, in the order
// of the docs. The slice is new on each call.
func Knobs() []Knob {
	var out []Knob
	for _, s := range knobSections() {
		for _, k := range s.knobs {
			k.Group = s.group
			out = append(out, k)
		}
	}
	return out
}

// knobSections is the table in the sections of the docs.
func knobSections() []struct {
	group string
	knobs []Knob
} {
	return []struct {
		group string
		knobs []Knob
	}{
		{"The job this process belongs to", []Knob{
			{Name: "NEXAR_RANK", Field: "Rank", Scope: ScopeLauncher, Default: "RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK",
				Forms: "an integer in [-1, world size)", Doc: "this process's rank; -1: the seed assigns ranks in join order"},
			{Name: "NEXAR_WORLD_SIZE", Field: "WorldSize", Scope: ScopeLauncher, Default: "WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE",
				Forms: "an integer >= 1", Doc: "the number of ranks"},
			{Name: "NEXAR_SEED", Field: "Seed", Scope: ScopeLauncher, Default: "MASTER_ADDR:MASTER_PORT", Python: true,
				Forms: "host:port (a comma-separated list with NEXAR_JOIN)",
				Doc:   "UDP address of the rendezvous seed; rank 0 runs it embedded when the address is its own and free"},
			{Name: "NEXAR_TOKEN", Field: "Token", Scope: ScopeLauncher, Default: "none (required for more than one rank)", Python: true,
				Forms: "a string", Doc: "the job's shared secret, the same on every rank; never logged"},
			{Name: "NEXAR_TOKEN_FILE", Field: "Token", Scope: ScopeLauncher, Default: "none",
				Forms: "a path", Doc: "a file holding the secret, read when NEXAR_TOKEN is unset (docs/guides/security.md)"},
			{Name: "NEXAR_JOIN", Field: "Join", Scope: ScopeLauncher, Default: "0",
				Forms: "a boolean (1, true, 0, false)",
				Doc:   "join a running job through NEXAR_SEED (the seed's or members' lobby addresses) when its members grow"},
		}},
		{"Addresses", []Knob{
			{Name: "NEXAR_BIND_ADDR", Field: "BindAddr", Scope: ScopeProcess, Default: "the IP that routes to the seed, a free port",
				Forms: "host:port (UDP; 0.0.0.0:0 for every interface)", Doc: "where this rank listens",
				set: setString(func(c *Config) *string { return &c.BindAddr }, checkHostPort)},
			{Name: "NEXAR_ADVERTISE_ADDR", Field: "AdvertiseAddr", Scope: ScopeProcess, Default: "the bound IP and port", Python: true,
				Forms: "host:port or host", Doc: "the address peers dial to reach this rank (the torch backend also uses its host for the seed)",
				set: setString(func(c *Config) *string { return &c.AdvertiseAddr }, nil)},
			{Name: "NEXAR_JOIN_ADDR", Field: "JoinAddr", Scope: ScopeProcess, Default: "rank 0: the seed's once formed; others: a free port",
				Forms: "host:port (UDP)", Doc: "this rank's lobby, where processes started later wait to be admitted by a grow",
				set: setString(func(c *Config) *string { return &c.JoinAddr }, checkHostPort)},
		}},
		{"Deadlines and failures", []Knob{
			{Name: "NEXAR_TIMEOUT", Field: "Timeout", Scope: ScopeProcess, Python: true, Default: "5m",
				Forms: "a positive Go duration (e.g. 30s)", Doc: "deadline of each blocking operation",
				set: setDuration(func(c *Config) *time.Duration { return &c.Timeout }, true)},
			{Name: "NEXAR_CONNECT_TIMEOUT", Field: "ConnectTimeout", Scope: ScopeProcess, Python: true, Default: "60s",
				Forms: "a positive Go duration", Doc: "deadline of rendezvous and mesh formation",
				set: setDuration(func(c *Config) *time.Duration { return &c.ConnectTimeout }, true)},
			{Name: "NEXAR_HEARTBEAT_INTERVAL", Field: "HeartbeatInterval", Scope: ScopeProcess, Default: "500ms",
				Forms: "a positive Go duration", Doc: "how often each rank tells its peers it is alive",
				set: setDuration(func(c *Config) *time.Duration { return &c.HeartbeatInterval }, true)},
			{Name: "NEXAR_HEARTBEAT_TIMEOUT", Field: "HeartbeatTimeout", Scope: ScopeProcess, Default: "3s",
				Forms: "a positive Go duration", Doc: "silence after which a peer is declared down (docs/fault-tolerance.md)",
				set: setDuration(func(c *Config) *time.Duration { return &c.HeartbeatTimeout }, true)},
			{Name: "NEXAR_HEARTBEAT_CEILING", Field: "HeartbeatCeiling", Scope: ScopeProcess, Default: "4 × NEXAR_HEARTBEAT_TIMEOUT",
				Forms: "a positive Go duration", Doc: "the longest silence of a remote peer the adaptive detector tolerates",
				set: setDuration(func(c *Config) *time.Duration { return &c.HeartbeatCeiling }, true)},
			{Name: "NEXAR_HEARTBEAT_PHI", Field: "HeartbeatPhi", Scope: ScopeProcess, Default: "8",
				Forms: "a positive number", Doc: "the suspicion (phi accrual) at which a silent remote peer is declared dead",
				set: func(c *Config, v string) error {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil || !(f > 0 && f < 100) {
						return fmt.Errorf("bad phi")
					}
					if c.HeartbeatPhi == 0 {
						c.HeartbeatPhi = f
					}
					return nil
				}},
			{Name: "NEXAR_ON_FAILURE", Aliases: []string{"NEXAR_RECOVERY_POLICY"}, Field: "OnFailure", Scope: ScopeJob, Default: "abort",
				Forms: "abort, manual or shrink", Doc: "what a member's failure does to a communicator (NEXAR_RECOVERY_POLICY: nexar-rs's name)",
				set: func(c *Config, v string) error {
					p, err := ParseFailurePolicy(v)
					if err != nil {
						return err
					}
					if c.OnFailure == PolicyAbort {
						c.OnFailure = p
					}
					return nil
				}},
			{Name: "NEXAR_MIN_WORLD_SIZE", Field: "MinWorldSize", Scope: ScopeJob, Default: "1",
				Forms: "a positive integer", Doc: "shrink refuses to leave fewer members",
				set: setInt(func(c *Config) *int { return &c.MinWorldSize }, 1, 1<<30)},
			{Name: "NEXAR_MAX_WORLD_SIZE", Field: "MaxWorldSize", Scope: ScopeJob, Default: "the first world's size",
				Forms: "a positive integer", Doc: "grow admits joiners up to this many members",
				set: setInt(func(c *Config) *int { return &c.MaxWorldSize }, 1, 1<<30)},
		}},
		{"Shape of the job", []Knob{
			{Name: "NEXAR_TOPOLOGY", Field: "Topology", Scope: ScopeJob, Default: "full",
				Forms: "full, kregular:K (k_regular:K), hypercube or ondemand:M",
				Doc:   "which ranks connect directly, the others relayed; every rank the same (docs/scale.md)",
				set: func(c *Config, v string) error {
					t, err := topology.Parse(v)
					if err != nil {
						return err
					}
					if c.Topology == (topology.Spec{}) {
						c.Topology = t
					}
					return nil
				}},
			{Name: "NEXAR_SCHEDULES", Field: "Schedules", Scope: ScopeJob, Default: "fit",
				Forms: "fit, rank or a topology's name", Doc: "the graph the collective schedules fit; part of the call signature (docs/scale.md)",
				set: setString(func(c *Config) *string { return &c.Schedules }, func(v string) error { _, err := parseSchedules(v); return err })},
		}},
		{"Data path", []Knob{
			{Name: "NEXAR_BULK", Field: "Bulk", Scope: ScopeJob, Default: "auto",
				Forms: "auto, tcp, shm, rdma or off", Doc: "the data path below QUIC (docs/bulk-path.md)",
				set: setString(func(c *Config) *string { return &c.Bulk }, transport.CheckBulkMode)},
			{Name: "NEXAR_BULK_CONNS", Field: "BulkConns", Scope: ScopeProcess, Default: "2",
				Forms: "an integer in [1, 16]", Doc: "parallel TCP connections per peer and direction",
				set: setInt(func(c *Config) *int { return &c.BulkConns }, 1, 16)},
			{Name: "NEXAR_BULK_PLAINTEXT", Field: "BulkPlaintext", Scope: ScopeJob, Default: "0",
				Forms: "a boolean (1, true, 0, false)",
				Doc:   "the network is trusted: bulk TCP without TLS, RDMA (never encrypted) chosen by auto (docs/guides/security.md)",
				set:   setBool(func(c *Config) *bool { return &c.BulkPlaintext })},
			{Name: "NEXAR_BULK_REMOTE_MIN", Field: "BulkRemoteMin", Scope: ScopeProcess, Default: "256 KiB",
				Forms: "an integer (bytes; -1: never)", Doc: "smallest message copied straight from a same-host sender's memory",
				set: setInt(func(c *Config) *int { return &c.BulkRemoteMin }, -1<<31, 1<<31-1)},
			{Name: "NEXAR_SPIN_WAIT", Field: "SpinWait", Scope: ScopeProcess, Default: "500us (a core per rank) or 200us",
				Forms: "a Go duration (0: the default, -1ns: never spin)", Doc: "how long a waiter polls shared memory before it sleeps",
				set: setDuration(func(c *Config) *time.Duration { return &c.SpinWait }, false)},
			{Name: "NEXAR_IDLE_SYSMON", Field: "NormalSysmon", Scope: ScopeProcess, Default: "1",
				Forms: "1 or 0", Doc: "1: the Go runtime's monitor thread gets SCHED_IDLE while a rank polls shared memory; 0: left alone",
				set: func(c *Config, v string) error {
					switch v {
					case "0":
						c.NormalSysmon = true
					case "1":
					default:
						return fmt.Errorf("not 1 or 0")
					}
					return nil
				}},
		}},
		{"Memory", []Knob{
			{Name: "NEXAR_MEMORY_PROFILE", Field: "MemoryProfile", Scope: ScopeProcess, Default: "default",
				Forms: "default, training or inference", Doc: "sets the four budgets below together; each overrides it",
				set: setString(func(c *Config) *string { return &c.MemoryProfile }, func(v string) error { _, err := MemoryProfileOf(v); return err })},
			{Name: "NEXAR_MAX_BUFFERED_BYTES", Field: "MaxBufferedBytes", Scope: ScopeProcess, Default: "the profile's (256 MiB)",
				Forms: "a positive integer (bytes)", Doc: "bound on the bytes of messages that arrived before their receive",
				set: setInt64(func(c *Config) *int64 { return &c.MaxBufferedBytes }, 1)},
			{Name: "NEXAR_RING_SIZE", Field: "RingSize", Scope: ScopeProcess, Default: "the profile's (8 MiB)",
				Forms: "a power of two in [64 KiB, 1 GiB] (bytes)", Doc: "the largest shared-memory ring",
				set: setInt(func(c *Config) *int { return &c.RingSize }, 1, 1<<30)},
			{Name: "NEXAR_RING_BUDGET", Field: "RingBudget", Scope: ScopeProcess, Default: "the profile's (64 MiB)",
				Forms: "a positive integer (bytes)", Doc: "bound on the shared-memory rings this process creates",
				set: setInt(func(c *Config) *int { return &c.RingBudget }, 1, 1<<62)},
			{Name: "NEXAR_SCRATCH_IDLE_BYTES", Field: "ScratchIdleBytes", Scope: ScopeProcess, Default: "the profile's (256 MiB)",
				Forms: "an integer (bytes; -1: keep none)", Doc: "bound on the idle scratch buffers a communicator keeps",
				set: setInt64(func(c *Config) *int64 { return &c.ScratchIdleBytes }, -1<<62)},
		}},
		{"Diagnostics", []Knob{
			{Name: "NEXAR_DEBUG", Field: "Debug", Scope: ScopeProcess, Default: "unset (Go's default logger)",
				Forms: "WARN, INFO, DEBUG or TRACE", Doc: "log to stderr at that level, like NCCL_DEBUG",
				set: setString(func(c *Config) *string { return &c.Debug }, func(v string) error { _, err := debugLevel(v); return err })},
			{Name: "NEXAR_DEBUG_SUBSYS", Field: "DebugSubsys", Scope: ScopeProcess, Default: "ALL",
				Forms: "a comma-separated list of INIT, COLL, P2P, NET, FLIGHT, or ALL; ^ first: all but those",
				Doc:   "the subsystems NEXAR_DEBUG logs",
				set:   setString(func(c *Config) *string { return &c.DebugSubsys }, func(v string) error { _, err := debugSubsys(v); return err })},
			{Name: "NEXAR_FLIGHT_RECORDER_SIZE", Field: "FlightRecorderSize", Scope: ScopeProcess, Default: "1024",
				Forms: "an integer (entries; -1: off)", Doc: "how many of its last operations each communicator records",
				set: setInt(func(c *Config) *int { return &c.FlightRecorderSize }, -1<<31, 1<<31-1)},
			{Name: "NEXAR_FLIGHT_RECORDER_DIR", Field: "FlightRecorderDir", Scope: ScopeProcess, Default: "none (dump on request only)",
				Forms: "a directory", Doc: "where flight records are dumped on a timeout (and on SIGUSR1)",
				set: setString(func(c *Config) *string { return &c.FlightRecorderDir }, nil)},
			{Name: "NEXAR_FLIGHT_RECORDER_DUMP_ON_SIGNAL", Field: "FlightDumpOnSignal", Scope: ScopeProcess, Default: "0",
				Forms: "a boolean (1, true, 0, false)", Doc: "dump the flight record into NEXAR_FLIGHT_RECORDER_DIR on SIGUSR1",
				set: setBool(func(c *Config) *bool { return &c.FlightDumpOnSignal })},
		}},
		{"Hardware, loaded at run time", []Knob{
			{Name: "NEXAR_CUDART", Field: "CUDARuntime", Scope: ScopeProcess, Default: "the runtime already loaded, else libcudart.so*",
				Forms: "a library path or soname", Doc: "the CUDA runtime for device memory (docs/device-memory.md)",
				set: setString(func(c *Config) *string { return &c.CUDARuntime }, nil)},
			{Name: "NEXAR_NCCL", Field: "NCCLLibrary", Scope: ScopeProcess, Default: "libnccl.so.2, libnccl.so",
				Forms: "a library path or soname", Doc: "the NCCL of the hierarchical device collectives",
				set: setString(func(c *Config) *string { return &c.NCCLLibrary }, nil)},
			{Name: "NEXAR_NCCL_HIER", Field: "NCCLHier", Scope: ScopeJob, Default: "auto",
				Forms: "auto, on or off", Doc: "whether device collectives use NCCL within a host",
				set: setString(func(c *Config) *string { return &c.NCCLHier }, checkHierMode)},
			{Name: "NEXAR_HIER_HOST_ID", Field: "HierHostID", Scope: ScopeProcess, Default: "this host's identity",
				Forms: "a string", Doc: "the host this rank is grouped with by the host-aware schedules and the NCCL hierarchy (tests simulate hosts with it)",
				set: setString(func(c *Config) *string { return &c.HierHostID }, nil)},
			{Name: "NEXAR_IBVERBS", Field: "RDMA.Library", Scope: ScopeProcess, Default: "libibverbs.so.1",
				Forms: "a library path or soname", Doc: "the libibverbs of the RDMA data path",
				set: setString(func(c *Config) *string { return &c.RDMA.Library }, nil)},
			{Name: "NEXAR_IB_HCA", Field: "RDMA.Device", Scope: ScopeProcess, Default: "the first active port",
				Forms: "device or device:port (port in [1, 255])", Doc: "the RDMA device and port",
				set: func(c *Config, v string) error {
					dev, port, ok := strings.Cut(v, ":")
					n := 0
					if ok {
						var err error
						if n, err = strconv.Atoi(port); err != nil || n < 1 || n > 255 {
							return fmt.Errorf("bad port")
						}
					}
					if c.RDMA.Device == "" {
						c.RDMA.Device, c.RDMA.Port = dev, n
					}
					return nil
				}},
			{Name: "NEXAR_IB_GID_INDEX", Field: "RDMA.GIDIndex", Scope: ScopeProcess, Default: "the first RoCE v2 GID of an IPv4 address",
				Forms: "an index in [0, 255]", Doc: "the RoCE source GID index",
				set: func(c *Config, v string) error {
					n, err := strconv.Atoi(v)
					if err != nil || n < 0 || n > 255 {
						return fmt.Errorf("bad index")
					}
					if !c.RDMA.SetGIDIndex {
						c.RDMA.GIDIndex, c.RDMA.SetGIDIndex = n, true
					}
					return nil
				}},
		}},
		{"Read by the Python package", []Knob{
			{Name: "NEXAR_ADVERTISE_HOST", Scope: ScopeBinding, Default: "unset", Python: true,
				Forms: "a host", Doc: "torch backend: the former name of the advertised host, read with a deprecation warning when NEXAR_ADVERTISE_ADDR is unset"},
			{Name: "NEXAR_TORCH_HUGEPAGE_MIN", Scope: ScopeBinding, Default: "4M", Python: true,
				Forms: "a byte count (suffixes K, M, G; 0: never)",
				Doc:   "torch backend: smallest tensor moved onto huge pages when it is reduced or broadcast again (docs/torch-compat.md)"},
		}},
	}
}

// lookupKnob reads k from lookup: its name, else its aliases; the value
// trimmed, and the name it was found under ("" when unset or blank). It is
// the one reader of a NEXAR_* variable in the Go code (knobs_test.go).
func lookupKnob(lookup func(string) (string, bool), k *Knob) (v, name string) {
	for _, n := range append([]string{k.Name}, k.Aliases...) {
		if v, ok := lookup(n); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v), n
		}
	}
	return "", ""
}

// LookupKnob reads the knob called name (or one of its aliases) through
// lookup (nil: the process environment): its value, trimmed, and whether it
// is set. It panics on a name the table does not declare, a programming
// error: every knob is declared and documented. For callers that need a
// launcher knob by itself (nexar seed's token).
func LookupKnob(lookup func(string) (string, bool), name string) (string, bool) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	for _, k := range Knobs() {
		if k.Name == name {
			v, n := lookupKnob(lookup, &k)
			return v, n != ""
		}
	}
	panic("core: LookupKnob: " + name + " is not in the knob table")
}

// WithEnv returns cfg with every process and job knob that cfg leaves
// unset taken from the environment: cfg.Env, or the process's (os.LookupEnv)
// when that is nil. The precedence, the same on every entry point: a field
// set explicitly beats the environment, the environment beats the memory
// profile, the profile beats the default (which New fills in afterwards).
// A value that does not parse is an error naming the variable and the
// accepted forms, and nothing is changed. Launcher knobs (rank, size,
// seed, token) are not read: only ConfigFromEnv takes them.
//
// A zero field counts as unset, so an explicit false, 0 or "full" cannot
// override a variable that sets the knob; unset the variable instead.
func (cfg Config) WithEnv() (Config, error) {
	lookup := cfg.Env
	if lookup == nil {
		lookup = os.LookupEnv
	}
	out := cfg
	for _, k := range Knobs() {
		if k.set == nil {
			continue
		}
		v, name := lookupKnob(lookup, &k)
		if name == "" {
			continue
		}
		if err := k.set(&out, v); err != nil {
			return cfg, k.errForms(name, v)
		}
	}
	return out, nil
}

// SetKnob sets the Config field of the knob called name from the text v,
// parsed as the environment's value would be, where the field is still
// unset: the bindings use it for their explicit settings (nexar_config_t's
// strings, Python's keyword arguments), so that every entry point accepts
// the same forms and reports a bad one the same way. It reports a name
// with no Config field and a value that does not parse.
func (cfg *Config) SetKnob(name, v string) error {
	for _, k := range Knobs() {
		if k.Name != name {
			continue
		}
		if k.set == nil {
			return fmt.Errorf("core: %s is not a knob of the Config (scope %s)", name, k.Scope)
		}
		v = strings.TrimSpace(v)
		if err := k.set(cfg, v); err != nil {
			return k.errForms(name, v)
		}
		return nil
	}
	return fmt.Errorf("core: %s is not in the knob table", name)
}

func setString(field func(*Config) *string, check func(string) error) func(*Config, string) error {
	return func(c *Config, v string) error {
		if check != nil {
			if err := check(v); err != nil {
				return err
			}
		}
		if p := field(c); *p == "" {
			*p = v
		}
		return nil
	}
}

func setDuration(field func(*Config) *time.Duration, positive bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || (positive && d <= 0) {
			return fmt.Errorf("bad duration")
		}
		if p := field(c); *p == 0 {
			*p = d
		}
		return nil
	}
}

func setInt(field func(*Config) *int, lo, hi int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return fmt.Errorf("out of range")
		}
		if p := field(c); *p == 0 {
			*p = n
		}
		return nil
	}
}

func setInt64(field func(*Config) *int64, lo int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < lo {
			return fmt.Errorf("out of range")
		}
		if p := field(c); *p == 0 {
			*p = n
		}
		return nil
	}
}

func setBool(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		if p := field(c); !*p {
			*p = b
		}
		return nil
	}
}

func checkHostPort(v string) error {
	_, _, err := net.SplitHostPort(v)
	return err
}

// checkHierMode accepts the modes of hier.ParseMode (hier imports core, so
// core cannot ask it).
func checkHierMode(v string) error {
	switch v {
	case "auto", "on", "off":
		return nil
	}
	return fmt.Errorf("not auto, on or off")
}
