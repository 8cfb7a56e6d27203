"""Every torch collective on the "nexar" backend, synchronous and
asynchronous, with the asynchronous calls' tensors and Works dropped as
soon as torch allows (issue 32). NEXAR_STRESS_CALLS sets the number of
calls per run (default 600; `make test-asan` runs thousands under
AddressSanitizer, where a write to freed memory is reported at once)."""

import os

import pytest

from launch import run_ranks

torch = pytest.importorskip("torch")

CALLS = int(os.environ.get("NEXAR_STRESS_CALLS", "600"))


@pytest.mark.parametrize("n", [2, 3])
def test_stress_every_collective(n):
    outs = run_ranks(n, ["workers/stress_worker.py", "stress", str(CALLS)], timeout=900, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: stress" in o and "calls ok" in o, o
