package core

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/topology"
	"github.com/nexar-go/nexar/transport"
)

// Config describes one rank's place in a job. The zero value of every field
// except Rank, WorldSize, Seed and Token means "use the default" documented
// on the field. A Config is read once by New; it is not retained mutably.
type Config struct {
	// Rank is this process's rank in [0, WorldSize), or -1 to let the seed
	// assign ranks in join order (New only).
	Rank int
	// WorldSize is the number of ranks in the job (>= 1).
	WorldSize int
	// Seed is the rendezvous service's host:port. Rank 0 runs the seed
	// embedded when Seed names an address of its own host.
	Seed string
	// Token is the job's shared secret (NEXAR_TOKEN). Required when
	// WorldSize > 1; there is no default token. Never logged.
	Token []byte
	// BindAddr is the local UDP address of this rank's mesh node; its IP
	// is also the one the bulk TCP listener binds, if this rank needs one
	// (only when a peer is on another host). Default: one address of this
	// host with a free port, never every interface: the IP of
	// AdvertiseAddr when it is this host's, else the IP of the interface
	// that routes to the seed (127.0.0.1 for a seed on loopback). Set
	// "0.0.0.0:0" to listen on every interface.
	BindAddr string
	// AdvertiseAddr is the host:port peers dial to reach this rank. Default:
	// the IP of the interface that routes to the seed, with the bound port
	// (never a hard-wired 127.0.0.1).
	AdvertiseAddr string
	// Timeout bounds every operation that has no earlier deadline of its
	// own. Default 5 minutes.
	Timeout time.Duration
	// RPCHandlers bounds the RPC handlers running at once per
	// communicator; further requests wait (default DefaultRPCHandlers).
	RPCHandlers int
	// ConnectTimeout bounds rendezvous and mesh formation. Default 60 s.
	// A peer that leaves or is lost meanwhile ends formation at once.
	ConnectTimeout time.Duration
	// HeartbeatInterval is how often each rank tells every peer it is alive.
	// Default 500 ms.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long a silent peer is tolerated before the
	// communicator fails with CodePeerDown: the failure detector's floor
	// (docs/fault-tolerance.md, "Failure detection"). Default 3 s.
	HeartbeatTimeout time.Duration
	// HeartbeatCeiling is the longest silence of a remote peer the
	// adaptive detector tolerates, however irregular its heartbeats were
	// (NEXAR_HEARTBEAT_CEILING). Default 4 × HeartbeatTimeout; never below
	// HeartbeatTimeout.
	HeartbeatCeiling time.Duration
	// HeartbeatPhi is the suspicion (phi accrual) at which a remote peer
	// silent past HeartbeatTimeout is declared dead (NEXAR_HEARTBEAT_PHI):
	// 8 means a gap its heartbeats so far make about 1e-8 likely. Default 8.
	HeartbeatPhi float64
	// MaxBufferedBytes bounds the payload bytes of messages that arrived
	// before their receive was posted. Beyond it the transport handler
	// blocks, which back-pressures the sending peer. It is per process
	// (shared with split communicators). Default: the memory profile's
	// (256 MiB in the default profile; see MemoryProfile).
	MaxBufferedBytes int64
	// Logger receives diagnostics. Default: slog.Default() (discarding
	// nothing, logging no secrets).
	Logger *slog.Logger
	// Bulk selects the data path for LaneData (see docs/bulk-path.md):
	// "auto" (default: shared memory between ranks of one host, RDMA
	// between hosts that both have an active RDMA port, else TCP), "tcp",
	// "shm", "rdma" (RDMA to every peer, even on one host; New fails
	// without an RDMA device), or "off" (everything on QUIC).
	Bulk string
	// BulkConns is the number of parallel TCP connections per peer and
	// direction. Default 2.
	BulkConns int
	// BulkPlaintext declares the network trusted: TLS off on the bulk TCP
	// connections, and RDMA (which is never encrypted) chosen by Bulk
	// "auto" between hosts that both have a device. Default false: TLS 1.3
	// pinned like the QUIC mesh, and RDMA only with Bulk "rdma".
	BulkPlaintext bool
	// GPU is this process's GPU runtime (capi sets the CUDA runtime it
	// found, transport/rdma.CUDA): with it the RDMA data path registers
	// device memory with the NIC (GPUDirect RDMA), and SendDevice and
	// RecvDevice take device buffers (docs/device-memory.md). Nil: no
	// device memory.
	GPU transport.GPUMemory
	// BulkRemoteMin is the smallest message that a rank on this host
	// copies straight out of the sender's memory (cross-memory attach, one
	// copy instead of two through the shared-memory ring) when the kernel
	// allows it. Default 256 KiB; negative: never.
	BulkRemoteMin int
	// SpinWait is how long a goroutine waiting for data from a rank on this
	// host polls the shared-memory channel itself, once that rank is out of
	// any call (its presence in the ring says so; while it is in a call the
	// waiter spins on, up to ten SpinWaits and at least 5 ms), before it
	// sleeps until the sender wakes it. Longer spins cut latency and burn a
	// core while waiting; a sleep and wake-up costs tens of microseconds,
	// more for calls from C and Python (whose thread the Go runtime must
	// hand back). Default: 500 µs when this host has a core for every rank
	// it runs, else 200 µs yielding the core (sched_yield) between polls;
	// negative: never spin.
	SpinWait time.Duration
	// NormalSysmon leaves the Go runtime's monitor thread (sysmon) at the
	// normal scheduling policy (NEXAR_IDLE_SYSMON=0). By default a rank
	// that polls shared memory, on a host with a core for each of its
	// ranks, gives it the idle policy
	// (internal/sched.IdleSysmon), so that its wake-ups, every 20 µs to
	// 10 ms while a goroutine runs, never preempt a spinning rank: a
	// process-wide change to a thread of the Go runtime, which serves
	// only Go code (in a C, C++ or Python program, libnexar's), and it is
	// not undone by Close.
	NormalSysmon bool
	// OnFailure is what a member's failure does to a communicator made
	// from this config (NEXAR_ON_FAILURE=abort|manual|shrink; see
	// FailurePolicy and docs/fault-tolerance.md). Default PolicyAbort.
	OnFailure FailurePolicy
	// MinWorldSize and MaxWorldSize bound the job's size under elastic
	// membership (NEXAR_MIN_WORLD_SIZE, NEXAR_MAX_WORLD_SIZE): Shrink
	// refuses to leave fewer than MinWorldSize members (default 1), and
	// Grow admits joiners up to MaxWorldSize members (default: the
	// world's size, so a job can replace the ranks it lost).
	MinWorldSize, MaxWorldSize int
	// Join makes New join a running job instead of forming one
	// (NEXAR_JOIN=1): see Join. Seed is then a comma-separated list of
	// lobby addresses, and Rank and WorldSize are ignored.
	Join bool
	// JoinAddr is the UDP host:port of this rank's lobby, where processes
	// started later (Join) wait to be admitted by Grow (NEXAR_JOIN_ADDR);
	// every rank of a world of more than one runs one (it answers only
	// processes that prove the token). Default: rank 0 takes the
	// seed's address once the job has formed (so joiners reach the job
	// through the seed); the others a free port on their bind IP
	// (Comm.JoinAddrs lists every member's).
	JoinAddr string
	// Tuning chooses and shapes the collective schedules (chunk size,
	// algorithm thresholds, forced algorithms). It is per communicator
	// (split children inherit it) and must be equal on every rank: it is
	// part of the signature that ranks compare, so a difference fails the
	// call as mismatched. Zero fields take collective.DefaultTuning's.
	Tuning collective.Tuning
	// Topology is which ranks talk directly (NEXAR_TOPOLOGY: "full",
	// "kregular:K", "hypercube", "ondemand:M"; package topology and
	// docs/scale.md): under a sparse one a rank heartbeats its neighbours
	// only, failures spread by gossip, and messages to other ranks are
	// relayed (transport/relay). Every rank must use the same: the seed
	// refuses a join that differs. Zero value: the full mesh.
	Topology topology.Spec
	// Schedules is the graph the collective schedules fit
	// (NEXAR_SCHEDULES; collective.Layout, docs/scale.md): "fit" (or "",
	// the default) fits them to Topology when it is sparse, so that a
	// ring goes round ranks that talk directly and trees follow the
	// neighbour graph; "rank" keeps rank order (bit for bit the full
	// mesh's results, more relaying); a topology ("hypercube",
	// "kregular:8") fits that graph whatever Topology is, so that a full
	// mesh reproduces a sparse job's bits. Part of the signature ranks
	// compare.
	Schedules string

	// Diagnostics (docs/diagnostics.md). Zero fields take the environment's
	// NEXAR_FLIGHT_RECORDER_* values, also for a Config not read by
	// ConfigFromEnv, and with no Logger, NEXAR_DEBUG builds one.
	//
	// FlightRecorderSize is how many of its last operations each
	// communicator keeps in its flight recorder. Default 1024; negative:
	// no recorder.
	FlightRecorderSize int
	// FlightRecorderDir is the directory communicators dump their flight
	// records to: on an operation's timeout, and on SIGUSR1 when
	// FlightDumpOnSignal is set. Default: none (dump on request only:
	// Comm.DumpFlightRecord).
	FlightRecorderDir string
	// FlightDumpOnSignal makes each communicator dump its flight record
	// into FlightRecorderDir on SIGUSR1, which the process then no longer
	// gets with its default action (termination) while a communicator
	// lives. Default false: nexar takes no signal.
	FlightDumpOnSignal bool

	// Memory (docs/memory.md). MemoryProfile sets the four budgets below
	// together (NEXAR_MEMORY_PROFILE): "default" (or ""), "training"
	// (large rings, scratch kept warm: throughput) or "inference" (small
	// rings and budget, large scratch released when idle: footprint; the
	// few MiB kept spare small calls an allocation each). A field
	// set explicitly (> 0, or ScratchIdleBytes < 0) overrides the
	// profile's value. Zero fields take the environment's values (these
	// variables, and NEXAR_MAX_BUFFERED_BYTES through ConfigFromEnv), also
	// for a Config not read by ConfigFromEnv.
	//
	//	profile    MaxBufferedBytes  RingSize  RingBudget  ScratchIdleBytes
	//	default    256 MiB           8 MiB     64 MiB      256 MiB
	//	training   1 GiB             32 MiB    512 MiB     2 GiB
	//	inference  32 MiB            1 MiB     8 MiB       4 MiB
	MemoryProfile string
	// RingSize is the largest capacity of one shared-memory ring, a power
	// of two in [64 KiB, 1 GiB] (NEXAR_RING_SIZE). Default: the profile's.
	RingSize int
	// RingBudget bounds the capacity of the shared-memory rings this
	// process creates, one per local peer that sends to it; rings shrink
	// to fit it (NEXAR_RING_BUDGET). Default: the profile's.
	RingBudget int
	// ScratchIdleBytes bounds the idle scratch buffers (the collectives'
	// temporaries) each communicator keeps for its next calls; beyond it,
	// buffers are released when a call ends (NEXAR_SCRATCH_IDLE_BYTES).
	// Default: the profile's; negative: keep none.
	ScratchIdleBytes int64

	// Debug and DebugSubsys (NEXAR_DEBUG, NEXAR_DEBUG_SUBSYS) make New
	// build a logger to stderr at that level for those subsystems when
	// Logger is nil (docs/diagnostics.md). Default: no such logger.
	Debug, DebugSubsys string

	// Hardware loaded at run time. CUDARuntime (NEXAR_CUDART) and
	// NCCLLibrary (NEXAR_NCCL) name the CUDA runtime and NCCL that the C
	// ABI's device paths load (the first communicator's choice holds for
	// the process: a library is loaded once); NCCLHier (NEXAR_NCCL_HIER:
	// auto, on, off) and HierHostID (NEXAR_HIER_HOST_ID) steer its NCCL
	// hierarchy (docs/device-memory.md); HierHostID also names this rank's
	// host to the host-aware schedules (core/topo.go hostKey). RDMA selects the RDMA data path's
	// library, device, port and GID index (NEXAR_IBVERBS, NEXAR_IB_HCA,
	// NEXAR_IB_GID_INDEX; its Logger and GPU are set by New).
	CUDARuntime, NCCLLibrary string
	NCCLHier, HierHostID     string
	RDMA                     transport.RDMAOptions

	// Env is where WithEnv, which New calls, reads the knobs of the table
	// (Knobs) that this Config leaves unset. Nil: the process environment
	// (os.LookupEnv); the C ABI passes the C environment as it is at the
	// call. A function returning ("", false) reads nothing.
	Env func(name string) (string, bool)

	// Mesh assembles the transports of every communicator made with this
	// Config (New, Join, NewLocal, NewLocalQUIC): set it to
	// mesh.Builder{} (package transport/mesh). core names no concrete
	// transport, so it has no default to fall back on (the package doc of
	// transport/mesh says why); New fails naming this field when it is
	// nil.
	Mesh transport.Builder
}

