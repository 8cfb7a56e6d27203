"""Training frameworks over the "nexar" backend: PyTorch Lightning
(DDPStrategy(process_group_backend="nexar")) and Hugging Face Accelerate
train a small model on CPU for a few steps and end with the same parameters
as over gloo (issue 16, point 3)."""

import os
import re
import subprocess
import sys
import tempfile

import pytest

from launch import HERE, run_ranks

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
pytest.importorskip("accelerate")

WORKER = os.path.join(HERE, "workers", "frameworks_worker.py")
# The launcher's variables would make Lightning think it runs under one.
_DROP = re.compile(r"^(NEXAR_|RANK$|LOCAL_RANK$|WORLD_SIZE$|LOCAL_WORLD_SIZE$|MASTER_ADDR$|MASTER_PORT$|GROUP_RANK$|"
                   r"TORCHELASTIC_|SLURM_|OMPI_|PMI_)")


def _clean_env():
    e = {k: v for k, v in os.environ.items() if not _DROP.match(k)}
    e.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    return e


def _lightning(backend, out):
    # Lightning starts rank 1 itself, re-running this command.
    p = subprocess.run([sys.executable, WORKER, "lightning", backend, out], env=_clean_env(), cwd=HERE,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-6000:]
    for r in range(2):
        assert f"rank {r}: lightning over {backend} ok" in p.stdout, p.stdout[-6000:]


def _accelerate(backend, out):
    outs = run_ranks(2, [WORKER, "accelerate", backend, out], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: accelerate over {backend} ok" in o, o


@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_framework_matches_gloo(framework):
    run = {"lightning": _lightning, "accelerate": _accelerate}[framework]
    with tempfile.TemporaryDirectory() as d:
        got = {}
        for backend in ("gloo", "nexar"):
            out = os.path.join(d, f"{backend}.pt")
            run(backend, out)
            got[backend] = torch.load(out)
    init = {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert set(got["nexar"]) == set(got["gloo"]) == init
    for k in sorted(init):
        a, b = got["nexar"][k], got["gloo"][k]
        assert torch.equal(a, b), f"{framework}: {k} differs from gloo's by up to {(a - b).abs().max().item():g}"
    # Training moved the parameters: a run that did nothing would also match.
    torch.manual_seed(0)
    first = torch.nn.Linear(8, 16)
    assert not torch.equal(got["nexar"]["0.weight"], first.weight.detach())
