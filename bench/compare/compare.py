#!/usr/bin/env python3
"""Compare nexar with Gloo (torch.distributed) and Open MPI (mpi4py) on the
same machine in one run (issue 5 point 5, DESIGN.md section 7).

Each system is an adapter that prints JSON lines
  {"system", "op", "bytes", "ranks", "time_us", "algbw_gbs", "busbw_gbs", ...}
from rank 0; this runner starts the adapters, collects the lines, and writes
a markdown table (times, busbw, and nexar's speedup over each other system)
plus a PNG plot of busbw against size, one line per system.

Systems:
  gloo     adapter_gloo.py under the project venv, one process per rank
  nexar-torch  the same adapter through the "nexar" torch backend: the path
           torch users take
  mpi      adapter_mpi.py under mpirun, Open MPI's default transports
           (shared memory on one host)
  mpi-tcp  the same with --mca btl tcp,self
  nexar    `build/nexar bench --json ...`: Go, one process per rank
  nexar-inplace  the same with --inplace: allreduce with the result over
           its input, as torch.distributed's all_reduce does (the other
           collectives as "nexar")
  nexar-py adapter_nexar.py (the nexar Python package, numpy buffers) under
           `build/nexar run -n N`: the like-for-like of mpi4py and torch
  nexar-rs the Rust nexar from crates.io (bench/compare/nexar-rs, built with
           `cargo build --release` on first use), one process per rank
           joined through its seed; an op it fails is a row with "—" and a
           footnote, never a number
A system that is not installed is skipped with a message (nexar-rs instead
gets "—" rows saying why it could not be built).

--netns runs two "hosts", network namespaces joined by a veth pair (no
shared memory between them; needs root), with --per-host ranks on each
(default 1,2: 2 hosts x 1 and 2 hosts x 2 ranks), for gloo, mpi-tcp,
nexar, nexar-py and nexar-torch with their default paths between and
inside the hosts ("nexar", "nexar-py" and "nexar-torch" with TLS, the
default, and "nexar-plain", "nexar-torch-plain" with
NEXAR_BULK_PLAINTEXT=1). Each system then runs a
volume run (allreduce of 16 MiB, the iterations the adapters use) whose
bytes on the veth pair (both ends' tx counters) are divided by the
minimum an allreduce must move between 2 hosts (2 S per call: half of S
each way for the reduce-scatter, half for the allgather); rank 0's CPU
time per timed call (user + system, every thread: each adapter's
getrusage, cpu_us in its JSON) times the ranks, divided by those bytes,
is "CPU s per link GB". It also measures one plain TCP stream across
the pair ("tcp-stream", bandwidth only) as the ceiling of that link, and two
streams run at once, one each way, as the ceiling for collectives that send
and receive at the same time (taken before and after the systems, their mean
reported; the table gives each nexar flavour's busbw as a share of it). Those
streams send one 1 MiB buffer over and over, in cache (the sender's, never
written, is the kernel's zero page); the same two streams cycling through 256
MiB at each end ("out of cache", "2-way cold") are what a large collective's
buffers allow. Two Go TLS 1.3 streams likewise (bench/compare/tlsstream,
AES-128-GCM, out of cache, "2-way tls") are the ceiling of an encrypted
path, which nexar's default (TLS) flavours are measured against.

Run from the repository root:
  .venv/bin/python bench/compare/compare.py                 # quick sweep, 2 and 4 ranks
  .venv/bin/python bench/compare/compare.py --sweep full    # 8 B .. 256 MiB
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import common  # noqa: E402

VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
SYS_PY = "/usr/bin/python3"
NEXAR = os.path.join(ROOT, "build", "nexar")
SYSTEMS = ("gloo", "mpi", "mpi-tcp", "nexar", "nexar-inplace", "nexar-py", "nexar-torch", "nexar-plain",
           "nexar-torch-plain", "nexar-rs")
NEXAR_RS_DIR = os.path.join(HERE, "nexar-rs")
NEXAR_RS = os.path.join(NEXAR_RS_DIR, "target", "release", "nexar-rs-bench")

SWEEPS = {
    "quick": [8, 4096, 65536, 1 << 20, 16 << 20],
    "full": [8 << (2 * i) for i in range(13)] + [256 << 20],  # 8 B, 32 B, ... 128 MiB, 256 MiB
}

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def log(msg):
    print(f"compare: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_adapter(procs, timeout, system):
    """Start procs (list of (argv, env)), stream rank 0's JSON lines, and
    stop everything at the deadline. Returns the parsed results."""
    ps = []
    out = tempfile.TemporaryFile(mode="w+")
    errs = [tempfile.TemporaryFile(mode="w+") for _ in procs]
    try:
        for i, (argv, env) in enumerate(procs):
            # A process group per rank (killed whole at the deadline), not a
            # session: a session is an autogroup of the scheduler (Linux
            # with sched_autogroup_enabled, processes in the root cpu
            # cgroup), where one rank's sched_yield no longer lets another
            # rank run. mpirun's ranks share its session; every system's
            # must, or the comparison measures the launch (nexar, 2 hosts
            # x 2 ranks, 8 B: 70-85 µs with a session per rank, 30-45 in
            # one; docs/performance.md).
            ps.append(subprocess.Popen(argv, env=env, stdout=out if i == 0 else subprocess.DEVNULL,
                                       stderr=errs[i], preexec_fn=os.setpgrp))
        deadline = time.monotonic() + timeout
        for p in ps:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{system}: timed out after {timeout:.0f} s; keeping the sizes that finished")
                break
    finally:
        for p in ps:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()
    res = []
    out.seek(0)
    for line in out:
        line = line.strip()
        if line.startswith("[0] "):  # nexar run's rank prefix
            line = line[4:]
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            r["system"] = system
            res.append(r)
    bad = [p.returncode for p in ps if p.returncode not in (0, None, -9)]
    if bad or not res:
        tail = ""
        for e in errs:  # the first rank that said something
            e.seek(0)
            tail = e.read()[-600:].strip()
            if tail:
                break
        log(f"{system}: exit status {[p.returncode for p in ps]}; stderr tail:\n{tail}")
    return res


def have_mpi():
    if shutil.which("mpirun") is None:
        return "mpirun not found (apt-get install openmpi-bin)"
    r = subprocess.run([SYS_PY, "-c", "import mpi4py"], capture_output=True)
    if r.returncode != 0:
        return f"{SYS_PY} cannot import mpi4py (apt-get install python3-mpi4py)"
    return None


def have_gloo():
    r = subprocess.run([VENV_PY, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                       capture_output=True)
    return None if r.returncode == 0 else f"{VENV_PY}: torch with Gloo not importable"


def have_nexar_torch():
    r = subprocess.run([VENV_PY, "-c", "import nexar.torch"], capture_output=True, text=True)
    return None if r.returncode == 0 else "the nexar Python package is not installed in the venv (make python): " + \
        r.stderr.strip()[-200:]


def adapter_args(ops, sizes):
    return ["--ops", ",".join(ops), "--sizes", ",".join(map(str, sizes))]


# Every Python rank runs its numerical libraries on one thread, as torchrun
# sets for several ranks per host: OpenBLAS's idle workers (numpy) spin
# after each call and took about 9 % of the CPU from 4 ranks on 2 cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def gloo_procs(n, ops, sizes, wrap=None, addrs=None, ifname=None, backend="gloo", name=None, per_host=None,
               extra_env=None):
    """torch.distributed ranks (adapter_gloo.py); wrap(r) prefixes rank r's
    command (a namespace), per_host sets torchrun's LOCAL_* variables."""
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), MASTER_PORT=str(port),
                   MASTER_ADDR=addrs[0] if addrs else "127.0.0.1", **ONE_THREAD)
        if per_host:
            env.update(LOCAL_RANK=str(r % per_host), LOCAL_WORLD_SIZE=str(per_host))
        env.update(extra_env or {})
        if ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
        argv = [VENV_PY, os.path.join(HERE, "adapter_gloo.py")]
        if backend != "gloo":
            argv += ["--backend", backend, "--name", name or f"{backend}-torch"]
        argv += adapter_args(ops, sizes)
        procs.append(((wrap(r) if wrap else []) + argv, env))
    return procs


