"""The torch backend's rendezvous (nexar/torch/_rendezvous.py) in one
process, each rank a thread over one HashStore: the advertised address,
keys per torchelastic attempt, the loopback rule, the logged waits. Across
network namespaces: test_rendezvous_netns.py."""

import json
import logging
import threading
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import nexar  # noqa: E402
import nexar._comm  # noqa: E402
from nexar.torch import _rendezvous  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for v in ("NEXAR_ADVERTISE_ADDR", "NEXAR_ADVERTISE_HOST", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR"):
        monkeypatch.delenv(v, raising=False)


class FakeSeed:
    def __init__(self, bind):
        self.addr = bind.rsplit(":", 1)[0] + ":4242"

    def close(self):
        pass


@pytest.fixture
def fake_seed(monkeypatch):
    asked = []

    def start_seed(bind, size, token):
        asked.append(bind)
        return FakeSeed(bind)

    monkeypatch.setattr(nexar._comm, "start_seed", start_seed)
    return asked


def store(timeout=20.0):
    from torch.distributed import HashStore

    s = HashStore()
    s.set_timeout(timedelta(seconds=timeout))
    return s


def ranks(st, size, only=None):
    """rendezvous of ranks `only` (default all) of size on threads: each
    rank's Rendezvous, or the exception it raised."""
    out = {}

    def run(r):
        try:
            out[r] = _rendezvous.rendezvous(st, r, size)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[r] = e

    ts = [threading.Thread(target=run, args=(r,)) for r in (only if only is not None else range(size))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def test_reads_nexar_advertise_addr(monkeypatch):
    """The seed's host and every rank's advertised host come from
    NEXAR_ADVERTISE_ADDR (libnexar's variable), not the route to MASTER_ADDR."""
    monkeypatch.setenv("NEXAR_ADVERTISE_ADDR", "127.0.0.3:9")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    out = ranks(store(), 2)
    r0, r1 = out[0], out[1]
    try:
        assert not isinstance(r0, BaseException) and not isinstance(r1, BaseException), out
        assert r0.seed_addr.startswith("127.0.0.3:"), r0.seed_addr
        assert r0.seed_addr != "127.0.0.3:9"  # the port is the seed's, not the variable's
        assert (r1.seed_addr, r1.token) == (r0.seed_addr, r0.token) and len(r0.token) == 32
        assert r0.advertise_host == r1.advertise_host == "127.0.0.3"
    finally:
        if getattr(r0, "seed", None) is not None:
            r0.seed.close()


def test_publishes_the_address_a_port0_seed_got(monkeypatch, fake_seed):
    """With a libnexar that starts the seed on port 0 and reports its
    address, rank 0 publishes that address and never picks a port itself."""

    def no_free_port(host):
        raise AssertionError("picked a port although the seed can bind port 0")

    monkeypatch.setattr(_rendezvous, "_free_port", no_free_port)
    monkeypatch.setenv("NEXAR_ADVERTISE_ADDR", "127.0.0.1")
    st = store()
    out = ranks(st, 3)
    assert fake_seed == ["127.0.0.1:0"]
    assert [o.seed_addr for o in out.values()] == ["127.0.0.1:4242"] * 3, out
    assert st.get("nexar/0/seed") == b"127.0.0.1:4242"


def test_keys_are_per_torchelastic_attempt(monkeypatch, fake_seed):
    """Attempt 0 lost a rank before it reached the rendezvous (two of three
    joined the counter); attempt 1, on the same store, still agrees."""
    st = store(timeout=5)
    st.add("nexar/attempt0/joins", 2)  # what ranks 0 and 1 of attempt 0 left
    st.add("nexar/joins", 2)  # the same, as keyed before attempts were
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    out = ranks(st, 3)
    assert all(not isinstance(o, BaseException) for o in out.values()), out
    assert len({(o.seed_addr, o.token) for o in out.values()}) == 1


def test_seed_never_loopback_for_a_rank_elsewhere(monkeypatch, fake_seed):
    """Rank 1 runs on another host: rank 0 does not advertise the loopback
    route to MASTER_ADDR; with no address of its own to use instead it fails
    at once naming NEXAR_ADVERTISE_ADDR, and so does rank 1."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    real_here = _rendezvous.here()
    monkeypatch.setattr(_rendezvous, "here", lambda: real_here + "-" + threading.current_thread().name)

    monkeypatch.setattr(_rendezvous, "_global_addrs", lambda: ["10.1.2.3"])
    out = ranks(store(), 2)
    assert fake_seed == ["10.1.2.3:0"], out
    assert out[1].seed_addr == "10.1.2.3:4242"

    monkeypatch.setattr(_rendezvous, "_global_addrs", lambda: ["10.1.2.3", "10.9.9.9"])
    out = ranks(store(), 2)
    for r in (0, 1):
        assert isinstance(out[r], nexar.InvalidArgumentError), out
        msg = str(out[r])
        assert "127.0.0.1" in msg and "NEXAR_ADVERTISE_ADDR" in msg and "rank 1" in msg, msg

    monkeypatch.setenv("NEXAR_ADVERTISE_ADDR", "127.0.0.1")
    out = ranks(store(), 2)
    assert isinstance(out[0], nexar.InvalidArgumentError) and "NEXAR_ADVERTISE_ADDR gives 127.0.0.1" in str(out[0])


def test_same_host_keeps_loopback(monkeypatch, fake_seed):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setattr(_rendezvous, "_global_addrs", lambda: [])
    out = ranks(store(), 3)
    assert fake_seed == ["127.0.0.1:0"], out


def test_a_loopback_seed_from_another_host_fails_at_once():
    """A rank that reads a loopback seed published by a rank 0 elsewhere
    (one that predates the rule, or misconfigured) fails at once."""
    st = store(timeout=30)
    st.add("nexar/joins", 1)
    st.set("nexar/0/host/0", json.dumps({"here": "elsewhere", "name": "hostA"}))
    st.set("nexar/0/token", "00" * 32)
    st.set("nexar/0/seed", "127.0.0.1:5555")
    out = ranks(st, 2, only=[1])
    assert isinstance(out[1], nexar.InvalidArgumentError), out
    msg = str(out[1])
    assert "127.0.0.1:5555" in msg and "NEXAR_ADVERTISE_ADDR" in msg and "hostA" in msg, msg


def test_waits_are_logged_and_end_at_the_store_timeout(monkeypatch, caplog):
    """Rank 0 waits for ranks 1 and 2, which never come: it logs whom it
    waits for within the first interval and fails at the store's timeout
    naming them; rank 1 alone waits for the seed the same way."""
    monkeypatch.setattr(_rendezvous, "_FIRST_LOG", 0.3)
    monkeypatch.setattr(_rendezvous, "_LOG_EVERY", 0.5)
    caplog.set_level(logging.WARNING, logger="nexar.torch")
    out = ranks(store(timeout=1.5), 3, only=[0])
    assert isinstance(out[0], nexar.TimeoutError), out
    assert "ranks 1, 2" in str(out[0]) and "group's timeout" in str(out[0])
    logged = [r.getMessage() for r in caplog.records]
    assert any("rank 0 has waited" in m and "ranks 1, 2" in m for m in logged), logged

    caplog.clear()
    out = ranks(store(timeout=1.5), 2, only=[1])
    assert isinstance(out[1], nexar.TimeoutError), out
    assert any("rank 1 has waited" in r.getMessage() and "seed" in r.getMessage() for r in caplog.records)


def test_store_endpoint_unwraps_prefix_stores():
    from torch.distributed import PrefixStore, TCPStore

    s = TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    p = PrefixStore("a/", PrefixStore("b/", s))
    assert _rendezvous.store_endpoint(p) == ("127.0.0.1", s.port)
    assert _rendezvous.store_endpoint(store()) is None


DYNAMO_PROBE = r"""
import importlib.util, os, sys
import torch, torch.distributed as dist
import nexar.torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("nexar", rank=0, world_size=1)
from nexar.torch._pg import ProcessGroupNexar as P
assert "torch._dynamo" not in sys.modules, "init_process_group imported Dynamo"
assert not getattr(P, "_nexar_untraced", False)
importlib.util.find_spec("torch._dynamo")  # a look without an import keeps the hook
import torch._dynamo
assert P._nexar_untraced and getattr(P.allgather, "_torchdynamo_disable", False), P.allgather
assert P._allreduce_general is P.allreduce
x = torch.ones(2)
dist.all_reduce(x)
dist.destroy_process_group()
print("dynamo probe ok", flush=True)
"""


def test_init_does_not_import_dynamo_until_the_program_does():
    """init_process_group("nexar") leaves torch._dynamo unimported (seconds
    of start-up); importing it later wraps the group's methods at once."""
    import subprocess
    import sys

    from launch import free_port

    p = subprocess.run([sys.executable, "-c", DYNAMO_PROBE, str(free_port())], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0 and "dynamo probe ok" in p.stdout, p.stdout + p.stderr
