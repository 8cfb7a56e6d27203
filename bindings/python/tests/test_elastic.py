"""Elastic DDP without restart (issue 10): examples/python/elastic_ddp.py on
4 ranks under NEXAR_ON_FAILURE=manual; rank 3 is SIGKILLed at step 5, the
survivors shrink the group and rebuild DDP on it; a replacement process
started by the new rank 0 joins when the survivors grow at step 8, and all
4 finish. Every final weight must equal single-process training on the
same global batches (every step averages the gradient over the whole
global batch)."""

import importlib.util
import os
import re
import signal

import pytest

torch = pytest.importorskip("torch")

from launch import run_ranks_status  # noqa: E402

EXAMPLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python",
                                       "elastic_ddp.py"))


def reference_weights():
    spec = importlib.util.spec_from_file_location("elastic_ddp", EXAMPLE)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    x, y = ex.data()
    model = torch.nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=ex.LR)
    for _ in range(ex.STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model.weight.detach().flatten().tolist()


def test_elastic_ddp_survives_a_killed_rank_and_takes_a_replacement():
    res = run_ranks_status(4, [EXAMPLE], timeout=240,
                           env={"NEXAR_ON_FAILURE": "manual", "NEXAR_HEARTBEAT_TIMEOUT": "2s"})
    code3, out3 = res[3]
    assert code3 == -signal.SIGKILL, f"rank 3 was to be killed: {code3}\n{out3}"
    want = reference_weights()
    finals = []
    for r in range(3):
        code, out = res[r]
        assert code == 0, f"rank {r} exited {code}:\n{out}"
        m = re.search(rf"rank {r}: done: 12 steps on 4 ranks after 1 shrink\(s\) and 1 grow\(s\); weights (.*)", out)
        assert m, out
        finals.append([float(v) for v in m.group(1).split()])
    # The replacement, started by rank 0, writes to rank 0's output.
    m = re.search(r"rank joiner: done: 12 steps on 4 ranks after 0 shrink\(s\) and 1 grow\(s\); weights (.*)", res[0][1])
    assert m, res[0][1]
    assert re.search(r"rank joiner: joined as rank 3 of 4 at step 8", res[0][1]), res[0][1]
    finals.append([float(v) for v in m.group(1).split()])
    for r, got in enumerate(finals):
        assert got == finals[0], f"rank {r} ended with other weights than rank 0"
        assert all(abs(a - b) < 1e-5 for a, b in zip(got, want)), (r, got, want)


def test_process_group_reconfigured_in_place():
    worker = os.path.join(os.path.dirname(__file__), "workers", "reconfigure_worker.py")
    res = run_ranks_status(3, [worker], timeout=180, env={"NEXAR_ON_FAILURE": "manual", "NEXAR_HEARTBEAT_TIMEOUT": "2s"})
    for r in (0, 2):
        code, out = res[r]
        assert code == 0, f"rank {r} exited {code}:\n{out}"
        assert re.search(rf"rank {r}: reconfigure ok, now rank \d of 2", out), out
    assert res[1][0] == 0, res[1][1]
