"""nexar.Comm with CUDA arrays (DLPack and __cuda_array_interface__)
against the fake CUDA runtime, across processes; workers/
device_buffers_worker.py says what it checks and what it cannot. The fake
is built here; a machine that cannot build it fails the test."""

from launch import run_ranks
from test_torch_cuda_fake import build_fake


def test_device_buffers_against_fake(tmp_path):
    # 3 ranks: the send/recv ring has distinct neighbours.
    fake = build_fake(tmp_path)
    outs = run_ranks(3, ["workers/device_buffers_worker.py"], timeout=240, env={"NEXAR_CUDART": fake})
    for r, out in enumerate(outs):
        assert f"rank {r}: device buffers ok" in out, out
