"""Rendezvous of a "nexar" group through the Store torch hands the creator.

Rank 0 draws a random token, starts the seed on its host and publishes
both under the group's Store prefix; the other ranks read them and join. A
process that cannot read the job's Store cannot join.

Keys are per attempt: under torchelastic the restart count is part of the
prefix (its agent's store outlives a restart), so a rank lost before it
reached the rendezvous of one attempt cannot offset the next; within an
attempt a join counter tells re-creations under the same prefix apart
(destroy_process_group, then init again on a FileStore).

The seed is never advertised on loopback to another host: every rank first
publishes where it runs (its kernel and network namespace), so rank 0 knows
whether a loopback address would do. Its address is NEXAR_ADVERTISE_ADDR's
host, else the address of the interface that routes to the store's host
(TCPStore's host, under any PrefixStore), else to MASTER_ADDR, else the
host name's. When that is loopback or link-local while some rank runs
elsewhere, rank 0 uses the store's address as the remote ranks resolved it
if it is one of its own, else its only global address, else fails at once
naming NEXAR_ADVERTISE_ADDR; the others fail with it. Every wait in the
store logs whom it waits for, and ends at the store's timeout (the group's).

Environment: NEXAR_ADVERTISE_ADDR, libnexar's "address peers dial": its
host part is this rank's advertised host in every group (each group
listens on a port of its own) and, on rank 0, the seed's host.
NEXAR_ADVERTISE_HOST, this backend's former variable, is still read for
the seed's host only (as before) when NEXAR_ADVERTISE_ADDR is unset, with
a DeprecationWarning.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
import warnings
from datetime import timedelta
from typing import Dict, List, NamedTuple, Optional, Tuple

from .. import _comm, _errors
from .._knobs import env
from .._launcher import global_addrs as _global_addrs
from .._launcher import unroutable

__all__ = ["Rendezvous", "rendezvous", "advertise_host"]

_log = logging.getLogger("nexar.torch")

# A wait in the store logs after _FIRST_LOG seconds, then every _LOG_EVERY.
_FIRST_LOG = 10.0
_LOG_EVERY = 30.0


class Rendezvous(NamedTuple):
    """What a rank needs to create the group's Comm. seed is the seed this
    rank started (rank 0, with a libnexar that can start one on port 0), to
    be closed after the Comm; None otherwise."""

    seed_addr: str
    token: bytes
    advertise_host: Optional[str]
    seed: Optional["_comm.Seed"]


def _host_of(addr: str) -> str:
    """The host of "host", "host:port", "[v6]" or "[v6]:port"."""
    if addr.startswith("["):
        return addr[1:addr.find("]")]
    if addr.count(":") == 1:
        return addr.split(":", 1)[0]
    return addr


def _advertise_addr_host() -> Optional[str]:
    a = env("NEXAR_ADVERTISE_ADDR")
    return _host_of(a) if a else None


def _legacy_host() -> Optional[str]:
    h = env("NEXAR_ADVERTISE_HOST")
    if h:
        warnings.warn("nexar: NEXAR_ADVERTISE_HOST is deprecated; set NEXAR_ADVERTISE_ADDR",
                      DeprecationWarning, stacklevel=4)
    return h


def advertise_host(store=None) -> str:
    """The host of the seed rank 0 starts: NEXAR_ADVERTISE_ADDR's, else
    NEXAR_ADVERTISE_HOST (deprecated), else the interface routing to the
    store's host, else to MASTER_ADDR, else the host name's address, else
    127.0.0.1."""
    return _advertise_addr_host() or _legacy_host() or _derived_host(store)


def _route_to(host: str, port: int) -> Optional[str]:
    """The IP of the interface this host sends from to reach host (a UDP
    connect sends nothing), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except (OSError, UnicodeError):
        return None


def store_endpoint(store) -> Optional[Tuple[str, int]]:
    """(host, port) of the TCPStore under store's PrefixStores, or None
    (a FileStore, a HashStore, a store of another kind)."""
    s = store
    for _ in range(16):
        under = getattr(s, "underlying_store", None)
        if under is None:
            break
        s = under
    try:
        host, port = getattr(s, "host", None), getattr(s, "port", None)
    except Exception:  # noqa: BLE001 - a store whose accessors fail has no endpoint
        return None
    if isinstance(host, str) and host and isinstance(port, int):
        return host, port
    return None


