"""The torch backend's CUDA code path against the fake CUDA runtime
(workers/cuda_fake_worker.py says what that proves and what not). The fake
is built here; a machine that cannot build it fails the test: it is the
only check of this path without a GPU."""

import os
import subprocess

from launch import run_ranks

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def build_fake(tmp_path) -> str:
    out = str(tmp_path / "libfakecudart.so")
    src = os.path.join(ROOT, "tests", "fakes", "cudart", "src", "fake_cudart.c")
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O2", "-shared", "-fPIC", "-o", out, src, "-lpthread"],
                   check=True)
    return out


def test_torch_cuda_path_against_fake(tmp_path):
    # 3 ranks: the send/recv ring has distinct neighbours.
    fake = build_fake(tmp_path)
    outs = run_ranks(3, ["workers/cuda_fake_worker.py"], timeout=240, torchrun_env=True,
                     env={"NEXAR_CUDART": fake})
    for r, out in enumerate(outs):
        assert f"rank {r}: cuda fake ok" in out, out
