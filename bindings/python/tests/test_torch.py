"""torch.distributed backend "nexar": every collective against gloo in the
same run (2 and 4 processes), DDP and FSDP parity, init methods."""

import os
import subprocess
import sys
import tempfile
import warnings

import pytest

from launch import run_ranks, run_ranks_status

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_match_gloo(n):
    outs = run_ranks(n, ["workers/torch_worker.py", "collectives"], timeout=400, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: collectives ok" in o, o


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_gloo(n):
    outs = run_ranks(n, ["workers/torch_worker.py", "ddp"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: ddp ok" in o, o


def test_fsdp_matches_gloo():
    outs = run_ranks(2, ["workers/torch_worker.py", "fsdp"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: fsdp ok" in o, o


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(method):
    with tempfile.TemporaryDirectory() as d:
        env = {"NEXAR_TEST_FILE": os.path.join(d, "store")}
        outs = run_ranks(2, ["workers/torch_worker.py", f"init:{method}"], timeout=180,
                         torchrun_env=True, env=env)
    for r, o in enumerate(outs):
        assert f"rank {r}: init {method} ok" in o, o


def test_entry_point_registers_without_import():
    code = ("import torch, torch.distributed as dist, sys;"
            "sys.exit(0 if 'NEXAR' in dist.Backend._plugins else 3)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # importing torch must not load libnexar (the Go runtime) by itself
    code = ("import torch, torch.distributed, sys;"
            "sys.exit(0 if 'nexar._nexar' not in sys.modules else 4)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_torchrun_launch():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed next to the interpreter")
    here = os.path.dirname(os.path.abspath(__file__))
    ex = os.path.join(here, "..", "..", "..", "examples", "python", "ddp_train.py")
    if not os.path.exists(ex):
        pytest.skip("examples/python/ddp_train.py missing")
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", ex, "--steps", "5"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]



@pytest.mark.parametrize("what", ["ddp", "ddp+exit", "fsdp", "fsdp2", "wait", "future"])
def test_peer_death_raises(what):
    """The last rank SIGKILLs itself mid-run; the survivor gets a Python
    exception naming it within seconds and exits normally (no SIGSEGV:
    DDP's reducer used to crash on a Future marked failed only in Python)."""
    with tempfile.TemporaryDirectory() as d:
        env = {"NEXAR_TEST_FILE": os.path.join(d, "killed_at")}
        res = run_ranks_status(2, ["workers/torch_worker.py", f"peerdeath:{what}"], timeout=120, env=env)
    (rc0, out0), (rc1, _) = res
    assert rc1 == -9, f"the victim was not killed (rc={rc1})"
    assert rc0 == 0, f"survivor rc={rc0}:\n{out0[-6000:]}"
    assert f"rank 0: peer death {what} ok" in out0, out0[-6000:]
    line = next(x for x in out0.splitlines() if "s after the kill" in x)
    secs = float(line.split(", ")[1].split(" s after")[0])
    # the heartbeat timeout is 3 s; 15 s leaves room for a loaded machine
    assert secs < 15, line


def test_failed_work_fails_its_future_for_cpp():
    """A failed NexarWork's Future is failed for torch's C++ readers too
    (DDP's reducer, collect_all), not a success holding the exception; any
    BaseException completes it."""
    import nexar
    from nexar.torch._pg import NexarWork

    w = NexarWork([torch.ones(2)], "allreduce")
    w._complete(nexar.PeerDownError(4, "nexar_allreduce: rank 1 is unreachable"))
    # torch's Work over a Future reads the C++ future's state: it used to
    # report success here.
    from torch._C._distributed_c10d import _create_work_from_future

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # is_success() is deprecated
        assert not _create_work_from_future(w.get_future()).is_success()
    with pytest.raises(RuntimeError, match="PeerDownError: nexar_allreduce: rank 1 is unreachable"):
        torch.futures.collect_all([w.get_future()]).wait()
    with pytest.raises(RuntimeError, match="rank 1 is unreachable"):
        w.get_future().wait()
    with pytest.raises(nexar.PeerDownError):
        w.wait()
    assert w.is_completed() and not w.is_success()

    w = NexarWork([], "barrier")
    w._complete(KeyboardInterrupt())
    assert w.get_future().done()
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        w.get_future().wait()

    w = NexarWork([torch.ones(2)], "allreduce")
    w._complete()
    assert torch.equal(torch.futures.collect_all([w.get_future()]).wait()[0].wait()[0], torch.ones(2))
