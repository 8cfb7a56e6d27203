"""DDP under torch.distributed.algorithms.join.Join with uneven inputs on
the "nexar" backend (issue 32: rank 0 aborted with `malloc(): unaligned
tcache chunk detected`): the join hook's all_reduces are issued
asynchronously and dropped by torch at once, and their tensors must
outlive their Works until the operations end. Every rank's final model
is checked against a reference trained in one process."""

import pytest

from launch import run_ranks

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("steps", ["3,5", "5,3", "1,4", "2,2", "3,5,4", "6,1,2"])
def test_join_uneven_inputs(steps):
    n = len(steps.split(","))
    outs = run_ranks(n, ["workers/join_worker.py", "nexar", steps], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: join nexar [{steps.replace(',', ', ')}] ok" in o, o


def test_dropped_started_work_keeps_its_tensor():
    """A started all_reduce whose Work is dropped before the peers call it
    keeps its tensor alive until the operation ends, then releases it."""
    outs = run_ranks(2, ["workers/stress_worker.py", "lifetime"], timeout=180, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: lifetime ok" in o, o
