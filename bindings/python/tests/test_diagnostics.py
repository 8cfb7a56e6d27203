"""Diagnostics from Python: Comm.flight_record / dump_flight_record, and a
job where one rank skips a collective, read back by `nexar diagnose`."""

import json
import os
import subprocess
import tempfile

import numpy as np
import pytest

import nexar
from launch import free_port, run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
NEXAR_CLI = os.path.join(HERE, "..", "..", "..", "build", "nexar")


def test_flight_record_size1(tmp_path):
    c = nexar.Comm(rank=0, world_size=1, seed=f"127.0.0.1:{free_port()}", token=b"t" * 32, timeout=30)
    try:
        c.allreduce(np.arange(4, dtype=np.float64))
        c.barrier()
        rec = c.flight_record()
        assert rec["rank"] == 0 and rec["size"] == 1 and rec["next_seq"] == 2, rec
        ops = [(e["op"], e["seq"], e["bytes"], e.get("dtype", ""), e["state"]) for e in rec["entries"]]
        assert ops == [("allreduce", 0, 32, "float64", "completed"), ("barrier", 1, 0, "", "completed")], ops
        p = tmp_path / "rec.json"
        c.dump_flight_record(p)
        assert json.loads(p.read_text())["entries"][-1]["op"] == "barrier"
        with pytest.raises(ValueError):
            c.dump_flight_record("")
        with pytest.raises(nexar.Error, match="nexar_comm_dump_flight_record"):
            c.dump_flight_record(tmp_path / "no" / "such" / "dir.json")
    finally:
        c.close()
    with pytest.raises(nexar.ClosedError):
        c.dump_flight_record(tmp_path / "closed.json")


def test_skipped_call_is_named():
    if not os.path.exists(NEXAR_CLI):
        pytest.skip("build/nexar not built (make cli)")
    with tempfile.TemporaryDirectory() as d:
        outs = run_ranks(3, ["workers/flight_worker.py"], timeout=180,
                         env={"NEXAR_FLIGHT_RECORDER_DIR": d, "NEXAR_TIMEOUT": "3s"})
        for r in range(2):
            assert f"rank {r}: flight ok" in outs[r], outs[r]
        assert "rank 2: skipped the allreduce" in outs[2], outs[2]
        rep = subprocess.run([NEXAR_CLI, "diagnose", d], capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert "rank 2 never called collective #2 allreduce(float32, count=2, sum)" in rep.stdout, rep.stdout
    assert "rank 0 never" not in rep.stdout and "rank 1 never" not in rep.stdout, rep.stdout
