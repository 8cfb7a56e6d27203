"""torchft support (issue 32, item 3).

- A nexar.torch group made without a store (as torchft makes its groups,
  before any quorum) fails every call naming configure(); configure() with
  torchft 0.2.0's arguments, then torch 2.15's reconfigure() with ordered
  and unordered handles, rebuild it in place; errored() and get_error()
  report the failure after a member dies. 2 processes; no torchft needed.
- nexar.torchft.ProcessGroupNexar: a routine abort (errored=False) logs no
  warning on either side and the group configures again.
- torchft's own training loop (examples/python/torchft_train.py: Manager,
  its DDP and Optimizer wrappers) with a lighthouse and 2 replica groups:
  group 1 is SIGKILLed mid-step, the survivor keeps committing steps alone,
  group 1 is restarted, heals from the survivor, and both end at the same
  step with equal weights; no nexar warning but the dead peer's.

Run as a script, this file is the workers of the first two tests.
"""

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_ranks_status  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.abspath(os.path.join(HERE, "..", "..", "..", "examples", "python", "torchft_train.py"))
NO_TORCHFT = "torchft is not installed (requirements-dev.txt pins torchft==0.2.0: make deps installs it)"


def _need_torchft():
    if importlib.util.find_spec("torchft") is None:
        pytest.skip(NO_TORCHFT)


# ---- workers -----------------------------------------------------------------
def _store(me):
    import torch.distributed as dist
    from datetime import timedelta

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    st = dist.TCPStore(addr, port, is_master=(me == 0), wait_for_workers=False, timeout=timedelta(seconds=60))
    return st, f"{addr}:{port}"


def _sum(pg, v):
    t = torch.tensor([float(v)])
    pg.allreduce([t]).wait()
    return t.item()


def pg_worker():
    from datetime import timedelta

    import torch.distributed as dist
    from torch._C._distributed_c10d import ErrorType, ReconfigureOptions

    import nexar
    from nexar.torch import ProcessGroupNexar

    me = int(os.environ["RANK"])
    pg = ProcessGroupNexar(timeout=timedelta(seconds=60))  # no store: no rendezvous
    assert pg.errored() is None and pg.get_error() == ErrorType.SUCCESS
    assert pg.supports_reconfigure
    with pytest.raises(nexar.UnavailableError, match=r"configure\(store_addr"):
        _sum(pg, 1)
    with pytest.raises(nexar.UnavailableError):
        pg.barrier().wait()

    st, where = _store(me)
    # torchft 0.2.0's call: store_addr, replica_id, rank, world_size,
    # quorum_id, group_rank, group_world_size, global_ranks
    pg.configure(f"{where}/torchft/1/0", "replica", me, 2, 1, 0, 1, [0, 1])
    assert (pg.rank(), pg.size()) == (me, 2)
    assert _sum(pg, me + 1) == 3.0
    assert pg.errored() is None

    # torch 2.15's reconfigure: handles exchanged out of band (here the
    # store), in a list that reverses the ranks
    mine = pg.get_reconfigure_handle()
    assert pg.get_reconfigure_handle() == mine
    st.set(f"handle/{me}", mine)
    st.wait(["handle/0", "handle/1"])
    handles = [st.get("handle/1").decode(), st.get("handle/0").decode()]
    opts = ReconfigureOptions()
    opts.uuid, opts.handles, opts.timeout = 11, handles, timedelta(seconds=60)
    assert pg.reconfigure(opts).wait()
    assert (pg.rank(), pg.size()) == (1 - me, 2)
    t = torch.tensor([float(me)])
    pg.broadcast([t], dist.BroadcastOptions()).wait()
    assert t.item() == 1.0, t  # from the new rank 0: old rank 1
    # a set: ranks in sorted order, the same everywhere
    opts.uuid, opts.handles = 12, set(handles)
    pg.reconfigure(opts).wait()
    assert pg.rank() == sorted(handles).index(mine)
    assert _sum(pg, pg.rank() + 1) == 3.0
    opts.uuid, opts.handles = 13, ['{"id": "x", "store": "127.0.0.1:1"}']
    with pytest.raises(ValueError, match="not among"):
        pg.reconfigure(opts)

    pg.barrier().wait()
    if me == 1:
        sys.stdout.flush()
        os._exit(0)
    with pytest.raises((RuntimeError, nexar.Error)):
        for _ in range(3000):
            _sum(pg, 1)
            time.sleep(0.01)
    err = pg.errored()
    assert isinstance(err, nexar.PeerDownError), repr(err)
    assert pg.get_error() == ErrorType.REMOTE_ERROR
    pg.shutdown()
    assert pg.errored() is None
    print(f"rank {me}: pg ok", flush=True)