def mpi_procs(n, ops, sizes, name, extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **ONE_THREAD)
    argv = MPIRUN + ["-np", str(n)] + extra + [SYS_PY, os.path.join(HERE, "adapter_mpi.py"),
                                                 "--name", name] + adapter_args(ops, sizes)
    return [(argv, env)]


def nexar_procs(n, ops, sizes, timeout, inplace=False):
    """`nexar bench --json`, one process per rank; None and a reason when it
    cannot run."""
    if not os.access(NEXAR, os.X_OK):
        return None, f"{NEXAR} not built (make build)"
    argv = [NEXAR, "bench", "-n", str(n)] + nexar_bench_args(ops, sizes) + (["--inplace"] if inplace else [])
    return [(argv, dict(os.environ, **ONE_THREAD))], None


def nexar_bench_args(ops, sizes):
    # Same warm-up and iteration counts as the Python adapters.
    return ["--json", "--warmup", "2", "--ops", ",".join(ops), "--sizes", ",".join(map(str, sizes))]


def have_nexar_py():
    """None, or why the nexar Python package cannot run."""
    r = subprocess.run([VENV_PY, "-c", "import nexar, numpy"], capture_output=True, text=True)
    if r.returncode != 0:
        return "the nexar Python package is not installed in the venv (make python): " + r.stderr.strip()[-200:]
    return None