// MemoryProfile is one row of the memory profiles' table (Config.MemoryProfile).
type MemoryProfile struct {
	MaxBufferedBytes int64
	RingSize         int
	RingBudget       int
	ScratchIdleBytes int64
}

// MemoryProfileOf returns the values of the named profile ("" is
// "default"), or an error naming the profiles.
func MemoryProfileOf(name string) (MemoryProfile, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "default":
		return MemoryProfile{defaultMaxBufferedBytes, defaultRingSize, defaultRingBudget, 256 << 20}, nil
	case "training":
		return MemoryProfile{1 << 30, 32 << 20, 512 << 20, 2 << 30}, nil
	case "inference":
		return MemoryProfile{32 << 20, 1 << 20, 8 << 20, 4 << 20}, nil
	}
	return MemoryProfile{}, fmt.Errorf("core: memory profile %q: want default, training or inference", name)
}

// validateMemory reports an unknown memory profile or a bad ring size.
func (cfg Config) validateMemory() error {
	if _, err := MemoryProfileOf(cfg.MemoryProfile); err != nil {
		return invalidArg("new", "Config.MemoryProfile: %v", err)
	}
	if r := cfg.RingSize; r != 0 && (r&(r-1) != 0 || r < 64<<10 || r > 1<<30) {
		return invalidArg("new", "Config.RingSize %d is not a power of two in [64 KiB, 1 GiB]", r)
	}
	return nil
}

