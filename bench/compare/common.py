"""Shared by the adapters of bench/compare: sizes, busbw factors, timing and
the JSON-line output format. Standard library only: adapters run under
different interpreters (the project venv for torch, /usr/bin/python3 for
mpi4py)."""

import json
import resource
import statistics
import sys

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall")
ELEM = 4  # float32


def busbw_factor(op, n):
    """nccl-tests bus bandwidth factor (DESIGN.md section 7)."""
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def layout(op, size, n):
    """Element counts (send, recv) per rank for a nominal size in bytes, in
    nccl-tests terms: S is the buffer for allreduce/broadcast, the whole
    gathered/scattered array for allgather/reduce_scatter, and all a rank
    sends for alltoall. Returns (S actually used, send elems, recv elems)."""
    if op in ("allreduce", "broadcast"):
        c = max(1, size // ELEM)
        return c * ELEM, c, c
    block = max(1, size // ELEM // n)
    total = block * n
    if op == "allgather":
        return total * ELEM, block, total
    if op == "reduce_scatter":
        return total * ELEM, total, block
    return total * ELEM, total, total  # alltoall


def iterations(size):
    """Timed iterations: many for small sizes (a stable median of a few
    microseconds needs hundreds), at least 5 for large ones. A pure function
    of size so that every rank agrees without talking; `nexar bench` uses
    the same formula."""
    return max(5, min(1000, (256 << 20) // max(size, 1)))


def p99(times):
    """The 99th percentile (nearest rank: the ceil(0.99 n)-th smallest), as
    `nexar bench` computes it."""
    s = sorted(times)
    return s[(99 * len(s) + 99) // 100 - 1]


def cpu_seconds():
    """This process's CPU time so far (user + system, every thread)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def report(system, op, size, n, times, cpu=None):
    """Print one JSON line from rank 0's per-iteration times (seconds):
    median (time_us), 99th percentile and mean; cpu, rank 0's CPU seconds
    over the timed iterations, as cpu_us per call."""
    t = statistics.median(times)
    alg = size / t / 1e9
    r = {
        "system": system, "op": op, "bytes": size, "ranks": n,
        "time_us": round(t * 1e6, 2), "p99_us": round(p99(times) * 1e6, 2),
        "mean_us": round(statistics.fmean(times) * 1e6, 2), "algbw_gbs": round(alg, 4),
        "busbw_gbs": round(alg * busbw_factor(op, n), 4), "iters": len(times),
    }
    if cpu is not None:
        r["cpu_us"] = round(cpu / len(times) * 1e6, 2)
    print(json.dumps(r), flush=True)


def parse_args(argv):
    """--ops a,b --sizes 8,4096 (shared flags of every adapter)."""
    ops, sizes = list(OPS), [8, 4096, 1 << 20]
    it = iter(argv)
    for a in it:
        if a == "--ops":
            ops = next(it).split(",")
        elif a == "--sizes":
            sizes = [int(x) for x in next(it).split(",")]
        else:
            sys.exit(f"unknown argument {a}")
    return ops, sizes
