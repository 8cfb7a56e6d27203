#!/usr/bin/env python3
"""Bucketed against per-tensor allreduce through torch.distributed, 2
processes on this host, same run.

Gradient lists: "ddp60", 60 float32 tensors of mixed sizes from 1 KiB to
4 MiB (geometric, shuffled with a fixed seed; about 30 MiB); "resnet50",
the 161 parameter tensors of ResNet-50 (about 98 MiB); "small100", 100
tensors of 1 KiB (not run by default). For each
list and backend, rank 0 times, per iteration (after a barrier):

- per-tensor: one dist.all_reduce per tensor (blocking), as a training loop
  without bucketing would;
- per-tensor async: every dist.all_reduce(async_op=True) issued, then all
  waited;
- coalesced: one dist.all_reduce_coalesced over the list (on "nexar": the
  bucketed allreduce, 25 MiB buckets; on gloo: its own coalesced allreduce).

The methods alternate iteration by iteration, so that drift on a shared
machine hits them alike. Results are checked once per method.

  .venv/bin/python bench/bucketed/bucketed_bench.py [--iters 40] [--lists ddp60,resnet50] [--backends nexar,gloo]
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp60():
    lo, hi, n = 256, 1 << 20, 60  # float32 elements: 1 KiB .. 4 MiB
    sizes = [int(round(lo * (hi / lo) ** (i / (n - 1)))) for i in range(n)]
    random.Random(12).shuffle(sizes)
    return sizes


def resnet50():
    sizes = [64 * 3 * 7 * 7, 64, 64]
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            sizes += [width * inp, width, width, width * width * 9, width, width, 4 * width * width,
                      4 * width, 4 * width]
            if b == 0:
                sizes += [4 * width * inp, 4 * width, 4 * width]
            inp = 4 * width
    sizes += [1000 * 2048, 1000]
    assert len(sizes) == 161, len(sizes)
    return sizes


def small100():
    return [256] * 100  # 100 tensors of 1 KiB: where per-call cost dominates


LISTS = {"ddp60": ddp60, "resnet50": resnet50, "small100": small100}
METHODS = ("per-tensor", "per-tensor async", "coalesced")


def child(rank, backend, lists, iters, port):
    import torch
    import torch.distributed as dist
    import nexar.torch  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=2)
    res = []
    for name in lists:
        ts = [torch.full((k,), float(rank + 1)) for k in LISTS[name]()]

        def run(method):
            if method == "per-tensor":
                for t in ts:
                    dist.all_reduce(t)
            elif method == "per-tensor async":
                for w in [dist.all_reduce(t, async_op=True) for t in ts]:
                    w.wait()
            else:
                dist.all_reduce_coalesced(ts)

        times = {m: [] for m in METHODS}
        for m in METHODS:  # warm-up and check: 1+2 = 3 everywhere
            for t in ts:
                t.fill_(rank + 1)
            run(m)
            for t in ts:
                if not bool((t == 3).all()):
                    raise SystemExit(f"{backend} {name} {m}: wrong result {t[:4]}")
        for i in range(iters):
            for m in METHODS:
                dist.barrier()
                t0 = time.perf_counter()
                run(m)
                times[m].append(time.perf_counter() - t0)
        for m in METHODS:
            xs = sorted(times[m])
            res.append({"backend": backend, "list": name, "method": m, "tensors": len(ts),
                        "bytes": sum(t.numel() * 4 for t in ts), "iters": iters,
                        "median_ms": statistics.median(xs) * 1e3, "p99_ms": xs[int(0.99 * (len(xs) - 1))] * 1e3})
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def launch(backend, lists, iters):
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        argv = [sys.executable, __file__, "--child", str(r), backend, ",".join(lists), str(iters), str(port)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"{backend} rank failed:\n{o}")
    for line in outs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{backend}: no result:\n{outs[0]}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, rank, backend, lists, iters, port = sys.argv
        return child(int(rank), backend, lists.split(","), int(iters), int(port))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--lists", default="ddp60,resnet50")
    ap.add_argument("--backends", default="nexar,gloo")
    args = ap.parse_args()
    lists = args.lists.split(",")
    res = []
    for b in args.backends.split(","):
        res += launch(b, lists, args.iters)
    by = {(r["backend"], r["list"], r["method"]): r for r in res}
    print("| list | backend | per-tensor median ms (p99) | per-tensor async median ms (p99) | "
          "coalesced median ms (p99) | per-tensor / coalesced (median) |")
    print("|---|---|---:|---:|---:|---:|")
    for name in lists:
        for b in args.backends.split(","):
            p, a, c = (by[(b, name, m)] for m in METHODS)
            first = p
            print(f"| {name} ({first['tensors']} tensors, {first['bytes'] / 2**20:.1f} MiB) | {b} | "
                  f"{p['median_ms']:.2f} ({p['p99_ms']:.2f}) | {a['median_ms']:.2f} ({a['p99_ms']:.2f}) | "
                  f"{c['median_ms']:.2f} ({c['p99_ms']:.2f}) | {p['median_ms'] / c['median_ms']:.2f}× |")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
