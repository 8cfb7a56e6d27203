#!/usr/bin/env python3
"""RPC round trip: nexar (Python API, Comm.call) against torch.distributed.rpc
(TensorPipe, rpc_sync) on this machine, 2 processes, same run; nexar also
with the reply written into a buffer of the caller's (Comm.call(out=)).

For each payload size, rank 0 calls rank 1's echo handler (the reply is the
request) --iters times, one call in flight, and reports the median, p99 and
mean round trip and the throughput (request plus reply bytes over the mean).

  .venv/bin/python bench/rpc/rpc_bench.py [--sizes 8,4096,1048576] [--iters 2000] [--bulk auto]

--bulk sets NEXAR_BULK for nexar's ranks: auto (RPC over a shared-memory ring
of its own between these two processes), tcp (a TLS TCP connection of its
own, as between hosts) or off (QUIC streams).
"""

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(ts):
    ts = sorted(ts)
    return {"median_us": statistics.median(ts) * 1e6, "p99_us": ts[int(0.99 * (len(ts) - 1))] * 1e6,
            "mean_us": statistics.fmean(ts) * 1e6}


def run_nexar(rank, sizes, iters):
    import nexar
    c = nexar.init()
    c.register(1, lambda caller, req: req)
    c.barrier()
    out = []
    if rank == 0:
        for size in sizes:
            req = os.urandom(size)
            for _ in range(min(100, iters)):
                c.call(1, 1, req)
            ts = []
            for _ in range(iters if size < 1 << 20 else max(50, iters // 20)):
                t = time.perf_counter()
                got = c.call(1, 1, req)
                ts.append(time.perf_counter() - t)
            assert got == req
            out.append({"system": "nexar", "bytes": size, **stats(ts)})
            # The reply into a buffer of the caller's (Comm.call(out=)).
            buf = bytearray(size)
            ts = []
            for _ in range(iters if size < 1 << 20 else max(50, iters // 20)):
                t = time.perf_counter()
                c.call(1, 1, req, out=buf)
                ts.append(time.perf_counter() - t)
            assert buf == req
            out.append({"system": "nexar-out", "bytes": size, **stats(ts)})
    c.barrier()
    c.close()
    return out


def echo(x):
    return x


def run_torch(rank, sizes, iters, port):
    import torch
    import torch.distributed.rpc as rpc
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=8)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    out = []
    if rank == 0:
        for size in sizes:
            req = torch.randint(0, 255, (size,), dtype=torch.uint8)
            for _ in range(min(100, iters)):
                rpc.rpc_sync("w1", echo, args=(req,))
            ts = []
            for _ in range(iters if size < 1 << 20 else max(50, iters // 20)):
                t = time.perf_counter()
                got = rpc.rpc_sync("w1", echo, args=(req,))
                ts.append(time.perf_counter() - t)
            assert torch.equal(got, req)
            out.append({"system": "torch-rpc", "bytes": size, **stats(ts)})
    rpc.shutdown()
    return out


def child():
    role, rank = sys.argv[2], int(sys.argv[3])
    sizes = [int(s) for s in sys.argv[4].split(",")]
    iters = int(sys.argv[5])
    if role == "nexar":
        res = run_nexar(rank, sizes, iters)
    else:
        res = run_torch(rank, sizes, iters, int(sys.argv[6]))
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def launch(role, sizes, iters, bulk="auto"):
    port, token = free_port(), secrets.token_hex(16)
    procs = []
    for r in range(2):
        env = dict(os.environ, NEXAR_RANK=str(r), NEXAR_WORLD_SIZE="2", NEXAR_SEED=f"127.0.0.1:{port}",
                   NEXAR_TOKEN=token, NEXAR_BULK=bulk)
        argv = [sys.executable, __file__, "--child", role, str(r), ",".join(map(str, sizes)), str(iters), str(port)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"{role} rank failed:\n{o}")
    for line in outs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{role}: no result:\n{outs[0]}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,4096,1048576")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bulk", default="auto", choices=["auto", "tcp", "off"])
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    res = launch("nexar", sizes, args.iters, args.bulk) + launch("torch", sizes, args.iters)
    by = {(r["system"], r["bytes"]): r for r in res}
    print("| bytes | nexar median µs (p99) | nexar out= median µs (p99) | torch-rpc median µs (p99) | "
          "torch/nexar median | torch/nexar out= median | nexar MB/s | nexar out= MB/s | torch-rpc MB/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        n, o, t = by[("nexar", s)], by[("nexar-out", s)], by[("torch-rpc", s)]
        mbps = lambda r: 2 * s / r["mean_us"]  # noqa: E731 (bytes per µs = MB/s)
        print(f"| {s} | {n['median_us']:.1f} ({n['p99_us']:.1f}) | {o['median_us']:.1f} ({o['p99_us']:.1f}) | "
              f"{t['median_us']:.1f} ({t['p99_us']:.1f}) | {t['median_us'] / n['median_us']:.1f}× | "
              f"{t['median_us'] / o['median_us']:.1f}× | {mbps(n):.0f} | {mbps(o):.0f} | {mbps(t):.0f} |")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
