"""The torch path of the "nexar" backend beside the numpy path, in the same
processes (docs/performance.md, "The torch path").

    .venv/bin/python bench/torchpath/torchpath_bench.py small   # 8 B: sync, async, numpy
    .venv/bin/python bench/torchpath/torchpath_bench.py pages   # 16 MiB: 4 KiB vs huge pages
    .venv/bin/python bench/torchpath/torchpath_bench.py percall # one rank: CPU per call
    .venv/bin/python bench/torchpath/torchpath_bench.py cold    # 1 MiB: code run cold after a collective

small and pages start 2 ranks on this host (torch's env:// variables); each
call follows a barrier, the variants run in a random order that is the same
on both ranks, and rank 0 prints each variant's median and p99 (µs). --pin
runs each rank on its own CPU at SCHED_FIFO priority 10 (root; keeps the
host's other work off the two ranks, for comparisons that load would blur).
cold (1 MiB unless --size N) runs the same in-place all_reduce on the same
memory through numpy, the group's C method and dist.all_reduce, then times
a torch add_ of 16 floats alone after another (warm), after a barrier,
after the all_reduce, and
after numpy copies that touch 1 and 2 MiB: what code costs when a
collective has just pushed it out of the core's caches.
percall runs one rank (world size 1: no peer, so the time is the call's own
CPU) and prints the least time per call over 25 rounds of 2000 calls,
including a do-nothing Python ProcessGroup and torch's do-nothing C++
backend (FakeProcessGroup) for scale.
"""

import os
import random
import statistics
import subprocess
import sys
import time