def nexar_py_procs(n, ops, sizes):
    """adapter_nexar.py under `nexar run`."""
    if not os.access(NEXAR, os.X_OK):
        return None, f"{NEXAR} not built (make build)"
    why = have_nexar_py()
    if why:
        return None, why
    argv = [NEXAR, "run", "-n", str(n), "--", VENV_PY, os.path.join(HERE, "adapter_nexar.py")] + adapter_args(ops, sizes)
    return [(argv, dict(os.environ))], None


def build_nexar_rs():
    """Build the Rust adapter (a no-op when it is up to date). Returns None,
    or why it cannot run: the reason goes into the table, not a silent skip."""
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    if not os.access(cargo, os.X_OK):
        return "cargo not found: install Rust (https://rustup.rs) to build bench/compare/nexar-rs"
    log(f"nexar-rs: cargo build --release in {NEXAR_RS_DIR} (the first build takes minutes)")
    r = subprocess.run([cargo, "build", "--release", "--locked"], cwd=NEXAR_RS_DIR,
                       capture_output=True, text=True)
    if r.returncode != 0:
        return "cargo build --release failed: " + r.stderr.strip()[-400:]
    return None


def nexar_rs_procs(n, ops, sizes):
    """One nexar-rs-bench process per rank; rank 0 binds the seed."""
    seed = f"127.0.0.1:{free_port()}"
    return [([NEXAR_RS] + adapter_args(ops, sizes),
             dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), NEXAR_RS_SEED=seed))
            for r in range(n)]


def error_rows(system, n, ops, sizes, why):
    """Rows that say a system could not run at all, one per (op, size)."""
    return [{"system": system, "op": op, "bytes": common.layout(op, b, n)[0], "ranks": n, "error": why}
            for op in ops for b in sizes]


def result_text(r):
    if "error" in r:
        return f"error: {r['error']}"
    return f"{r['time_us']} µs, busbw {r['busbw_gbs']} GB/s"


# --- two "hosts" in network namespaces -------------------------------------

class NetNS:
    """Two namespaces joined by a veth pair, 10.231.<k>.1 and .2; removed on exit."""

    IFNAME = "nxbench0"

    def __init__(self):
        k = os.getpid() % 200 + 20
        self.ns = [f"nxb{os.getpid()}a", f"nxb{os.getpid()}b"]
        self.ifs = [f"nxb{os.getpid()}a0", f"nxb{os.getpid()}b0"][:2]
        self.addrs = [f"10.231.{k}.1", f"10.231.{k}.2"]

    def sh(self, *a):
        subprocess.run(["ip"] + list(a), check=True, capture_output=True)

    def __enter__(self):
        for ns in self.ns:
            self.sh("netns", "add", ns)
        try:
            # interface names are limited to 15 characters
            tmp = [f"nxv{os.getpid() % 100000}a", f"nxv{os.getpid() % 100000}b"]
            self.sh("link", "add", tmp[0], "netns", self.ns[0], "type", "veth",
                    "peer", "name", tmp[1], "netns", self.ns[1])
            # The same name on both ends, so that GLOO_SOCKET_IFNAME and
            # btl_tcp_if_include can name it once for every rank.
            self.ifs = [self.IFNAME, self.IFNAME]
            for ns, t in zip(self.ns, tmp):
                self.sh("-n", ns, "link", "set", t, "name", self.IFNAME)
            for ns, ifn, a in zip(self.ns, self.ifs, self.addrs):
                self.sh("-n", ns, "addr", "add", a + "/24", "dev", ifn)
                self.sh("-n", ns, "link", "set", ifn, "up")
                self.sh("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for ns in self.ns:  # deleting a namespace deletes its veth end too
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        try:
            os.unlink(rsh_agent_path())
        except FileNotFoundError:
            pass

    def wrap(self, r):
        # Each "host" has its own host name too (a UTS namespace): Open
        # MPI tells nodes apart by name, and would take two namespaces
        # named alike for one node (shared memory between them).
        return ["ip", "netns", "exec", self.ns[r], "unshare", "--uts", "sh", "-c",
                f'hostname {self.ns[r]} && exec "$@"', "sh"]


VOLUME_SIZE = 16 << 20  # the volume run's allreduce


def rsh_agent_path():
    return os.path.join(tempfile.gettempdir(), f"nexar-compare-rsh-{os.getpid()}.sh")


def link_bytes(net):
    """Bytes sent so far by both ends of the veth pair (tx counters)."""
    total = 0
    for ns in net.ns:
        out = subprocess.run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", net.IFNAME],
                             check=True, capture_output=True, text=True).stdout
        total += json.loads(out)[0]["stats64"]["tx"]["bytes"]
    return total


def run_measured(procs, timeout, system, net):
    """run_adapter, and the bytes that crossed the veth pair meanwhile."""
    wire = link_bytes(net)
    res = run_adapter(procs, timeout, system)
    return res, link_bytes(net) - wire