// withMemoryProfile fills the memory fields that are not set from cfg's
// profile (a negative ScratchIdleBytes stays: keep none; so a second call
// changes nothing).
func (cfg Config) withMemoryProfile() (Config, error) {
	p, err := MemoryProfileOf(cfg.MemoryProfile)
	if err != nil {
		return cfg, err
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = p.MaxBufferedBytes
	}
	if cfg.RingSize <= 0 {
		cfg.RingSize = p.RingSize
	}
	if cfg.RingBudget <= 0 {
		cfg.RingBudget = p.RingBudget
	}
	if cfg.ScratchIdleBytes == 0 {
		cfg.ScratchIdleBytes = p.ScratchIdleBytes
	}
	return cfg, nil
}

// tolerated is d, or HeartbeatTimeout where that is longer: a deadline on
// a peer's part (a connection's or the rendezvous link's idle timeout, a
// ring's set-up, a dial) never undercuts the silence the configuration
// tolerates of a peer. A long HeartbeatTimeout, as in a world of many
// ranks on few cores, keeps ranks that wait long to be scheduled.
func (cfg Config) tolerated(d time.Duration) time.Duration { return max(d, cfg.HeartbeatTimeout) }

const (
	defaultTimeout           = 5 * time.Minute
	defaultConnectTimeout    = 60 * time.Second
	defaultHeartbeatInterval = 500 * time.Millisecond
	defaultHeartbeatTimeout  = 3 * time.Second
	defaultMaxBufferedBytes  = 256 << 20
	// The default profile's rings are the bulk path's defaults
	// (transport/bulk.DefaultRingSize and DefaultRingBudget;
	// TestMemoryProfileResolution keeps them in step).
	defaultRingSize   = 8 << 20
	defaultRingBudget = 64 << 20
	spinWaitDedicated = 500 * time.Microsecond // a core per local rank
	spinWaitShared    = 200 * time.Microsecond // more local ranks than cores (yielding)
)