def _derived_host(store=None) -> str:
    ep = store_endpoint(store) if store is not None else None
    if ep is not None:
        ip = _route_to(*ep)
        if ip:
            return ip
    master = os.environ.get("MASTER_ADDR")
    if master:
        ip = _route_to(master, int(os.environ.get("MASTER_PORT", "29500") or 29500))
        if ip:
            return ip
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    return "127.0.0.1"


def _is_mine(ip: str) -> bool:
    """Whether ip is an address of this host (it can be bound)."""
    try:
        fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def here() -> str:
    """Where this process runs, as far as loopback goes: the kernel's boot
    id and the network namespace. Two processes can reach each other on
    loopback exactly when these match."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return socket.gethostname()


def _attempt() -> str:
    """The torchelastic restart count, "" outside torchelastic."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "").strip()


def _free_port(host: str) -> int:
    """A port free for both TCP and UDP on host (the seed may use either).

    Racy: the port is released before libnexar binds it. Used only with a
    libnexar that cannot start a seed on port 0 (_comm.start_seed None).
    """
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            t.bind((host, 0))
            port = t.getsockname()[1]
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                    u.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError("nexar: no free port for the seed")


def _store_timeout(store) -> float:
    try:
        t = store.timeout
        secs = t.total_seconds() if isinstance(t, timedelta) else float(t)
        if secs > 0:
            return secs
    except Exception:  # noqa: BLE001 - a store without a timeout: torch's default
        pass
    return 1800.0


def _where(store) -> str:
    ep = store_endpoint(store)
    return f"the store at {ep[0]}:{ep[1]}" if ep else "the store"


def _wait(store, keys: Dict[int, str], rank: int, what: str, timeout: float) -> None:
    """Wait until every key of keys (by the rank that sets it) is in the
    store, logging whom it waits for after _FIRST_LOG s and every
    _LOG_EVERY s after; a TimeoutError naming them at timeout."""
    import torch.distributed as dist

    timed_out = getattr(dist, "DistStoreError", RuntimeError)
    start = time.monotonic()
    next_log = _FIRST_LOG
    while True:
        chunk = min(next_log, timeout) - (time.monotonic() - start)
        try:
            store.wait(list(keys.values()), timedelta(seconds=max(0.001, chunk)))
            return
        except timed_out:
            pass
        waited = time.monotonic() - start
        missing = [r for r, k in keys.items() if not store.check([k])]
        if not missing:
            return
        shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
        if waited >= timeout:
            raise _errors.error_for(_errors.TimeoutError.code,
                                    f"nexar: rendezvous: rank {rank}: {what} {shown} in {_where(store)}: "
                                    f"not there after {timeout:.0f} s (the group's timeout)")
        _log.warning("nexar: rendezvous: rank %d has waited %.0f s for %s %s in %s", rank, waited, what, shown,
                     _where(store))
        next_log = waited + _LOG_EVERY


def _fail(rank: int, msg: str) -> _errors.Error:
    return _errors.error_for(_errors.InvalidArgumentError.code, f"nexar: rendezvous: rank {rank}: {msg}")


