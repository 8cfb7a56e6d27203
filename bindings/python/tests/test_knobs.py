"""The knob table (core/knobs.go) reaches every Python entry point: an
explicit nexar.Comm(...) and the torch backend take NEXAR_TOPOLOGY,
NEXAR_BULK, NEXAR_BULK_PLAINTEXT, NEXAR_TIMEOUT and NEXAR_SCHEDULES from the
environment, torch's pg_options beat it, and a value that does not parse is
an error naming the variable, on each. Observed on the communicator (its
paths, a receive that times out, a mismatch), never through a config
object."""

import os
import sys

import pytest

from launch import run_ranks, run_ranks_status

HERE = os.path.dirname(os.path.abspath(__file__))

KNOBS = {"NEXAR_TOPOLOGY": "kregular:2", "NEXAR_BULK": "tcp", "NEXAR_BULK_PLAINTEXT": "1", "NEXAR_TIMEOUT": "3s"}


def test_explicit_comm_takes_the_environment(tmp_path):
    outs = run_ranks(4, ["workers/knobs_worker.py", "comm", str(tmp_path / "done")], env=KNOBS, timeout=240)
    assert all("ok" in o for o in outs), outs
    assert "relay via" in outs[0] and "plaintext" in outs[0], outs[0]


def test_explicit_comm_schedules_must_agree():
    outs = run_ranks(4, ["workers/knobs_worker.py", "mismatch-comm"], env={"NEXAR_TOPOLOGY": "kregular:2"}, timeout=240)
    assert all("mismatch as expected" in o for o in outs), outs


def test_torch_takes_the_environment(tmp_path):
    pytest.importorskip("torch")
    outs = run_ranks(4, ["workers/knobs_worker.py", "torch-env", str(tmp_path / "done")], env=KNOBS,
                     timeout=300, torchrun_env=True)
    assert all("ok" in o for o in outs), outs


def test_torch_pg_options_beat_the_environment(tmp_path):
    pytest.importorskip("torch")
    # The environment asks for shared memory and a full mesh; pg_options
    # (kregular:2, tcp, plaintext) win. The timeout still comes from the
    # environment: the options do not set one.
    env = {"NEXAR_TOPOLOGY": "full", "NEXAR_BULK": "shm", "NEXAR_TIMEOUT": "3s"}
    outs = run_ranks(4, ["workers/knobs_worker.py", "torch-opts", str(tmp_path / "done")], env=env,
                     timeout=300, torchrun_env=True)
    assert all("ok" in o for o in outs), outs


@pytest.mark.parametrize("entry", ["comm", "torch"])
def test_bad_value_names_the_variable(entry):
    if entry == "torch":
        pytest.importorskip("torch")
        code = ("import torch.distributed as dist, nexar.torch; "
                "dist.init_process_group('nexar', rank=0, world_size=1)")
    else:
        code = "import nexar; nexar.Comm(rank=0, world_size=1)"
    res = run_ranks_status(1, ["-c", code], env={"NEXAR_BULK": "infiniband", "NEXAR_WORLD_SIZE": "1"}, timeout=120)
    rc, out = res[0]
    assert rc not in (0, None), out
    assert "NEXAR_BULK" in out and "auto, tcp, shm, rdma or off" in out, out


def test_explicit_knob_beats_environment_and_bad_one_names_the_argument():
    code = """
import nexar
c = nexar.Comm(rank=0, world_size=1, topology="hypercube")
assert c.paths() == {0: "loopback"}, c.paths()
c.close()
try:
    nexar.Comm(rank=0, world_size=1, topology="ring")
except nexar.InvalidArgumentError as e:
    assert "config->topology" in str(e) and "kregular:K" in str(e), e
    print("named:", e)
else:
    raise SystemExit("a bad topology was accepted")
"""
    res = run_ranks_status(1, ["-c", code], env={"NEXAR_TOPOLOGY": "kregular:4", "NEXAR_WORLD_SIZE": "1"}, timeout=120)
    rc, out = res[0]
    assert rc == 0 and "named:" in out, out


def test_options_reject_unknown_knobs():
    pytest.importorskip("torch")
    import nexar.torch

    with pytest.raises(TypeError, match="topolgy"):
        nexar.torch.Options(topolgy="kregular:2")
    assert "bulk='tcp'" in repr(nexar.torch.Options(bulk="tcp"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