// withDefaults returns cfg with zero fields filled in. It reads no
// environment (WithEnv does, before it: resolve).
func (cfg Config) withDefaults() Config {
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = defaultConnectTimeout
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = defaultHeartbeatInterval
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = defaultHeartbeatTimeout
	}
	if cfg.HeartbeatTimeout < 2*cfg.HeartbeatInterval {
		cfg.HeartbeatTimeout = 2 * cfg.HeartbeatInterval
	}
	if cfg.HeartbeatCeiling <= 0 {
		cfg.HeartbeatCeiling = ceilingTimeouts * cfg.HeartbeatTimeout
	}
	cfg.HeartbeatCeiling = max(cfg.HeartbeatCeiling, cfg.HeartbeatTimeout)
	if cfg.HeartbeatPhi <= 0 {
		cfg.HeartbeatPhi = phiThreshold
	}
	if cfg.Logger == nil && cfg.Debug != "" {
		// Debug and DebugSubsys were checked by WithEnv or validate; a
		// bad one set in code leaves the default logger.
		if l, err := newDebugLogger(os.Stderr, cfg.Debug, cfg.DebugSubsys); err == nil {
			cfg.Logger = l
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FlightRecorderSize == 0 {
		cfg.FlightRecorderSize = defaultFlightRecorderSize
	}
	if m, err := cfg.withMemoryProfile(); err == nil {
		cfg = m // an unknown profile is reported by validateMemory, which New calls
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = defaultMaxBufferedBytes
	}
	cfg.Tuning = cfg.Tuning.WithDefaults()
	return cfg
}

// resolve is what every constructor does first: the environment over cfg
// (WithEnv), then the defaults, then the checks that need both.
func (cfg Config) resolve() (Config, error) {
	cfg, err := cfg.WithEnv()
	if err != nil {
		return cfg, invalidArg("new", "%v", err)
	}
	if cfg.Debug != "" {
		if _, err := newDebugLogger(io.Discard, cfg.Debug, cfg.DebugSubsys); err != nil {
			return cfg, invalidArg("new", "Config.Debug: %v", err)
		}
	}
	cfg = cfg.withDefaults()
	if cfg.FlightDumpOnSignal && cfg.FlightRecorderDir == "" {
		return cfg, invalidArg("new", "NEXAR_FLIGHT_RECORDER_DUMP_ON_SIGNAL (Config.FlightDumpOnSignal) needs NEXAR_FLIGHT_RECORDER_DIR (where to dump)")
	}
	return cfg, nil
}

// ConfigFromEnv reads a Config from the environment of the launcher that
// started this process: the job it belongs to from the launcher knobs,
// in this order of precedence,
//
//   - nexar: NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_SEED (host:port),
//     NEXAR_TOKEN or NEXAR_TOKEN_FILE, NEXAR_JOIN (1: join a running job,
//     Config.Join; NEXAR_SEED may then list several addresses);
//   - torchrun: RANK, WORLD_SIZE, MASTER_ADDR + MASTER_PORT;
//   - Slurm: SLURM_PROCID, SLURM_NTASKS (the seed must come from NEXAR_SEED
//     or MASTER_ADDR/MASTER_PORT);
//   - Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//
// and every other knob of the table (Knobs, docs/reference/env.md)
// through WithEnv. The token is always NEXAR_TOKEN or NEXAR_TOKEN_FILE; it
// is required when the world has more than one rank. Errors name the
// missing or malformed variable.
func ConfigFromEnv() (Config, error) {
	return configFromLookup(os.LookupEnv, os.ReadFile)
}

// ConfigFromLookup is ConfigFromEnv reading the variables through lookup
// (with os.LookupEnv's contract), which the returned Config keeps as its
// Env. It is for callers whose environment is not Go's copy: in a
// c-shared library that copy is taken when the Go runtime starts, so
// variables the host program sets later are not in it. It is safe for
// concurrent use if lookup is.
func ConfigFromLookup(lookup func(string) (string, bool)) (Config, error) {
	return configFromLookup(lookup, os.ReadFile)
}

// knobOr reads the knob name, else the first of the launcher variables
// others that is set: the value and the variable it came from.
func knobOr(lookup func(string) (string, bool), name string, others ...string) (string, string) {
	if name != "" {
		if v, ok := LookupKnob(lookup, name); ok {
			return v, name
		}
	}
	for _, n := range others {
		if v, ok := lookup(n); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v), n
		}
	}
	return "", ""
}

