"""The Python API: single-process calls with world size 1, multi-process runs
with 2, 3 and 4 ranks (tests/workers/api_worker.py), errors, fork detection."""

import array
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nexar
from launch import free_port, run_ranks

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def comm():
    c = nexar.Comm(rank=0, world_size=1, seed=f"127.0.0.1:{free_port()}", token=b"t" * 32, timeout=30)
    yield c
    c.close()


def test_version_and_constants():
    assert nexar.version()[:2] == (0, 1)
    assert int(nexar.SUM) == 0 and int(nexar.BXOR) == 7
    assert nexar.Datatype.BFLOAT16.itemsize == 2


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64,
                                np.float16, np.float32, np.float64])
def test_size1_every_call_numpy(comm, dt):
    x = np.arange(6).astype(dt)
    out = np.zeros_like(x)
    assert comm.allreduce(x, out) is out and np.array_equal(out, x)
    assert np.array_equal(comm.allreduce(x.copy(), op=nexar.MAX), x)
    assert np.array_equal(comm.broadcast(x.copy()), x)
    assert np.array_equal(comm.reduce(x, np.zeros_like(x)), x)
    assert np.array_equal(comm.allgather(x, np.zeros_like(x)), x)
    assert np.array_equal(comm.allgatherv(x, np.zeros_like(x), [6]), x)
    assert np.array_equal(comm.reduce_scatter(x, np.zeros_like(x)), x)
    assert np.array_equal(comm.alltoall(x, np.zeros_like(x)), x)
    assert np.array_equal(comm.alltoallv(x, [6], None, np.zeros_like(x), [6], None), x)
    assert np.array_equal(comm.gather(x, np.zeros_like(x)), x)
    assert np.array_equal(comm.gatherv(x, np.zeros_like(x), [6]), x)
    assert np.array_equal(comm.scatter(x, np.zeros_like(x)), x)
    assert np.array_equal(comm.scatterv(x, [6], None, np.zeros_like(x)), x)
    assert np.array_equal(comm.scan(x, np.zeros_like(x)), x)
    comm.exscan(x, np.zeros_like(x))
    comm.barrier()
    for q in (comm.iallreduce(x.copy()), comm.ibroadcast(x.copy()), comm.ireduce(x.copy()),
              comm.iallgather(x, np.zeros_like(x)), comm.ireduce_scatter(x, np.zeros_like(x)),
              comm.ialltoall(x, np.zeros_like(x)), comm.ibarrier()):
        q.wait()
        assert q.done and q.test()


def test_size1_buffer_protocol_and_torch(comm):
    a = array.array("i", [1, 2, 3])
    comm.allreduce(a)
    b = bytearray(b"abc")
    comm.broadcast(b)
    assert comm.allreduce(memoryview(bytearray(8)).cast("d")) is not None
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.uint8, torch.int8):
        t = torch.arange(12).reshape(3, 4).to(dt)
        col = t[:, 2]  # non-contiguous: staged and copied back
        comm.allreduce(col, op=nexar.SUM)
        assert torch.equal(t, torch.arange(12).reshape(3, 4).to(dt))
    # self send/recv through requests
    src = np.arange(4, dtype=np.float32)
    dst = np.zeros(4, dtype=np.float32)
    q = comm.irecv(dst, 0, tag=3)
    comm.send(src, 0, tag=3)
    st = q.wait()
    assert st == nexar.Status(0, 3, 4, 16) and np.array_equal(dst, src)


def test_size1_errors(comm):
    with pytest.raises(nexar.InvalidArgumentError) as ei:
        comm.broadcast(np.zeros(2), root=5)
    assert ei.value.code == 1 and "root" in ei.value.message
    with pytest.raises(nexar.InvalidArgumentError):
        comm.send(np.zeros(1), 3)
    with pytest.raises(ValueError):
        comm.allreduce(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError):
        comm.allreduce(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float64))
    with pytest.raises(TypeError):
        comm.allreduce(np.zeros(3, dtype=np.int16))  # no nexar int16
    with pytest.raises(ValueError):
        comm.allreduce(b"read-only")
    with pytest.raises(TypeError):
        comm.allreduce(object())
    with pytest.raises(nexar.InvalidArgumentError):
        comm.allreduce(np.zeros(3, dtype=np.float32), op=nexar.BXOR)
    c2 = nexar.Comm(rank=0, world_size=1, seed=f"127.0.0.1:{free_port()}", token=b"u" * 32)
    with c2:
        sub = c2.split(0)
        assert sub.size == 1
        sub.close()
        sub.close()  # idempotent
    with pytest.raises(nexar.ClosedError):
        c2.barrier()
    with pytest.raises(nexar.InvalidArgumentError):
        nexar.Comm(rank=3, world_size=2, seed="127.0.0.1:1", token=b"x")
    assert issubclass(nexar.TimeoutError, TimeoutError)
    assert issubclass(nexar.PeerDownError, nexar.Error)


