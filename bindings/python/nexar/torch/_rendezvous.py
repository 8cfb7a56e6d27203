"""Rendezvous of a "nexar" group through the Store torch hands the creator.

Rank 0 draws a random token, starts the seed on its host and publishes
both under the group's Store prefix; the other ranks read them and join. A
process that cannot read the job's Store cannot join.

Environment: NEXAR_ADVERTISE_ADDR, libnexar's "address peers dial": its
host part is this rank's advertised host in every group (each group
listens on a port of its own) and, on rank 0, the seed's host.
NEXAR_ADVERTISE_HOST, this backend's former variable, is still read for
the seed's host only (as before) when NEXAR_ADVERTISE_ADDR is unset, with
a DeprecationWarning.
"""

from __future__ import annotations

import os
import secrets
import socket
import warnings
from typing import NamedTuple, Optional

from .. import _comm

__all__ = ["Rendezvous", "rendezvous", "advertise_host"]


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
    a = os.environ.get("NEXAR_ADVERTISE_ADDR", "").strip()
    return _host_of(a) if a else None


def _legacy_host() -> Optional[str]:
    h = os.environ.get("NEXAR_ADVERTISE_HOST", "").strip()
    if h:
        warnings.warn("nexar: NEXAR_ADVERTISE_HOST is deprecated; set NEXAR_ADVERTISE_ADDR",
                      DeprecationWarning, stacklevel=4)
    return h or None


def advertise_host() -> str:
    """The host of the seed rank 0 starts: NEXAR_ADVERTISE_ADDR's, else
    NEXAR_ADVERTISE_HOST (deprecated), else the interface routing to
    MASTER_ADDR, else the host name's address, else 127.0.0.1."""
    return _advertise_addr_host() or _legacy_host() or _derived_host()


def _derived_host() -> str:
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    return "127.0.0.1"


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


def rendezvous(store, rank: int, size: int) -> Rendezvous:
    """Agree on (seed address, token) through the torch Store.

    Every rank adds one to a join counter; the counter tells which incarnation
    of this group (prefix) we belong to, so a group re-created under the same
    prefix (destroy_process_group, then init again on a FileStore) never reads
    the previous incarnation's seed.
    """
    n = store.add("nexar/joins", 1)
    epoch = (n - 1) // size
    key = f"nexar/{epoch}/"
    configured = _advertise_addr_host()
    seed = None
    if rank == 0:
        host = advertise_host()
        token = secrets.token_bytes(32)
        seed = _comm.start_seed(f"{host}:0", size, token)
        addr = seed.addr if seed is not None else f"{host}:{_free_port(host)}"
        store.set(key + "token", token.hex())
        store.set(key + "seed", addr)
    else:
        addr = store.get(key + "seed").decode()
        token = bytes.fromhex(store.get(key + "token").decode())
    return Rendezvous(addr, token, configured, seed)