func configFromLookup(lookup func(string) (string, bool), readFile func(string) ([]byte, error)) (Config, error) {
	var cfg Config
	atoi := func(name string, others ...string) (int, string, error) {
		v, from := knobOr(lookup, name, others...)
		if from == "" {
			return 0, "", nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, from, fmt.Errorf("core: %s=%q is not an integer", from, v)
		}
		return n, from, nil
	}
	rank, rankVar, err := atoi("NEXAR_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
	if err != nil {
		return cfg, err
	}
	size, sizeVar, err := atoi("NEXAR_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
	if err != nil {
		return cfg, err
	}
	if v, ok := LookupKnob(lookup, "NEXAR_JOIN"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return cfg, fmt.Errorf("core: NEXAR_JOIN=%q: want a boolean (1, true, 0, false)", v)
		}
		cfg.Join = b
	}
	if cfg.Join {
		// A joiner's rank and world size come from the members (Join);
		// these stand in for them so that seed and token are required.
		rank, size, rankVar, sizeVar = -1, 2, "NEXAR_JOIN", "NEXAR_JOIN"
	}
	if sizeVar == "" {
		return cfg, fmt.Errorf("core: world size not set: set NEXAR_WORLD_SIZE (or WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE)")
	}
	if size < 1 {
		return cfg, fmt.Errorf("core: %s=%d: world size must be >= 1", sizeVar, size)
	}
	if rankVar == "" {
		if size > 1 {
			return cfg, fmt.Errorf("core: rank not set: set NEXAR_RANK (or RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK)")
		}
		rank = 0
	}
	if rank < -1 || rank >= size {
		return cfg, fmt.Errorf("core: %s=%d is out of range for world size %d", rankVar, rank, size)
	}
	cfg.Rank, cfg.WorldSize = rank, size

	if v, ok := LookupKnob(lookup, "NEXAR_SEED"); ok {
		cfg.Seed = v
	} else if host, _ := knobOr(lookup, "", "MASTER_ADDR"); host != "" {
		port, _ := knobOr(lookup, "", "MASTER_PORT")
		if port == "" {
			return cfg, fmt.Errorf("core: MASTER_ADDR is set but MASTER_PORT is not")
		}
		cfg.Seed = net.JoinHostPort(host, port)
	}
	if cfg.Seed == "" && size > 1 {
		return cfg, fmt.Errorf("core: seed address not set: set NEXAR_SEED=host:port (or MASTER_ADDR and MASTER_PORT)")
	}
	if cfg.Seed != "" {
		addrs := []string{cfg.Seed}
		if cfg.Join {
			addrs = strings.Split(cfg.Seed, ",") // a joiner may list several lobbies
		}
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
				return cfg, fmt.Errorf("core: seed address %q is not host:port: %v", a, err)
			}
		}
	}
	if cfg.Token, err = tokenFromLookup(lookup, readFile); err != nil {
		return cfg, err
	}
	if len(cfg.Token) == 0 && size > 1 {
		return cfg, fmt.Errorf("core: no token: set NEXAR_TOKEN or NEXAR_TOKEN_FILE to the job's shared secret (every rank the same)")
	}
	cfg.Env = lookup
	return cfg.WithEnv()
}