def netns_procs(net, system, per, ops, sizes):
    """The processes of one system across the two namespaces, per ranks on
    each (ranks 0..per-1 on the first), or None and why not."""
    n = 2 * per
    wrap = (lambda r: net.wrap(r // per))
    if system in ("gloo", "nexar-torch", "nexar-torch-plain"):
        why = have_gloo() or (have_nexar_torch() if system != "gloo" else None)
        if why:
            return None, why
        if system == "gloo":
            return gloo_procs(n, ops, sizes, wrap, net.addrs, net.IFNAME, per_host=per), None
        plain = "1" if system.endswith("-plain") else "0"
        return gloo_procs(n, ops, sizes, wrap, net.addrs, None, backend="nexar", name=system, per_host=per,
                          extra_env={"NEXAR_BULK_PLAINTEXT": plain}), None
    if system == "mpi-tcp":
        why = have_mpi()
        if why:
            return None, why
        agent = rsh_agent_path()
        with open(agent, "w") as f:
            # mpirun starts the remote daemon through this "rsh": by
            # entering the namespace that owns the host's address.
            f.write("#!/bin/sh\nh=$1; shift\n" + "".join(
                f'[ "$h" = "{a}" ] && exec ip netns exec {ns} unshare --uts sh -c "hostname {ns} && $*"\n'
                for a, ns in zip(net.addrs, net.ns)) + "exit 1\n")
        os.chmod(agent, 0o755)
        # TCP between the hosts; shared memory (vader) between ranks of one.
        btl = "tcp,self" if per == 1 else "tcp,vader,self"
        extra = ["-H", f"{net.addrs[0]}:{per},{net.addrs[1]}:{per}", "--mca", "plm_rsh_agent", agent,
                 "--mca", "btl", btl, "--mca", "btl_tcp_if_include", net.IFNAME,
                 "--mca", "oob_tcp_if_include", net.IFNAME, "--mca", "mpi_yield_when_idle", "1"]
        procs = mpi_procs(n, ops, sizes, "mpi-tcp", extra)
        return [(net.wrap(0) + procs[0][0], procs[0][1])], None
    if system in ("nexar", "nexar-plain", "nexar-py"):
        if not os.access(NEXAR, os.X_OK):
            return None, f"{NEXAR} not built (make build)"
        if system == "nexar-py":
            why = have_nexar_py()
            if why:
                return None, why
            argv = [VENV_PY, os.path.join(HERE, "adapter_nexar.py")] + adapter_args(ops, sizes)
        else:
            argv = [NEXAR, "bench"] + nexar_bench_args(ops, sizes)
        # The launcher's job by hand, as on two real hosts: rank 0 embeds
        # the seed on its own address; the default data paths (shared
        # memory inside a host, TCP between them).
        token, port = os.urandom(16).hex(), free_port()
        procs = []
        for r in range(n):
            env = dict(os.environ, NEXAR_RANK=str(r), NEXAR_WORLD_SIZE=str(n),
                       NEXAR_SEED=f"{net.addrs[0]}:{port}", NEXAR_TOKEN=token,
                       NEXAR_BIND_ADDR=f"{net.addrs[r // per]}:0",
                       NEXAR_BULK_PLAINTEXT="1" if system == "nexar-plain" else "0", **ONE_THREAD)
            procs.append((wrap(r) + argv, env))
        return procs, None
    return None, "not run across namespaces"


NETNS_SYSTEMS = ("gloo", "mpi-tcp", "nexar", "nexar-plain", "nexar-py", "nexar-torch", "nexar-torch-plain")


def netns_runs(args, ops, sizes, results):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        log("netns: skipped (needs root and iproute2)")
        return
    try:
        with NetNS() as net:
            log(f"netns: {net.ns[0]} {net.addrs[0]} <-> {net.ns[1]} {net.addrs[1]}")
            # The two-way ceiling is taken before and after the systems
            # (the host's load drifts on a shared machine): both are kept,
            # their mean is the ceiling the table compares with.
            both_before, cold_before = tcp_stream_both(net), tcp_stream_both(net, COLD_SPAN)
            tls_why = build_tls_stream()
            if tls_why:
                log(f"  netns TLS ceiling: not measured: {tls_why}")
            tls_before = None if tls_why else tcp_stream_both(net, COLD_SPAN, tls=True)
            if tls_before:
                log(f"  netns two TLS 1.3 streams, one each way, out of cache (before): {tls_before:.2f} GB/s per direction")
            if both_before:
                log(f"  netns two TCP streams, one each way at once (before): {both_before:.2f} GB/s per direction")
            if cold_before:
                log(f"  netns the same, out of cache (before): {cold_before:.2f} GB/s per direction")
            for per in args.per_host:
                for system in NETNS_SYSTEMS:
                    wanted = system in args.systems or (system.endswith("-plain") and system[:-6] in args.systems)
                    if not wanted:
                        continue
                    procs, why = netns_procs(net, system, per, ops, sizes)
                    if why:
                        log(f"  netns {system}: skipped: {why}")
                        continue
                    log(f"netns {system}: 2 hosts x {per} ranks, {len(ops)} ops x {len(sizes)} sizes")
                    for r in run_adapter(procs, args.timeout, system):
                        log(f"  netns {system} n={r['ranks']} {r['op']} {human(r['bytes'])}: {result_text(r)}"
                            + (f" ({r['path']})" if r.get("path") else ""))
                        r.update(netns=True, per_host=per)
                        results.append(r)
                    if args.no_volume:
                        continue
                    procs, _ = netns_procs(net, system, per, ["allreduce"], [VOLUME_SIZE])
                    got, wire = run_measured(procs, args.timeout, system, net)
                    if not got:
                        continue
                    calls = 2 + common.iterations(VOLUME_SIZE)  # warm-up and timed, as every adapter
                    per_call = wire / calls
                    # The job's CPU per call: rank 0's (the timed calls,
                    # barriers included) times the ranks, which a ring
                    # allreduce keeps equally busy.
                    cpu = got[0].get("cpu_us", 0) * 1e-6 * 2 * per
                    v = {"system": system, "op": "volume", "bytes": VOLUME_SIZE, "ranks": 2 * per, "netns": True,
                         "per_host": per, "calls": calls, "link_bytes": wire, "link_ratio": per_call / (2 * VOLUME_SIZE),
                         "cpu_s_call": cpu, "cpu_s_per_link_gb": cpu / (per_call / 1e9) if wire and cpu else None,
                         "time_us": got[0]["time_us"]}
                    log(f"  netns {system} 2x{per} allreduce 16 MiB x {calls}: {per_call / VOLUME_SIZE:.2f} S "
                        f"on the link per call ({v['link_ratio']:.2f}x the minimum), CPU {cpu * 1e3:.1f} ms per call "
                        f"({v['cpu_s_per_link_gb'] or 0:.2f} s per link GB)")
                    results.append(v)
            stream = tcp_stream(net)
            if stream:
                log(f"  netns one TCP stream: {stream:.2f} GB/s")
                results.append({"system": "tcp-stream", "op": "stream", "bytes": 0, "ranks": 2,
                                "time_us": 0, "algbw_gbs": stream, "busbw_gbs": stream, "netns": True})
            both_after, cold_after = tcp_stream_both(net), tcp_stream_both(net, COLD_SPAN)
            tls_after = None if tls_why else tcp_stream_both(net, COLD_SPAN, tls=True)
            if tls_after:
                log(f"  netns two TLS 1.3 streams, one each way, out of cache (after): {tls_after:.2f} GB/s per direction")
            if both_after:
                log(f"  netns two TCP streams, one each way at once (after): {both_after:.2f} GB/s per direction")
            if cold_after:
                log(f"  netns the same, out of cache (after): {cold_after:.2f} GB/s per direction")
            for op, before, after in (("stream-both", both_before, both_after),
                                      ("stream-both-cold", cold_before, cold_after),
                                      ("stream-both-tls", tls_before, tls_after)):
                got = [b for b in (before, after) if b]
                if got:
                    both = sum(got) / len(got)
                    results.append({"system": "tcp-stream", "op": op, "bytes": 0, "ranks": 2,
                                    "time_us": 0, "algbw_gbs": both, "busbw_gbs": both, "netns": True,
                                    "before_gbs": before, "after_gbs": after})
    except subprocess.CalledProcessError as e:
        log(f"netns: setup failed: {e.stderr.decode().strip() if e.stderr else e}")


STREAM_SRC = r"""
import socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
# span: the bytes each end cycles through, 1 MiB at a time. The default, one
# chunk, keeps both ends' buffers in cache (the sender's, bytes never
# written, reads the kernel's zero page); a larger span (a bytearray, zeroed
# by writing) moves them through memory as a collective's working set does.
total, chunk = 1 << 30, 1 << 20
span = int(sys.argv[4]) if len(sys.argv) > 4 else chunk
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1)
    mv = memoryview(bytearray(span))
    c, _ = s.accept()
    got, off = 0, 0
    while got < total:
        n = c.recv_into(mv[off:off + chunk])
        if not n:
            break
        got += n
        off += n
        if off + chunk > span:
            off = 0
    c.sendall(b"k")
else:
    mv = memoryview(bytes(chunk) if span == chunk else bytearray(span))
    for attempt in range(300):  # the server may not listen yet on a busy host
        try:
            c = socket.create_connection((addr, port))
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    else:
        sys.exit("no server at %s:%d" % (addr, port))
    t = time.perf_counter()
    for i in range(total // chunk):
        off = i * chunk % span
        c.sendall(mv[off:off + chunk])
    c.recv(1)
    print(total / (time.perf_counter() - t) / 1e9)
"""


def tcp_stream(net):
    """GB/s of one TCP connection from the first namespace to the second
    (1 GiB, 1 MiB writes): the ceiling a single stream reaches on that link."""
    port = free_port()
    srv = subprocess.Popen(net.wrap(1) + [SYS_PY, "-c", STREAM_SRC, "server", net.addrs[1], str(port)])
    try:
        time.sleep(0.5)
        r = subprocess.run(net.wrap(0) + [SYS_PY, "-c", STREAM_SRC, "client", net.addrs[1], str(port)],
                           capture_output=True, text=True, timeout=120)
        return float(r.stdout.strip()) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None
    finally:
        srv.kill()
        srv.wait()


COLD_SPAN = 256 << 20
TLS_STREAM = os.path.join(ROOT, "build", "tlsstream")


def build_tls_stream():
    """Build bench/compare/tlsstream into build/; None, or why not."""
    go = shutil.which("go")
    if go is None:
        return "go not found"
    r = subprocess.run([go, "build", "-o", TLS_STREAM, "./bench/compare/tlsstream"], cwd=ROOT,
                       capture_output=True, text=True)
    return None if r.returncode == 0 else "go build ./bench/compare/tlsstream failed: " + r.stderr.strip()[-400:]


def tcp_stream_both(net, span=None, tls=False):
    """GB/s per direction of two TCP connections, one each way, run at once
    (1 GiB each): what an allreduce or all-to-all, which sends and receives
    at the same time, can reach on that link. Reported as the mean of the
    two directions. span: the bytes each end cycles through (default: one
    1 MiB buffer, in cache; COLD_SPAN: out of cache, as a large collective's).
    tls: Go TLS 1.3 connections (bench/compare/tlsstream, AES-128-GCM)
    instead of plain ones: the ceiling of an encrypted path."""
    port = free_port()
    extra = [str(span)] if span else []
    prog = [TLS_STREAM] if tls else [SYS_PY, "-c", STREAM_SRC]
    srvs = [subprocess.Popen(net.wrap(i) + prog + ["server", net.addrs[i], str(port)] + extra)
            for i in (0, 1)]
    try:
        time.sleep(0.5)
        clients = [subprocess.Popen(net.wrap(i) + prog + ["client", net.addrs[1 - i], str(port)] + extra,
                                    stdout=subprocess.PIPE, text=True) for i in (0, 1)]
        rates = []
        for c in clients:
            out, _ = c.communicate(timeout=120)
            if c.returncode != 0:
                return None
            rates.append(float(out.strip()))
        return sum(rates) / len(rates)
    except (subprocess.TimeoutExpired, ValueError):
        return None
    finally:
        for p in srvs:
            p.kill()
            p.wait()


# --- output -----------------------------------------------------------------

def human(b):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << k and b % (1 << k) == 0:
            return f"{b >> k} {unit}"
    return f"{b} B"


NEXARS = ("nexar", "nexar-inplace", "nexar-py", "nexar-torch", "nexar-plain", "nexar-torch-plain")
OTHERS = ("gloo", "mpi", "mpi-tcp", "nexar-rs")
P99_RATIOS = ("nexar-rs",)  # others whose p99 ratio gets its own column too


def write_table(results, path, meta):
    lines = [f"<!-- generated by bench/compare/compare.py; {meta} -->", ""]
    for netns in (False, True):
        sub = [r for r in results if bool(r.get("netns")) == netns and not r["op"].startswith("stream")
               and r["op"] != "volume"]
        if not sub:
            continue
        systems = [s for s in SYSTEMS if any(r["system"] == s for r in sub)]
        ratios = [(f, o, k) for f in NEXARS if f in systems for o in OTHERS if o in systems
                  for k in (("time_us", "p99_us") if o in P99_RATIOS else ("time_us",))]
        idx = {(r["system"], r["op"], r["ranks"], r["bytes"]): r for r in sub}
        ceilings = []  # (label, GB/s): the two-way streams, in cache and out, for "A / label" (namespaces)
        notes = []  # distinct error texts, numbered in order of appearance
        lines.append("### Two network namespaces (veth, no shared memory)" if netns else "### One host")
        lines.append("")
        for r in results:
            if bool(r.get("netns")) != netns:
                continue
            if r["op"] == "stream":
                lines += [f"One TCP stream across the pair (1 GiB, 1 MiB writes): {r['busbw_gbs']:.2f} GB/s.", ""]
            if r["op"] in ("stream-both", "stream-both-cold", "stream-both-tls"):
                cold = r["op"] == "stream-both-cold"
                tls = r["op"] == "stream-both-tls"
                label = "2-way tls" if tls else "2-way cold" if cold else "2-way"
                seen = [f"{r[k]:.2f}" for k in ("before_gbs", "after_gbs") if r.get(k)]
                what = (f"Two Go TLS 1.3 streams (AES-128-GCM), one each way, each end cycling through "
                        f"{COLD_SPAN >> 20} MiB (the ceiling of an encrypted path)" if tls else
                        f"The same two streams, each end cycling through {COLD_SPAN >> 20} MiB instead of one "
                        "1 MiB buffer (out of cache, as a large collective's buffers)" if cold else
                        "Two TCP streams, one each way at once (what a collective that sends and receives "
                        "at the same time can use)")
                lines += [f"{what}: {r['busbw_gbs']:.2f} GB/s per direction"
                          + (f" (before and after the systems: {' and '.join(seen)})" if len(seen) > 1 else "")
                          + f"; \"A / {label}\" is A's busbw divided by it.", ""]
                ceilings.append((label, r["busbw_gbs"]))
        wire = [f for f in NEXARS if f in systems]
        hdr = "| op | ranks | bytes | " + " | ".join(f"{s} µs | {s} busbw" for s in systems)
        hdr += "".join(f" | {f} vs {o}" + (" p99" if k == "p99_us" else "") for f, o, k in ratios)
        hdr += "".join(f" | {f} / {label}" for label, _ in ceilings for f in wire) + " |"
        lines += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
        for op in common.OPS:
            for n in sorted({r["ranks"] for r in sub}):
                for b in sorted({r["bytes"] for r in sub if r["op"] == op and r["ranks"] == n}):
                    row = [op, str(n), human(b)]
                    for s in systems:
                        r = idx.get((s, op, n, b))
                        if r and "error" in r:
                            if r["error"] not in notes:
                                notes.append(r["error"])
                            row += [f"— (note {notes.index(r['error']) + 1})", "—"]
                            continue
                        p99 = f" ({r['p99_us']:.1f})" if r and "p99_us" in r else ""
                        row += [f"{r['time_us']:.1f}{p99}", f"{r['busbw_gbs']:.3f}"] if r else ["–", "–"]
                    for f, o, k in ratios:
                        rf, ro = idx.get((f, op, n, b)), idx.get((o, op, n, b))
                        ok = rf and ro and k in rf and k in ro
                        row.append(f"{ro[k] / rf[k]:.2f}×" if ok else "–")
                    for _, ceiling in ceilings:
                        for f in wire:
                            rf = idx.get((f, op, n, b))
                            row.append(f"{100 * rf['busbw_gbs'] / ceiling:.0f} %" if rf and "busbw_gbs" in rf else "–")
                    lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        for i, e in enumerate(notes):
            lines += [f"Note {i + 1}: {' '.join(e.split())}", ""]
        vol = [r for r in results if r["op"] == "volume" and bool(r.get("netns")) == netns]
        if vol:
            lines += [f"Volume runs: allreduce of {human(VOLUME_SIZE)}, {vol[0]['calls']} calls. \"link / min\" "
                      "is the bytes both veth ends sent per call divided by the least an allreduce must move "
                      "between 2 hosts (2 S: half of S each way for the reduce-scatter, half for the allgather); "
                      "\"CPU ms / call\" is rank 0's CPU time (user + system, every thread, barrier included) per "
                      "timed call times the ranks; \"CPU s / link GB\" divides it by the link bytes per call.", "",
                      "| system | ranks per host | link bytes per call | link / min | CPU ms / call | CPU s / link GB |",
                      "|---|---|---|---|---|---|"]
            for r in sorted(vol, key=lambda r: (r["per_host"], SYSTEMS.index(r["system"]))):
                per_gb = f"{r['cpu_s_per_link_gb']:.2f}" if r.get("cpu_s_per_link_gb") else "–"
                lines.append(f"| {r['system']} | {r['per_host']} | {r['link_bytes'] / r['calls'] / (1 << 20):.1f} MiB "
                             f"| {r['link_ratio']:.2f} | {r['cpu_s_call'] * 1e3:.1f} | {per_gb} |")
            lines.append("")
    lines.append("Times are medians over iterations on rank 0, each iteration started after a barrier, "
                 "with the 99th percentile in parentheses; "
                 "busbw in GB/s as nccl-tests; \"A vs B\" is B's time divided by A's (above 1: A is faster). "
                 "nexar is the Go `nexar bench` (nexar-inplace with --inplace: allreduce over its input, as torch does); nexar-py the Python package (numpy), like mpi4py and torch; "
                 "nexar-rs the Rust nexar from crates.io (bench/compare/nexar-rs); \"vs nexar-rs p99\" "
                 "compares 99th percentiles. \"—\" marks a run that failed (the note below the table says why).")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plot: matplotlib not installed in this interpreter; no PNG")
        return
    results = [r for r in results if "error" not in r]
    results = [r for r in results if r["op"] != "volume"]
    keys = sorted({(r["ranks"], bool(r.get("netns"))) for r in results if not r["op"].startswith("stream")})
    ops = [o for o in common.OPS if any(r["op"] == o for r in results)]
    fig, axes = plt.subplots(len(ops), len(keys), figsize=(4.5 * len(keys), 3 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, (n, netns) in enumerate(keys):
            ax = axes[i][j]
            for s in SYSTEMS:
                pts = sorted((r["bytes"], r["busbw_gbs"]) for r in results
                             if "error" not in r and r["system"] == s and r["op"] == op and r["ranks"] == n and bool(r.get("netns")) == netns)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=s)
            for r in results:
                if r["op"] == "stream" and netns and r.get("netns"):
                    ax.axhline(r["busbw_gbs"], color="grey", ls="--", lw=0.8, label="1 TCP stream")
                if r["op"] == "stream-both" and netns and r.get("netns"):
                    ax.axhline(r["busbw_gbs"], color="grey", ls=":", lw=0.8, label="2 streams, each way")
                if r["op"] == "stream-both-cold" and netns and r.get("netns"):
                    ax.axhline(r["busbw_gbs"], color="grey", ls="-.", lw=0.8, label="2 streams, out of cache")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op}, {n} ranks" + (", 2 netns" if netns else ""), fontsize=9)
            ax.set_xlabel("bytes", fontsize=8)
            ax.set_ylabel("busbw GB/s", fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4", help="comma-separated world sizes (default 2,4)")
    ap.add_argument("--ops", default=",".join(common.OPS))
    ap.add_argument("--sweep", choices=sorted(SWEEPS), default="quick")
    ap.add_argument("--sizes", help="comma-separated byte sizes (overrides --sweep)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--timeout", type=float, default=120, help="seconds per system and world size")
    ap.add_argument("--netns", action="store_true", help="also run 2 ranks across two network namespaces")
    ap.add_argument("--netns-only", action="store_true", help="only the runs across two network namespaces")
    ap.add_argument("--per-host", default="1,2", help="ranks per namespace in the --netns runs (default 1,2)")
    ap.add_argument("--no-volume", action="store_true", help="skip the --netns volume runs (link bytes, CPU)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "compare"), help="output directory")
    args = ap.parse_args()
    args.systems = args.systems.split(",")
    args.per_host = [int(x) for x in args.per_host.split(",")]
    ops = args.ops.split(",")
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else SWEEPS[args.sweep]
    for s in args.systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s}")

    results = []
    rs_why = build_nexar_rs() if "nexar-rs" in args.systems else None
    if rs_why:
        log(f"nexar-rs: cannot run: {rs_why}")
    if args.netns_only:
        args.netns = True
    for n in [] if args.netns_only else [int(x) for x in args.ranks.split(",")]:
        for s in args.systems:
            if s == "gloo":
                why, procs = have_gloo(), None
                procs = None if why else gloo_procs(n, ops, sizes)
            elif s in ("mpi", "mpi-tcp"):
                why = have_mpi()
                extra = ["--mca", "btl", "tcp,self"] if s == "mpi-tcp" else []
                procs = None if why else mpi_procs(n, ops, sizes, s, extra)
            elif s in ("nexar", "nexar-inplace"):
                procs, why = nexar_procs(n, ops, sizes, args.timeout, inplace=s == "nexar-inplace")
            elif s == "nexar-py":
                procs, why = nexar_py_procs(n, ops, sizes)
            elif s == "nexar-torch":
                why = have_gloo() or have_nexar_torch()
                procs = None if why else gloo_procs(n, ops, sizes, backend="nexar")
            elif s == "nexar-rs":
                if rs_why:
                    results += error_rows(s, n, ops, sizes, rs_why)
                    continue
                why, procs = None, nexar_rs_procs(n, ops, sizes)
            else:
                continue  # nexar-plain, nexar-torch-plain: only across namespaces
            if why:
                log(f"{s}: skipped: {why}")
                continue
            log(f"{s}: {n} ranks, {len(ops)} ops x {len(sizes)} sizes")
            got = run_adapter(procs, args.timeout, s)
            for r in got:
                log(f"  {s} {r['op']} n={r['ranks']} {human(r['bytes'])}: {result_text(r)}")
            if s == "nexar-rs":  # what did not come back is a failure, not a blank
                done = {(r["op"], r["bytes"]) for r in got}
                got += [r for r in error_rows(s, n, ops, sizes, "no result: the run failed or timed out before it "
                                                "(see compare's stderr)") if (r["op"], r["bytes"]) not in done]
            results += got
    if args.netns:
        netns_runs(args, ops, sizes, results)
    if not results:
        log("no results")
        return 1
    os.makedirs(args.out, exist_ok=True)
    meta = (f"{time.strftime('%Y-%m-%d %H:%M')} {os.uname().nodename}, {os.cpu_count()} CPUs, "
            f"ranks {args.ranks}, sizes {','.join(map(str, sizes))}")
    with open(os.path.join(args.out, "results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    write_table(results, os.path.join(args.out, "results.md"), meta)
    write_plot(results, os.path.join(args.out, "bandwidth.png"))
    log(f"wrote {args.out}/results.md, results.jsonl, bandwidth.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
