"""torch 2.x features on the "nexar" backend, each beside the same run over
gloo: dist.split_group, and torch.compile of a DDP model (and of a function
that calls a collective)."""

import pytest

from launch import run_ranks

torch = pytest.importorskip("torch")


def test_split_group_matches_gloo():
    outs = run_ranks(3, ["workers/torch2_worker.py", "split"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: split ok" in o, o
    # rank 1 is in a split of its own first, then in [0, 1]; rank 2 in neither of the second
    assert "split [[2, 0], [1]] ranks [1] ok" in outs[1], outs[1]
    assert "split [[0, 1]]" not in outs[2], outs[2]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_ddp_matches_gloo(backend):
    outs = run_ranks(2, ["workers/torch2_worker.py", "compile", backend], timeout=500, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: compile ok" in o, o
