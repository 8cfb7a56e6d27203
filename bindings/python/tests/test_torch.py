"""torch.distributed backend "nexar": every collective against gloo in the
same run (2 and 4 processes), DDP and FSDP parity, init methods."""

import os
import subprocess
import sys
import tempfile

import pytest

from launch import run_ranks

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
