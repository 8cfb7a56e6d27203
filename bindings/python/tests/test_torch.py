"""torch.distributed backend "nexar": every collective against gloo in the
same run (2 and 4 processes), DDP and FSDP parity, init methods."""

import os
import subprocess
import sys
import tempfile
import warnings

import pytest

from launch import run_ranks, run_ranks_status

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_match_gloo(n):
    outs = run_ranks(n, ["workers/torch_worker.py", "collectives"], timeout=400, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: collectives ok" in o, o


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_gloo(n):
    outs = run_ranks(n, ["workers/torch_worker.py", "ddp"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: ddp ok" in o, o


def test_fsdp_matches_gloo():
    outs = run_ranks(2, ["workers/torch_worker.py", "fsdp"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: fsdp ok" in o, o


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(method):
    with tempfile.TemporaryDirectory() as d:
        env = {"NEXAR_TEST_FILE": os.path.join(d, "store")}
        outs = run_ranks(2, ["workers/torch_worker.py", f"init:{method}"], timeout=180,
                         torchrun_env=True, env=env)
    for r, o in enumerate(outs):
        assert f"rank {r}: init {method} ok" in o, o


def test_entry_point_registers_without_import():
    code = ("import torch, torch.distributed as dist, sys;"
            "sys.exit(0 if 'NEXAR' in dist.Backend._plugins else 3)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # importing torch must not load libnexar (the Go runtime) by itself
    code = ("import torch, torch.distributed, sys;"
            "sys.exit(0 if 'nexar._nexar' not in sys.modules else 4)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_torchrun_launch():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed next to the interpreter")
    here = os.path.dirname(os.path.abspath(__file__))
    ex = os.path.join(here, "..", "..", "..", "examples", "python", "ddp_train.py")
    if not os.path.exists(ex):
        pytest.skip("examples/python/ddp_train.py missing")
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", ex, "--steps", "5"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]



@pytest.mark.parametrize("what", ["ddp", "ddp+exit", "fsdp", "fsdp2", "wait", "future"])
def test_peer_death_raises(what):
    """The last rank SIGKILLs itself mid-run; the survivor gets a Python
    exception naming it within seconds and exits normally (no SIGSEGV:
    DDP's reducer used to crash on a Future marked failed only in Python)."""
    with tempfile.TemporaryDirectory() as d:
        env = {"NEXAR_TEST_FILE": os.path.join(d, "killed_at")}
        res = run_ranks_status(2, ["workers/torch_worker.py", f"peerdeath:{what}"], timeout=120, env=env)
    (rc0, out0), (rc1, _) = res
    assert rc1 == -9, f"the victim was not killed (rc={rc1})"
    assert rc0 == 0, f"survivor rc={rc0}:\n{out0[-6000:]}"
    assert f"rank 0: peer death {what} ok" in out0, out0[-6000:]
    line = next(x for x in out0.splitlines() if "s after the kill" in x)
    secs = float(line.split(", ")[1].split(" s after")[0])
    # the heartbeat timeout is 3 s; 15 s leaves room for a loaded machine
    assert secs < 15, line


def test_failed_work_fails_its_future_for_cpp():
    """A failed NexarWork's Future is failed for torch's C++ readers too
    (DDP's reducer, collect_all), not a success holding the exception; any
    BaseException completes it."""
    import nexar
    from nexar.torch._work import NexarWork

    w = NexarWork([torch.ones(2)], "allreduce")
    w._complete(nexar.PeerDownError(4, "nexar_allreduce: rank 1 is unreachable"))
    # torch's Work over a Future reads the C++ future's state: it used to
    # report success here.
    from torch._C._distributed_c10d import _create_work_from_future

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # is_success() is deprecated
        assert not _create_work_from_future(w.get_future()).is_success()
    with pytest.raises(RuntimeError, match="PeerDownError: nexar_allreduce: rank 1 is unreachable"):
        torch.futures.collect_all([w.get_future()]).wait()
    with pytest.raises(RuntimeError, match="rank 1 is unreachable"):
        w.get_future().wait()
    with pytest.raises(nexar.PeerDownError):
        w.wait()
    assert w.is_completed() and not w.is_success()

    w = NexarWork([], "barrier")
    w._complete(KeyboardInterrupt())
    assert w.get_future().done()
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        w.get_future().wait()

    w = NexarWork([torch.ones(2)], "allreduce")
    w._complete()
    assert torch.equal(torch.futures.collect_all([w.get_future()]).wait()[0].wait()[0], torch.ones(2))


def test_backend_uses_only_public_comm_api():
    """nexar.torch goes through nexar.Comm's declared API (Comm.raw,
    Comm.check, start_seed), never into its underscored attributes or the
    extension module."""
    import re

    import nexar.torch

    d = os.path.dirname(nexar.torch.__file__)
    bad = re.compile(r"_comm\._[A-Za-z]|\b_nexar\b|\._lib\b|\._pid\b|\._check\(")
    hits = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".py"):
            with open(os.path.join(d, name)) as f:
                for i, line in enumerate(f, 1):
                    if bad.search(line):
                        hits.append(f"{name}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_raw_entry_points_and_staging():
    """Comm.raw with staged tensors (one rank): a reduction through int32,
    a non-contiguous receive written back, the Status of a raw receive."""
    import nexar
    from nexar.torch._staging import BYTE, Reduction, Staged, offsets, op_of

    assert offsets([3, 0, 5]) == ([0, 3, 3], 8)
    with nexar.Comm(rank=0, world_size=1) as c:
        raw = c.raw
        t = torch.arange(6, dtype=torch.int16)
        r = Reduction(t, *op_of(None))
        raw.allreduce(r.addr, r.addr, r.count, r.dt, r.op)
        r.s.back()
        assert torch.equal(t, torch.arange(6, dtype=torch.int16))
        src = torch.arange(4, dtype=torch.float32)
        dst = torch.zeros(4, 2)[:, 0]  # not contiguous: staged, then written back
        s_in, s_out = Staged(src, writable=False), Staged(dst)
        q = raw.irecv(s_out.addr, s_out.nbytes, BYTE, 0, 7, s_out)
        raw.send(s_in.addr, s_in.nbytes, BYTE, 0, 7)
        st = q.wait()
        assert (st.source, st.tag, st.nbytes) == (0, 7, 16)
        assert torch.equal(dst, src)
    with pytest.raises(nexar.ClosedError):
        c.check()
    with pytest.raises(nexar.ClosedError):
        raw.barrier()


@pytest.mark.parametrize("n", [2, 3])
def test_fast_paths(n):
    outs = run_ranks(n, ["workers/fastpath_worker.py"], timeout=300, torchrun_env=True)
    for r, o in enumerate(outs):
        assert f"rank {r}: fastpath ok" in o, o


def test_c_method_and_fallbacks():
    """One rank: all_reduce and broadcast of one plain CPU tensor run in the
    group's C methods (no Work for a synchronous call done); everything
    they do not take reaches the general methods, with right results."""
    import nexar
    import torch.distributed as dist
    from nexar.torch._pg import ProcessGroupNexar
    from nexar.torch._work import StartedWork

    pg = ProcessGroupNexar(dist.HashStore(), 0, 1)
    general = []
    for name in ("_allreduce_general", "_broadcast_general"):
        orig = getattr(ProcessGroupNexar, name)
        setattr(pg, name, lambda ts, opts=None, orig=orig, name=name: (general.append(name), orig(pg, ts, opts))[1])
    try:
        assert type(pg.allreduce).__name__ == "TorchCall", type(pg.allreduce)
        sync = dist.AllreduceOptions()
        sync.asyncOp = False
        t = torch.arange(6, dtype=torch.float32)
        assert pg.allreduce([t], sync) is None and torch.equal(t, torch.arange(6, dtype=torch.float32))
        b = torch.arange(3, dtype=torch.float32).to(torch.complex64)
        bo = dist.BroadcastOptions()
        bo.asyncOp = False
        assert pg.broadcast([b], bo) is None  # any dtype is bytes to a broadcast
        w = pg.allreduce([t])  # no options: asynchronous, started in the library
        assert isinstance(w, StartedWork) and w.wait() and torch.equal(t, torch.arange(6, dtype=torch.float32))
        assert general == []

        def general_gets(call, name):
            general.clear()
            w = call()
            if w is not None:
                w.wait()
            assert general == [name], (general, name)

        x = torch.arange(8, dtype=torch.float32)
        general_gets(lambda: pg.allreduce([x[::2]], sync), "_allreduce_general")  # not contiguous
        assert torch.equal(x, torch.arange(8, dtype=torch.float32))
        general_gets(lambda: pg.allreduce([torch.tensor([True, False])], sync), "_allreduce_general")  # staged
        general_gets(lambda: pg.allreduce([torch.ones(3, dtype=torch.int16)], sync), "_allreduce_general")
        avg = dist.AllreduceOptions()
        avg.reduceOp, avg.asyncOp = dist.ReduceOp.AVG, False
        with pytest.raises(ValueError, match="AVG needs a floating-point tensor"):  # the general method's error
            general_gets(lambda: pg.allreduce([torch.ones(3, dtype=torch.int32)], avg), "_allreduce_general")
        assert general == ["_allreduce_general"]
        general_gets(lambda: pg.allreduce([torch.ones(2), torch.ones(3)], sync), "_allreduce_general")
        general_gets(lambda: pg.allreduce([torch.ones(2)], opts=sync), "_allreduce_general")  # keyword
        general_gets(lambda: pg.broadcast([x[1::2]], bo), "_broadcast_general")
        mx = dist.AllreduceOptions()
        mx.reduceOp, mx.asyncOp = dist.ReduceOp.MAX, False
        general.clear()
        y = torch.tensor([3.0, -1.0])
        assert pg.allreduce([y], mx) is None and general == [] and torch.equal(y, torch.tensor([3.0, -1.0]))
        # The gate: while a batch is coalesced, the general method queues it.
        pg._start_coalescing()
        general.clear()
        w = pg.allreduce([torch.ones(2)], sync)
        assert general == ["_allreduce_general"] and w is not None
        pg._end_coalescing().wait()
        general.clear()
        assert pg.allreduce([torch.ones(2)], sync) is None and general == []
    finally:
        pg.shutdown()
    with pytest.raises(nexar.ClosedError):
        pg.allreduce([torch.ones(2)], sync)  # shut down: the general method refuses


def test_c_method_holds_its_group_weakly():
    """The group's C methods (group attributes) do not keep it alive; one
    kept after its group is gone raises a clear error."""
    import gc
    import weakref

    import torch.distributed as dist
    from nexar.torch._pg import ProcessGroupNexar

    pg = ProcessGroupNexar(dist.HashStore(), 0, 1)
    method = pg.allreduce
    pg.shutdown()
    ref = weakref.ref(pg)
    del pg
    gc.collect()
    assert ref() is None, "the group's C method keeps its group alive"
    with pytest.raises(RuntimeError, match="process group of this method is gone"):
        method([torch.ones(2)], None)


def _anon_huge_kib(addr: int, size: int) -> int:
    """KiB of [addr, addr+size) on transparent huge pages. Page by page
    where this process may read page frames (root: /proc/self/pagemap and
    /proc/kpageflags); otherwise AnonHugePages of every mapping over the
    range, which counts a neighbour's huge pages too when the kernel has
    merged its mapping with this one (two tensors allocated one after the
    other often share one)."""
    exact = _thp_kib(addr, size)
    if exact is not None:
        return exact
    import re

    total = 0
    with open("/proc/self/smaps") as f:
        text = f.read()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split()[0].split("-"))
        if lo < addr + size and hi > addr:
            total += sum(int(line.split()[1]) for line in block.splitlines() if line.startswith("AnonHugePages:"))
    return total


def _thp_kib(addr: int, size: int):
    """KiB of [addr, addr+size) whose page frames are transparent huge
    pages (kpageflags' THP bit), or None where page frames cannot be read
    (not root: pagemap shows them as 0)."""
    import struct

    page = os.sysconf("SC_PAGE_SIZE")
    first, last = addr // page, (addr + size - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            pm.seek(first * 8)
            entries = struct.unpack(f"<{last - first + 1}Q", pm.read((last - first + 1) * 8))
            thp = 0
            for e in entries:
                if not e >> 63 & 1:
                    continue  # not present
                pfn = e & ((1 << 55) - 1)
                if pfn == 0:
                    return None
                kf.seek(pfn * 8)
                if struct.unpack("<Q", kf.read(8))[0] >> 22 & 1:  # KPF_THP
                    thp += 1
            return thp * page // 1024
    except OSError:
        return None


def _collapse_works() -> bool:
    """Whether this kernel moves anonymous memory onto huge pages on
    MADV_COLLAPSE (Linux 6.1+, THP not disabled, a huge page free)."""
    import ctypes
    import mmap

    size = 4 << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        for i in range(0, size, 4096):
            m[i] = 1
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        lo = (addr + (2 << 20) - 1) & ~((2 << 20) - 1)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(2 << 20), 25)  # MADV_COLLAPSE
        return _anon_huge_kib(lo, 2 << 20) >= 2048
    except (OSError, ValueError):
        return False
    finally:
        try:
            m.close()
        except BufferError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
@pytest.mark.parametrize("off", [False, True])
def test_reused_large_tensor_moves_to_huge_pages(off):
    """A tensor of 4 MiB or more that a group all_reduces a second time is
    moved onto transparent huge pages (its contents unchanged); a tensor
    used once is not; NEXAR_TORCH_HUGEPAGE_MIN=0 turns it off. One rank,
    in a child process (the setting is read on import)."""
    if not _collapse_works():
        pytest.skip("MADV_COLLAPSE does not move memory onto huge pages here (kernel < 6.1, THP off, or none free)")
    code = r"""
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from test_torch import _anon_huge_kib
from nexar.torch._pg import ProcessGroupNexar
pg = ProcessGroupNexar(dist.HashStore(), 0, 1)
o = dist.AllreduceOptions()
o.asyncOp = False
n = (16 << 20) // 4
t = torch.arange(n, dtype=torch.float32)
once = torch.arange(n, dtype=torch.float32)
assert _anon_huge_kib(t.data_ptr(), 16 << 20) == 0
pg.allreduce([t], o)
pg.allreduce([once], o)
assert _anon_huge_kib(t.data_ptr(), 16 << 20) == 0, "collapsed on the first use"
pg.allreduce([t], o)
print("huge", _anon_huge_kib(t.data_ptr(), 16 << 20), _anon_huge_kib(once.data_ptr(), 16 << 20))
assert torch.equal(t, torch.arange(n, dtype=torch.float32))
pg.shutdown()
"""
    env = dict(os.environ, NEXAR_TORCH_HUGEPAGE_MIN="0" if off else "4M")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    huge, once = map(int, r.stdout.split("huge", 1)[1].split())
    assert once == 0, r.stdout
    if off:
        assert huge == 0, r.stdout
    else:
        assert huge >= 14 << 10, r.stdout  # the 2 MiB-aligned interior: at least 7 of the 8 huge pages
