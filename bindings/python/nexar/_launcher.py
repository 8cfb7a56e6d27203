"""The launcher that started this process, read in one place.

detect() returns a Launcher: rank, world size, local rank, local world size
and the rendezvous (seed/store) address, each from the first of these that
sets it (docs/guides/launchers.md, "Launcher variables"):

1. explicit arguments (detect(rank=..., ...), nexar.init(rank=...));
2. torchrun / torch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
   MASTER_ADDR + MASTER_PORT;
3. Slurm, in a task of a step (srun; SLURM_STEP_ID set: the batch script
   itself is one process, whatever SLURM_NTASKS says): SLURM_PROCID,
   SLURM_NTASKS, SLURM_LOCALID, this node's count in
   SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, else
   SLURM_NTASKS_PER_NODE), and the first host of SLURM_STEP_NODELIST (else
   SLURM_JOB_NODELIST) as the seed's host;
4. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
   _LOCAL_SIZE; the seed's host is 127.0.0.1 on one node, else mpirun's
   host (the first IPv4 address of OMPI_MCA_orte_hnp_uri);
5. PMIx: PMIX_RANK (PMIx puts no world size or host list in the
   environment: those must come from above).

The seed's address: NEXAR_SEED, else MASTER_ADDR:MASTER_PORT, else the
launcher's host with a port derived from the job (SLURM_JOB_ID and
SLURM_STEP_ID, Open MPI's OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE) into
[PORT_BASE, PORT_BASE + PORT_SPAN), so two jobs on one node do not share
a port (unless their hashes collide: 1 in PORT_SPAN); MASTER_PORT or
NEXAR_SEED overrides it.

A job spans hosts when its local world size is below its world size. For
such a job a seed host taken from Slurm's node list or Open MPI that
resolves only to loopback on this host (a Debian /etc/hosts maps the
host's own name to 127.0.1.1) is replaced by this host's only global
address, or is an error naming NEXAR_SEED and NEXAR_ADVERTISE_ADDR: other
hosts can never dial loopback. A host the user gave (NEXAR_SEED,
MASTER_ADDR) is kept: libnexar and the torch rendezvous check those.

Pure: detect() reads only the mapping it is given (default os.environ)
and, for the loopback rule, the resolver; it changes nothing. export()
writes the torch-style variables a Launcher implies into an environment,
where they are unset.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, MutableMapping, Optional, Tuple

from ._knobs import env as _knob

__all__ = ["Launcher", "detect", "export", "expand_hostlist", "expand_tasks_per_node", "job_port",
           "PORT_BASE", "PORT_SPAN"]

# Derived seed ports: below Linux's ephemeral range (32768-60999), above
# the well-known and most registered service ports.
PORT_BASE = 20000
PORT_SPAN = 12000


@dataclass(frozen=True)
class Launcher:
    """What the launcher says about this process. name: "explicit",
    "torchrun", "slurm", "openmpi", "pmix" or "none" (the source of the
    rank). seed_host/seed_port: the rendezvous address (None when nothing
    gives one). sources: for each field, the variable it came from."""

    name: str
    rank: Optional[int]
    world_size: Optional[int]
    local_rank: Optional[int]
    local_world_size: Optional[int]
    seed_host: Optional[str]
    seed_port: Optional[int]
    job_id: Optional[str] = None
    sources: Dict[str, str] = field(default_factory=dict)

    @property
    def seed(self) -> Optional[str]:
        """host:port of the seed, or None."""
        if self.seed_host is None or self.seed_port is None:
            return None
        h = self.seed_host
        return f"[{h}]:{self.seed_port}" if ":" in h else f"{h}:{self.seed_port}"

    @property
    def spans_hosts(self) -> bool:
        """Whether some rank of the job runs on another host."""
        return (self.local_world_size is not None and self.world_size is not None
                and self.local_world_size < self.world_size)


# --- Slurm's hostlist and task-count syntax ----------------------------------

def _split_top(s: str) -> List[str]:
    """s split at the commas outside brackets."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {s!r}")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {s!r}")
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def _expand_range(body: str, s: str) -> List[str]:
    out = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty range in hostlist {s!r}")
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {part!r} in hostlist {s!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"descending range {part!r} in hostlist {s!r}")
        width = len(lo) if lo.startswith("0") else 0  # Slurm pads to the lower bound's width
        out.extend(str(i).zfill(width) for i in range(a, b + 1))
    return out