def _choose_host(store, rank: int, infos: Dict[int, dict], mine: str) -> str:
    """Rank 0's seed host: advertise_host(store), unless that is loopback
    or link-local while the ranks in infos that run elsewhere need it."""
    host = advertise_host(store)
    remote = sorted(r for r, i in infos.items() if i.get("here") != mine)
    if not remote or not unroutable(host):
        return host
    names = sorted({str(infos[r].get("name")) for r in remote})
    shown = ", ".join(map(str, remote[:16])) + (", ..." if len(remote) > 16 else "")
    who = (f"rank {shown} runs on another host" if len(remote) == 1 else f"ranks {shown} run on other hosts") + \
        f" ({', '.join(names[:8])})"
    if _advertise_addr_host() or env("NEXAR_ADVERTISE_HOST"):
        raise _fail(rank, f"NEXAR_ADVERTISE_ADDR gives {host}, which other hosts cannot dial, and {who}; "
                          "set NEXAR_ADVERTISE_ADDR to an address of this host that they reach")
    # The store's host as the remote ranks resolved it, when that is this
    # host: they reached the store there.
    for r in remote:
        ip = infos[r].get("store_ip")
        if ip and not unroutable(ip) and _is_mine(ip):
            _log.info("nexar: rendezvous: the seed's host %s is loopback here; advertising %s, the store's "
                      "address as rank %d resolved it", host, ip, r)
            return ip
    addrs = _global_addrs()
    if len(addrs) == 1:
        _log.info("nexar: rendezvous: the seed's host %s is loopback here; advertising %s, this host's "
                  "only global address", host, addrs[0])
        return addrs[0]
    raise _fail(rank, f"the address to advertise the seed at, {host}, is loopback or link-local (the interface "
                      f"that routes to {_where(store)} or MASTER_ADDR, or the host name's address), and {who}; "
                      f"this host has {len(addrs)} other addresses ({', '.join(addrs[:8]) or 'none'}): set "
                      "NEXAR_ADVERTISE_ADDR to the one the other hosts reach")


def rendezvous(store, rank: int, size: int) -> Rendezvous:
    """Agree on (seed address, token) through the torch Store.

    Every rank adds one to the attempt's join counter: the counter tells
    which incarnation of this group (prefix) we belong to, so a group
    re-created under the same prefix never reads the previous
    incarnation's seed. Then every rank publishes where it runs; rank 0
    waits for all, chooses the seed's address (never loopback for a rank
    elsewhere) and publishes it, or its failure, which every rank raises.
    """
    attempt = _attempt()
    base = f"nexar/attempt{attempt}/" if attempt else "nexar/"
    n = store.add(base + "joins", 1)
    key = f"{base}{(n - 1) // size}/"
    configured = _advertise_addr_host()
    timeout = _store_timeout(store)
    mine = here()
    info = {"here": mine, "name": socket.gethostname()}
    seed = None
    if rank == 0:
        infos: Dict[int, dict] = {}
        if size > 1:
            others = {r: f"{key}host/{r}" for r in range(1, size)}
            _wait(store, others, rank, "ranks", timeout)
            vals = store.multi_get(list(others.values())) if hasattr(store, "multi_get") else \
                [store.get(k) for k in others.values()]
            for r, v in zip(others, vals):
                try:
                    infos[r] = json.loads(bytes(v).decode())
                except ValueError:
                    infos[r] = {}
        try:
            host = _choose_host(store, rank, infos, mine)
        except _errors.Error as e:
            store.set(key + "seed", "!" + str(e))
            raise
        token = secrets.token_bytes(32)
        seed = _comm.start_seed(f"{host}:0", size, token)
        addr = seed.addr if seed is not None else f"{host}:{_free_port(host)}"
        store.set(key + "host/0", json.dumps(info))
        store.set(key + "token", token.hex())
        store.set(key + "seed", addr)
    else:
        ep = store_endpoint(store)
        if ep is not None:
            try:
                info["store_ip"] = socket.gethostbyname(ep[0])
            except (OSError, UnicodeError):
                pass
        store.set(f"{key}host/{rank}", json.dumps(info))
        _wait(store, {0: key + "seed"}, rank, "the seed's address from rank", timeout)
        addr = store.get(key + "seed").decode()
        if addr.startswith("!"):
            raise _fail(rank, f"rank 0 could not start the rendezvous: {addr[1:]}")
        token = bytes.fromhex(store.get(key + "token").decode())
        zero = json.loads(store.get(key + "host/0").decode())
        if zero.get("here") != mine and unroutable(_host_of(addr)):
            raise _fail(rank, f"rank 0 (host {zero.get('name')}) advertises the seed at {addr}, which this host "
                              f"({info['name']}) cannot reach; set NEXAR_ADVERTISE_ADDR on rank 0's host to an "
                              "address that other hosts reach")
    return Rendezvous(addr, token, configured, seed)
