"""The torch backend's CUDA code path against the fake CUDA runtime
(workers/cuda_fake_worker.py says what that proves and what not). The fake
is built here; a machine that cannot build it fails the test: it is the
only check of this path without a GPU."""

import os
import subprocess

from launch import run_ranks

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def build_fake(tmp_path, name="cudart", libs=()) -> str:
    """Compile tests/fakes/<name>/src/fake_<name>.c into tmp_path."""
    out = str(tmp_path / f"libfake{name}.so")
    src = os.path.join(ROOT, "tests", "fakes", name, "src", f"fake_{name}.c")
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O2", "-shared", "-fPIC", "-o", out, src, "-lpthread",
                    *libs], check=True)
    return out


def test_torch_cuda_path_against_fake(tmp_path):
    # 3 ranks: the send/recv ring has distinct neighbours.
    fake = build_fake(tmp_path)
    # The fake's timeline (NEXAR_FAKE_CUDA_TIMELINE) shows DDP's and FSDP2's
    # communication overlapping their compute.
    outs = run_ranks(3, ["workers/cuda_fake_worker.py"], timeout=300, torchrun_env=True,
                     env={"NEXAR_CUDART": fake, "NEXAR_FAKE_CUDA_TIMELINE": "200000"})
    for r, out in enumerate(outs):
        assert f"rank {r}: cuda fake ok" in out, out


def test_torch_cuda_path_through_nccl_hier(tmp_path):
    # 4 ranks on two simulated hosts, 3+1 out of rank order: the backend's
    # CUDA collectives go through the fake NCCL within a host and nexar
    # between hosts (NEXAR_NCCL_HIER=on: no silent fallback to staging).
    fake = build_fake(tmp_path)
    nccl = build_fake(tmp_path, "nccl", ("-ldl", "-lrt"))
    outs = run_ranks(4, ["workers/cuda_fake_worker.py"], timeout=300, torchrun_env=True,
                     env={"NEXAR_CUDART": fake, "NEXAR_NCCL": nccl, "NEXAR_NCCL_HIER": "on",
                          "HIER_HOSTS": "A,B,A,A"})
    for r, out in enumerate(outs):
        assert f"rank {r}: cuda fake ok" in out, out