def ft_abort_worker():
    from datetime import timedelta

    from nexar.torchft import ProcessGroupNexar

    me = int(os.environ["RANK"])
    pg = ProcessGroupNexar(timeout=timedelta(seconds=60))
    assert pg.getBackendName() == "torchft-nexar" and pg.errored() is None
    st, where = _store(me)
    pg.configure(f"{where}/q/1", "replica", me, 2, 1, 0, 1, [0, 1])
    assert _sum(pg, me + 1) == 3.0
    st.set(f"a{me}", "1")
    st.wait(["a0", "a1"])
    pg.abort(errored=False)  # torchft's routine abort before a new quorum
    pg.configure(f"{where}/q/2", "replica", 1 - me, 2, 2, 0, 1, [1, 0])
    assert pg.rank() == 1 - me and _sum(pg, pg.rank() + 1) == 3.0
    st.set(f"b{me}", "1")
    st.wait(["b0", "b1"])
    time.sleep(1)  # a goodbye's effects, if any, would show by now
    pg.shutdown()
    print(f"rank {me}: ft abort ok", flush=True)


# ---- tests -------------------------------------------------------------------
def test_group_without_store_configures_and_reconfigures():
    res = run_ranks_status(2, [os.path.abspath(__file__), "pg-worker"], timeout=180,
                           env={"NEXAR_HEARTBEAT_TIMEOUT": "2s"})
    code, out = res[0]
    assert code == 0 and "rank 0: pg ok" in out, f"rank 0 exited {code}:\n{out}"
    assert res[1][0] == 0, res[1][1]


def test_routine_abort_logs_no_warning():
    _need_torchft()
    res = run_ranks_status(2, [os.path.abspath(__file__), "ft-abort-worker"], timeout=180)
    for r, (code, out) in enumerate(res):
        assert code == 0 and f"rank {r}: ft abort ok" in out, f"rank {r} exited {code}:\n{out}"
        assert "WARN" not in out, f"rank {r} logged a warning on a routine abort:\n{out}"


def _log_steps(path, rid):
    """(step, participants) of each step replica rid reported."""
    pat = re.compile(rf"^replica {rid} step (\d+) participants (\d+) ")
    with open(path) as f:
        return [(int(m.group(1)), int(m.group(2))) for m in map(pat.match, f) if m]


def _wait(cond, deadline, what, procs):
    while not cond():
        for p in procs:
            assert p.poll() is None, f"{what}: a replica exited early ({p.args})"
        assert time.monotonic() < deadline, f"{what}: timed out"
        time.sleep(0.1)


def test_torchft_training_survives_a_kill_and_heals(tmp_path):
    _need_torchft()
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000)
    logs = [str(tmp_path / f"replica{r}.log") for r in range(2)]
    outs = [str(tmp_path / f"replica{r}.pt") for r in range(2)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")

    def start(r):
        with open(logs[r], "a") as f:
            return subprocess.Popen([sys.executable, EXAMPLE, "replica", "--id", str(r), "--lighthouse",
                                     lighthouse.address(), "--steps", "12", "--step-sleep", "0.2",
                                     "--out", outs[r]], stdout=f, stderr=subprocess.STDOUT, env=env)

    procs = [start(0), start(1)]
    deadline = time.monotonic() + 900  # generous: a loaded 2-core machine starts torch slowly
    try:
        # Both groups step together for a while, then group 1 dies mid-step
        # (it sleeps between backward and the optimizer's step).
        _wait(lambda: sum(n == 2 for _, n in _log_steps(logs[1], 1)) >= 3, deadline, "lockstep", procs)
        procs[1].send_signal(signal.SIGKILL)
        assert procs[1].wait() == -signal.SIGKILL
        with open(logs[1], "a") as f:
            f.write("=== killed ===\n")
        before = _log_steps(logs[0], 0)[-1][0]
        # The survivor keeps committing steps alone.
        _wait(lambda: sum(s > before and n == 1 for s, n in _log_steps(logs[0], 0)) >= 3, deadline,
              "survivor alone", procs[:1])
        alone = [s for s, n in _log_steps(logs[0], 0) if s > before and n == 1]
        procs[1] = start(1)
        for r, p in enumerate(procs):
            try:
                code = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGUSR1)  # the example dumps its threads' stacks
                time.sleep(3)
                code = "nothing (still running at the deadline)"
            assert code == 0, f"replica {r} exited {code}:\n" + open(logs[r]).read()[-8000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        lighthouse.shutdown()

    text = [open(p).read() for p in logs]
    assert len(alone) >= 3 and alone == sorted(set(alone)), alone
    restarted = text[1].split("=== killed ===", 1)[1]
    assert "healing is required" in restarted, restarted[-4000:]
    final = [torch.load(o) for o in outs]
    assert final[0]["step"] == final[1]["step"] > max(alone), (final[0]["step"], final[1]["step"], alone)
    for a, b in zip(final[0]["params"], final[1]["params"]):
        assert torch.equal(a, b), "the replica groups ended with different weights"
    # torchft's quorum changes close the old group gracefully: the only
    # nexar warnings are the survivor's about the killed group.
    assert "WARN" not in text[1], text[1][-4000:]
    for line in text[0].splitlines():
        if "WARN" in line:
            assert "nexar:" in line and ("peer=1" in line or "rank 1 " in line), line
    assert "aborted" not in text[0] + restarted


if __name__ == "__main__":
    {"pg-worker": pg_worker, "ft-abort-worker": ft_abort_worker}[sys.argv[1]]()