def test_size1_fast_path_takes_plain_arrays_only(comm):
    # The extension's fast paths take contiguous native arrays and decline
    # (False, nothing done) whatever the general path must check or stage;
    # the public call gives the same result either way.
    from nexar import _nexar as lib

    h = comm._h
    x = np.arange(6, dtype=np.float32)
    out = np.full(6, -1, dtype=np.float32)
    assert lib.allreduce_fast(x, out, 0, h) and np.array_equal(out, x)
    assert lib.allreduce_fast(x, None, 0, h)
    assert lib.broadcast_fast(x, 0, True, h)
    assert lib.allgather_fast(x, out, 1, h) and lib.reduce_scatter_fast(x, out, 0, 1, h)
    assert lib.alltoall_fast(x, out, 1, h)
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    declined = [
        (np.arange(12, dtype=np.float32)[::2], None),       # not contiguous
        (ro, None),                                           # read-only output
        (x, np.zeros(6, dtype=np.float64)),                   # element types differ
        (x, np.zeros(5, dtype=np.float32)),                   # lengths differ
        (np.zeros(3, dtype=np.int16), None),                  # no nexar int16
        (np.zeros(3, dtype=np.bool_), None),                  # mapped by the general path
        (np.zeros(3, dtype=">f4"), None),                     # big-endian
        (torch.zeros(3), None),                               # no buffer protocol
        (object(), None),
    ]
    for s, r in declined:
        before = None if r is None else np.array(r, copy=True)
        assert lib.allreduce_fast(s, r, 0, h) is False, (s, r)
        if r is not None:
            assert np.array_equal(r, before)
    assert lib.allgather_fast(x, np.zeros(7, dtype=np.float32), 1, h) is False
    assert lib.reduce_scatter_fast(x, np.zeros(5, dtype=np.float32), 0, 1, h) is False
    assert lib.broadcast_fast(ro, 0, False, h) is False  # a non-root receives: must be writable
    assert lib.broadcast_fast(ro, 0, True, h)  # the root only sends
    with pytest.raises(nexar.InvalidArgumentError):
        lib.allreduce_fast(x, None, int(nexar.BXOR), h)  # taken, and the C call's error raised


def test_fork_child_raises():
    code = textwrap.dedent(f"""
        import os, sys, nexar
        c = nexar.Comm(rank=0, world_size=1, seed="127.0.0.1:{free_port()}", token=b"f" * 32)
        pid = os.fork()
        if pid == 0:
            try:
                c.barrier()
            except nexar.ForkedProcessError as e:
                os._exit(0 if "fork" in str(e) else 3)
            os._exit(4)
        _, st = os.waitpid(pid, 0)
        c.barrier()
        sys.exit(os.waitstatus_to_exitcode(st))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("n", [2, 3, 4])
def test_multiprocess_every_call(n):
    outs = run_ranks(n, ["workers/api_worker.py"], timeout=240)
    for r, o in enumerate(outs):
        assert f"rank {r}: ok" in o, o


def test_start_seed_reports_the_port_it_got():
    """nexar_seed_start on port 0 binds and reports the port, so the torch
    rendezvous publishes an address nobody else can take in between."""
    from nexar import _comm

    seed = _comm.start_seed("127.0.0.1:0", 2, b"token")
    assert seed is not None, "libnexar has no nexar_seed_start"
    try:
        host, port = seed.addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        import socket

        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with pytest.raises(OSError):
                s.bind(("127.0.0.1", int(port)))  # the seed holds it
        finally:
            s.close()
    finally:
        seed.close()
        seed.close()  # idempotent in Python; the C handle is closed once
    with pytest.raises(nexar.InvalidArgumentError, match="world_size"):
        _comm.start_seed("127.0.0.1:0", 0, b"token")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_nonblocking_every_collective(n):
    outs = run_ranks(n, ["workers/nonblocking_worker.py"], timeout=120)
    for r, o in enumerate(outs):
        assert f"rank {r}: nonblocking ok" in o, o


def test_failure_notification():
    outs = run_ranks(3, ["workers/failure_worker.py"], timeout=120)
    for r in (0, 1):
        assert f"rank {r}: failures ok" in outs[r], outs[r]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_rpc(n):
    outs = run_ranks(n, ["workers/rpc_worker.py"], timeout=120)
    for r, o in enumerate(outs):
        assert f"rank {r}: rpc ok" in o, o


def test_rpc_peer_down():
    outs = run_ranks(2, ["workers/rpc_down_worker.py"], timeout=120)
    assert "rank 0: rpc down ok" in outs[0], outs[0]


def test_rpc_example():
    example = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python", "rpc.py")
    outs = run_ranks(3, [os.path.abspath(example)], timeout=120)
    assert "rank 2: 4 squared is 16" in outs[0], outs[0]


def test_recover():
    outs = run_ranks(4, ["workers/recover_worker.py"], timeout=180, env={"NEXAR_ON_FAILURE": "manual"})
    for r in (0, 1):
        assert f"rank {r}: recover ok" in outs[r], outs[r]


def test_stats_size1():
    # A fresh communicator: the module's shared one has moved bytes in
    # earlier tests.
    c = nexar.Comm(rank=0, world_size=1, seed=f"127.0.0.1:{free_port()}", token=b"t" * 32, timeout=30)
    try:
        s = c.stats()
        assert set(s) == {"bytes_buffered", "scratch_bytes", "ring_bytes", "relayed_bytes",
                          "messages_sent", "bytes_sent", "bytes_received"}
        assert s["relayed_bytes"] == 0 and s["bytes_sent"] == 0 and s["ring_bytes"] == 0
        assert all(isinstance(v, int) and v >= 0 for v in s.values())
    finally:
        c.close()


@pytest.mark.parametrize("profile", ["default", "inference"])
def test_stats_multiprocess(profile):
    outs = run_ranks(2, ["workers/stats_worker.py", profile], timeout=120,
                     env={"NEXAR_MEMORY_PROFILE": profile})
    for r, o in enumerate(outs):
        assert f"rank {r}: stats ok" in o, o
