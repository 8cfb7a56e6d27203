"""Bucketed allreduce: nexar.Comm.allreduce_multi and the torch backend's
allreduce_coalesced, as real processes."""

import pytest

from launch import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_comm_allreduce_multi(n):
    outs = run_ranks(n, ["workers/bucketed_worker.py", "comm"], timeout=120)
    for r, o in enumerate(outs):
        assert f"rank {r}: bucketed comm ok" in o, o


@pytest.mark.parametrize("n", [1, 2, 3])
def test_torch_allreduce_coalesced(n):
    outs = run_ranks(n, ["workers/bucketed_worker.py", "torch"], timeout=180, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: bucketed torch ok" in o, o
