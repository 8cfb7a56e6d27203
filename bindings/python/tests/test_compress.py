"""Compressed allreduce: nexar.Comm.allreduce_compressed for world sizes 1..5
and the DDP hook's convergence against uncompressed training, as real
processes."""

import pytest

import nexar
from launch import run_ranks


def test_state():
    st = nexar.CompressState("RandomK", 0.5, seed=3)
    assert st.method == nexar.RANDOMK and not st.error_feedback
    assert nexar.CompressState().error_feedback  # topk: on by default
    seeds = [st.next_seed() for _ in range(3)]
    assert len(set(seeds)) == 3 and st.calls == 3
    again = nexar.CompressState("randomk", 0.5, seed=3)
    assert [again.next_seed() for _ in range(3)] == seeds  # same calls, same seeds
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError):
            nexar.CompressState("topk", bad)
    with pytest.raises(ValueError):
        nexar.CompressState("powersgd")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_comm_allreduce_compressed(n):
    outs = run_ranks(n, ["workers/compressed_worker.py", "comm"], timeout=120)
    for r, o in enumerate(outs):
        assert f"rank {r}: compressed comm ok" in o, o


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_hook_converges(n):
    outs = run_ranks(n, ["workers/compressed_worker.py", "converge"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: compressed converge ok" in o, o
    print(outs[0])