// TokenFromEnv reads the job's secret from NEXAR_TOKEN, else from the file
// NEXAR_TOKEN_FILE names (trimmed); nil when neither is set. For programs
// that need the token alone (nexar seed).
func TokenFromEnv() ([]byte, error) { return tokenFromLookup(os.LookupEnv, os.ReadFile) }

func tokenFromLookup(lookup func(string) (string, bool), readFile func(string) ([]byte, error)) ([]byte, error) {
	if v, ok := LookupKnob(lookup, "NEXAR_TOKEN"); ok {
		return []byte(v), nil
	}
	path, ok := LookupKnob(lookup, "NEXAR_TOKEN_FILE")
	if !ok {
		return nil, nil
	}
	tok, err := readTokenFile(readFile, path)
	if err != nil {
		return nil, fmt.Errorf("core: NEXAR_TOKEN_FILE: %w", err)
	}
	return tok, nil
}

// ReadTokenFile reads a job's secret from the file at path: its contents
// without surrounding white space, as NEXAR_TOKEN_FILE is read; an empty
// one is an error.
func ReadTokenFile(path string) ([]byte, error) { return readTokenFile(os.ReadFile, path) }

func readTokenFile(readFile func(string) ([]byte, error), path string) ([]byte, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	tok := []byte(strings.TrimSpace(string(b)))
	if len(tok) == 0 {
		return nil, fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// defaultFlightRecorderSize is Config.FlightRecorderSize's default.
const defaultFlightRecorderSize = 1024