def expand_hostlist(s: str) -> List[str]:
    """Slurm's hostlist expression as host names, in order: "node[01-03,7],gpu5"
    is node01, node02, node03, node07, gpu5; "a[1-2]b[3-4]" is a1b3, a1b4,
    a2b3, a2b4 (several brackets multiply, left to right). ValueError for a
    malformed expression."""
    hosts: List[str] = []
    for item in _split_top(s or ""):
        parts: List[str] = [""]
        rest = item
        while rest:
            i = rest.find("[")
            if i < 0:
                parts = [p + rest for p in parts]
                break
            j = rest.find("]", i)
            if j < 0:
                raise ValueError(f"unbalanced '[' in hostlist {s!r}")
            prefix, body, rest = rest[:i], rest[i + 1:j], rest[j + 1:]
            parts = [p + prefix + x for p in parts for x in _expand_range(body, s)]
        hosts.extend(parts)
    return hosts


_TASKS = re.compile(r"^\s*(\d+)\s*(?:\(x(\d+)\))?\s*$")


def expand_tasks_per_node(s: str) -> List[int]:
    """Slurm's tasks-per-node form, one count per node: "2(x3),1" is
    [2, 2, 2, 1]. ValueError for a malformed one."""
    out: List[int] = []
    for part in (s or "").split(","):
        m = _TASKS.match(part)
        if not m:
            raise ValueError(f"bad tasks-per-node {s!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def job_port(job: str) -> int:
    """A port in [PORT_BASE, PORT_BASE + PORT_SPAN) that every rank of the
    job computes alike from its id."""
    h = int.from_bytes(hashlib.sha256(job.encode()).digest()[:8], "big")
    return PORT_BASE + h % PORT_SPAN


# --- detection ---------------------------------------------------------------

def _int(env: Mapping[str, str], name: str, errors: List[str]) -> Optional[int]:
    v = (env.get(name) or "").strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        errors.append(f"{name}={v!r} is not an integer")
        return None


def _first(env: Mapping[str, str], names: List[Tuple[str, str]], errors: List[str]) -> Tuple[Optional[int], str, str]:
    """The first of names ((variable, launcher)) that env sets, as an int:
    (value, variable, launcher)."""
    for name, who in names:
        v = _int(env, name, errors)
        if v is not None:
            return v, name, who
    return None, "", ""


def _hnp_host(uri: str) -> Optional[str]:
    """The first IPv4 address in Open MPI's OMPI_MCA_orte_hnp_uri
    ("jobid.0;tcp://10.0.0.1,192.0.2.2:port;tcp6://[..]:port")."""
    for part in uri.split(";"):
        if part.startswith("tcp://"):
            addrs = part[len("tcp://"):].rsplit(":", 1)[0]
            for a in addrs.split(","):
                try:
                    ip = ipaddress.ip_address(a.strip())
                except ValueError:
                    continue
                if not ip.is_loopback:
                    return str(ip)
    return None


def _slurm_local_size(env: Mapping[str, str], errors: List[str]) -> Tuple[Optional[int], str]:
    node = _int(env, "SLURM_NODEID", errors) or 0
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        v = (env.get(name) or "").strip()
        if v:
            try:
                counts = expand_tasks_per_node(v)
            except ValueError as e:
                errors.append(f"{name}: {e}")
                return None, ""
            if node < len(counts):
                return counts[node], name
    v = _int(env, "SLURM_NTASKS_PER_NODE", errors)
    return (v, "SLURM_NTASKS_PER_NODE") if v is not None else (None, "")


def unroutable(host: str) -> bool:
    """Whether host is (or resolves only to) a loopback or link-local
    address, which no other host can dial."""
    try:
        ips = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            ips = [ipaddress.ip_address(i[4][0].split("%", 1)[0]) for i in socket.getaddrinfo(host, None)]
        except (OSError, UnicodeError, ValueError):
            return False
    return bool(ips) and all(ip.is_loopback or ip.is_link_local for ip in ips)


def global_addrs() -> List[str]:
    """This host's IPv4 addresses that are neither loopback nor link-local."""
    try:
        import fcntl
        import struct
    except ImportError:  # pragma: no cover - not Linux
        return []
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
            except OSError:
                continue
            a = ipaddress.ip_address(ip)
            if not (a.is_loopback or a.is_link_local or a.is_unspecified) and ip not in out:
                out.append(ip)
    return out


def detect(env: Optional[Mapping[str, str]] = None, *, rank: Optional[int] = None,
           world_size: Optional[int] = None, local_rank: Optional[int] = None,
           local_world_size: Optional[int] = None, seed: Optional[str] = None,
           nexar_seed: Optional[str] = None,
           loopback: Callable[[str], bool] = unroutable,
           global_addrs: Callable[[], List[str]] = global_addrs) -> Launcher:
    """This process's Launcher from env (default os.environ) and the
    explicit arguments, which beat every variable. nexar_seed stands for
    NEXAR_SEED (read from the knob table when env is os.environ);
    loopback and global_addrs are the resolver's answers (for tests).
    ValueError naming the variable for a malformed one, or for a job across
    hosts whose seed host is loopback here with no single address to use
    instead."""
    real = env is None
    env = os.environ if env is None else env
    if not (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "").strip():
        # Slurm's batch script (and an salloc shell) has SLURM_PROCID=0 and
        # the job's SLURM_NTASKS but is no task of a step: one process.
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    if nexar_seed is None and real:
        nexar_seed = _knob("NEXAR_SEED")
    errors: List[str] = []
    src: Dict[str, str] = {}

    def pick(fieldname, given, names):
        if given is not None:
            src[fieldname] = "argument"
            return int(given), "explicit"
        v, var, who = _first(env, names, errors)
        if var:
            src[fieldname] = var
        return v, who

    r, rank_from = pick("rank", rank, [("RANK", "torchrun"), ("SLURM_PROCID", "slurm"),
                                       ("OMPI_COMM_WORLD_RANK", "openmpi"), ("PMIX_RANK", "pmix")])
    n, _ = pick("world_size", world_size, [("WORLD_SIZE", "torchrun"), ("SLURM_NTASKS", "slurm"),
                                           ("OMPI_COMM_WORLD_SIZE", "openmpi")])
    lr, _ = pick("local_rank", local_rank, [("LOCAL_RANK", "torchrun"), ("SLURM_LOCALID", "slurm"),
                                            ("OMPI_COMM_WORLD_LOCAL_RANK", "openmpi")])
    if local_world_size is not None:
        lws, src["local_world_size"] = int(local_world_size), "argument"
    else:
        lws, var, _ = _first(env, [("LOCAL_WORLD_SIZE", "torchrun")], errors)
        if var:
            src["local_world_size"] = var
        elif (env.get("SLURM_PROCID") or "").strip():
            lws, var = _slurm_local_size(env, errors)
            if var:
                src["local_world_size"] = var
        if lws is None and not var:
            lws, var, _ = _first(env, [("OMPI_COMM_WORLD_LOCAL_SIZE", "openmpi")], errors)
            if var:
                src["local_world_size"] = var

    slurm = bool((env.get("SLURM_PROCID") or "").strip())
    ompi = bool((env.get("OMPI_COMM_WORLD_RANK") or "").strip())
    job = None
    if slurm and (env.get("SLURM_JOB_ID") or "").strip():
        job = f"slurm:{env['SLURM_JOB_ID'].strip()}.{(env.get('SLURM_STEP_ID') or '').strip()}"
    elif ompi and (env.get("OMPI_MCA_ess_base_jobid") or "").strip():
        job = f"openmpi:{env['OMPI_MCA_ess_base_jobid'].strip()}"
    elif (env.get("PMIX_NAMESPACE") or "").strip():
        job = f"pmix:{env['PMIX_NAMESPACE'].strip()}"

    host: Optional[str] = None
    port: Optional[int] = None
    if seed is not None or nexar_seed:
        s, what = (seed, "argument") if seed is not None else (nexar_seed, "NEXAR_SEED")
        h, sep, p = s.strip().rpartition(":")
        if not sep or not p.isdigit() or not h:
            errors.append(f"{what}={s!r} is not host:port")
        else:
            host, port = h.strip("[]"), int(p)
            src["seed"] = what
    elif (env.get("MASTER_ADDR") or "").strip():
        host = env["MASTER_ADDR"].strip()
        src["seed"] = "MASTER_ADDR"
        port = _int(env, "MASTER_PORT", errors)
        if port is not None:
            src["seed"] += "+MASTER_PORT"
    if host is None and slurm:
        nodes = (env.get("SLURM_STEP_NODELIST") or "").strip()
        var = "SLURM_STEP_NODELIST"
        if not nodes:
            nodes, var = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip(), "SLURM_JOB_NODELIST"
        if nodes:
            try:
                hosts = expand_hostlist(nodes)
            except ValueError as e:
                errors.append(f"{var}: {e}")
                hosts = []
            if hosts:
                host, src["seed"] = hosts[0], var
    if host is None and ompi:
        nodes = _int(env, "OMPI_MCA_orte_num_nodes", errors)
        if nodes == 1 or (lws is not None and n is not None and lws == n):
            host, src["seed"] = "127.0.0.1", "OMPI_MCA_orte_num_nodes"
        else:
            h = _hnp_host(env.get("OMPI_MCA_orte_hnp_uri") or "")
            if h:
                host, src["seed"] = h, "OMPI_MCA_orte_hnp_uri"
    if host is not None and port is None:
        mp = _int(env, "MASTER_PORT", errors)
        if mp is not None:
            port = mp
            src["seed"] = src.get("seed", "") + "+MASTER_PORT"
        elif job is not None:
            port = job_port(job)
            src["seed"] = src.get("seed", "") + f"+port from {job}"
    if errors:
        raise ValueError("nexar: launcher variables: " + "; ".join(errors))

    name = rank_from or ("slurm" if slurm else "openmpi" if ompi else "none")
    info = Launcher(name, r, n, lr, lws, host, port, job, src)
    derived = src.get("seed", "").startswith(("SLURM_", "OMPI_"))
    if derived and info.spans_hosts and loopback(host):
        addrs = [a for a in global_addrs() if a]
        if len(addrs) != 1:
            raise ValueError(
                f"nexar: the seed's host {host} ({src.get('seed')}) resolves to loopback on this host "
                f"({socket.gethostname()}), but the job spans hosts (local world size {lws} < world size {n}), "
                f"and this host has {len(addrs)} global addresses ({', '.join(addrs[:8]) or 'none'}): other hosts "
                "cannot dial loopback. Name the seed by an address they reach (NEXAR_SEED=IP:PORT or MASTER_ADDR), "
                "and set NEXAR_ADVERTISE_ADDR to this host's address")
        src["seed"] = src.get("seed", "") + f" ({host} is loopback here: this host's address)"
        info = Launcher(name, r, n, lr, lws, addrs[0], port, job, src)
    return info


def export(info: Launcher, env: Optional[MutableMapping[str, str]] = None) -> Dict[str, str]:
    """Set the torch-style variables info implies (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) in env (default
    os.environ) where they are unset, as torchrun would have; the ones set."""
    env = os.environ if env is None else env
    want = {"RANK": info.rank, "WORLD_SIZE": info.world_size, "LOCAL_RANK": info.local_rank,
            "LOCAL_WORLD_SIZE": info.local_world_size, "MASTER_ADDR": info.seed_host,
            "MASTER_PORT": info.seed_port}
    done = {}
    for k, v in want.items():
        if v is not None and not (env.get(k) or "").strip():
            env[k] = str(v)
            done[k] = str(v)
    return done