def rank_main(mode, iters, size):
    import numpy as np
    import torch
    import torch.distributed as dist

    import nexar.torch  # noqa: F401  registers the backend

    dist.init_process_group("nexar")
    rank = dist.get_rank()
    comm = dist.distributed_c10d._get_default_group().comm
    n = max(1, size // 4)
    if mode == "small":
        t = torch.ones(n)
        a, b = np.ones(n, dtype=np.float32), np.empty(n, dtype=np.float32)
        variants = {
            "numpy comm.allreduce": lambda: comm.allreduce(a, b),
            "numpy iallreduce + wait": lambda: comm.iallreduce(a, b).wait(),
            "torch dist.all_reduce": lambda: dist.all_reduce(t),
            "torch async_op + wait": lambda: dist.all_reduce(t, async_op=True).wait(),
        }
    elif mode == "cold":
        return cold(comm, iters, size, rank)
    else:
        tensors = {"torch.ones (torch's allocator)": torch.ones(n),
                   "torch.from_numpy (numpy's, huge pages)": torch.from_numpy(np.ones(n, dtype=np.float32))}
        variants = {k: (lambda t=t: dist.all_reduce(t)) for k, t in tensors.items()}
    res = _timed(comm, {k: (_nop, f) for k, f in variants.items()}, iters)
    if rank == 0:
        print(f"{mode}, {size} B, {iters} calls each, load {os.getloadavg()[0]:.2f}, "
              f"NEXAR_TORCH_HUGEPAGE_MIN={os.environ.get('NEXAR_TORCH_HUGEPAGE_MIN', '(default)')}")
        for k, d in res.items():
            d.sort()
            med = statistics.median(d)
            p99 = _p99(d)
            bw = f"  busbw {size / med / 1e9:.2f} GB/s" if size >= 1 << 20 else ""
            print(f"  {k:40s} median {med * 1e6:9.2f}  p99 {p99 * 1e6:9.1f}{bw}", flush=True)
    dist.destroy_process_group()


def cold(comm, iters, size, rank):
    """rank_main's cold mode: each variant is (what runs after the barrier,
    untimed; what is timed)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    n = max(1, size // 4)
    a = np.ones(n, dtype=np.float32)
    t = torch.from_numpy(a)  # the same memory for every path
    small = torch.ones(16)
    c1 = [np.ones(1 << 17, dtype=np.float32) for _ in range(2)]  # 512 KiB each
    c2 = [np.ones(1 << 18, dtype=np.float32) for _ in range(2)]  # 1 MiB each
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    add = lambda: small.add_(1)  # noqa: E731
    variants = {
        "numpy comm.allreduce(a, a)": (_nop, lambda: comm.allreduce(a, a)),
        "the group's C method": (_nop, lambda: backend.allreduce([t], opts)),
        "torch dist.all_reduce": (_nop, lambda: dist.all_reduce(t)),
        "add_ after an add_ (warm)": (add, add),
        "add_ after the barrier": (_nop, add),
        "add_ after the all_reduce": (lambda: comm.allreduce(a, a), add),
        "add_ after a copy touching 1 MiB": (lambda: np.copyto(c1[0], c1[1]), add),
        "add_ after a copy touching 2 MiB": (lambda: np.copyto(c2[0], c2[1]), add),
    }

    def round_done(i):
        if i % 32 == 31:
            a[:] = 1  # in place, the sums double: keep them finite

    res = _timed(comm, variants, iters, round_done)
    if rank == 0:
        print(f"cold, {size} B, {iters} calls each, load {os.getloadavg()[0]:.2f}")
        for k, d in res.items():
            d.sort()
            print(f"  {k:40s} median {statistics.median(d) * 1e6:8.1f}  p99 {_p99(d) * 1e6:8.1f}", flush=True)
    dist.destroy_process_group()


def _nop():
    pass


def _p99(d):
    """The 99th percentile of the sorted list d."""
    return d[(99 * len(d) + 99) // 100 - 1]


def _timed(comm, variants, iters, round_done=None):
    """Times each variant (name: (before, f)): after a barrier, before runs
    untimed and f timed, in a random order that is the same on both ranks;
    round_done(i) runs after round i. Returns the times (s) by name."""
    for before, f in variants.values():
        for _ in range(3):
            before()
            f()
    res = {k: [] for k in variants}
    rng = random.Random(7)  # the same order on both ranks
    keys = list(variants)
    for i in range(iters):
        rng.shuffle(keys)
        for k in keys:
            before, f = variants[k]
            comm.barrier()
            before()
            t0 = time.perf_counter()
            f()
            res[k].append(time.perf_counter() - t0)
        if round_done is not None:
            round_done(i)
    return res


def percall():
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000))
    import numpy as np
    import torch
    import torch.distributed as dist

    import nexar.torch  # noqa: F401

    class DoNothing(dist.ProcessGroup):
        def __init__(self):
            super().__init__(0, 1)

        def allreduce(self, tensors, opts=None):
            return None

        def getBackendName(self):
            return "do-nothing"

    dist.init_process_group("nexar")
    comm = dist.distributed_c10d._get_default_group().comm
    t = torch.ones(2)
    a, b = np.ones(2, dtype=np.float32), np.empty(2, dtype=np.float32)
    nothing = DoNothing()
    variants = {
        "numpy comm.allreduce": lambda: comm.allreduce(a, b),
        "dist.all_reduce, do-nothing Python PG": lambda: dist.all_reduce(t, group=nothing),
        "dist.all_reduce on nexar": lambda: dist.all_reduce(t),
        "dist.all_reduce async_op + wait": lambda: dist.all_reduce(t, async_op=True).wait(),
        "numpy iallreduce + wait": lambda: comm.iallreduce(a, b).wait(),
    }
    print(f"per call, world size 1, load {os.getloadavg()[0]:.2f} (µs)")
    for k, v in _least(variants).items():
        print(f"  {k:40s} {v * 1e6:6.2f}")
    dist.destroy_process_group()
    # torch's do-nothing C++ backend, in a process of its own (one default group per process)
    code = ("import os, sys; sys.path.insert(0, %r); os.environ.update(RANK='0', WORLD_SIZE='1');"
            "import torch, torch.distributed as dist, torchpath_bench as b;"
            "from torch.testing._internal.distributed.fake_pg import FakeStore;"
            "dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=2);"
            "t = torch.ones(2); v = b._least({'x': lambda: dist.all_reduce(t)})['x'];"
            "print(f\"  {'dist.all_reduce, do-nothing C++ backend':40s} {v * 1e6:6.2f}\")"
            % os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True)


def _least(variants, rounds=25, calls=2000):
    best = {k: float("inf") for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            best[k] = min(best[k], (time.perf_counter() - t0) / calls)
    return best


def main():
    args = sys.argv[1:]
    if not args or args[0] not in ("small", "pages", "percall", "cold", "_rank"):
        sys.exit(__doc__)
    if args[0] == "percall":
        return percall()
    if args[0] == "_rank":
        return rank_main(args[1], int(args[2]), int(args[3]))
    mode, pin = args[0], "--pin" in args
    iters, size = {"small": (3000, 8), "cold": (300, 1 << 20)}.get(mode, (40, 16 << 20))
    if "--size" in args:
        size = int(args[args.index("--size") + 1])
    port = str(20000 + random.randrange(20000))
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   OMP_NUM_THREADS="1")
        pre = ["chrt", "-f", "10", "taskset", "-c", str(r % (os.cpu_count() or 1))] if pin else []
        procs.append(subprocess.Popen(pre + [sys.executable, os.path.abspath(__file__), "_rank", mode, str(iters),
                                             str(size)], env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
