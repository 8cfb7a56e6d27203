#!/usr/bin/env python3
"""Before/after of nexar builds across two network namespaces, in one run.

Each round measures the two-way TCP ceiling (compare.py's two Python streams,
one each way) and then runs every variant once, in turn (reversed every
other round, so that drift in the host's load hits all alike): `nexar
bench` of one collective and size, --per-host ranks in each namespace (1 by
default) as on two hosts. It prints per round busbw and the CPU time (user
+ system) of all ranks per call, and at the end the median over rounds of
busbw, busbw as a share of the round's ceiling, the median and p99 time
(rank 0's), and CPU per call.

A variant is LABEL=BINARY[,KEY=VALUE...]: the nexar binary and extra
environment, e.g.

  .venv/bin/python bench/compare/netns_ab.py --size 16777216 \\
      before=build/nexar-base now=build/nexar \\
      plain-before=build/nexar-base,NEXAR_BULK_PLAINTEXT=1 \\
      plain-now=build/nexar,NEXAR_BULK_PLAINTEXT=1

  .venv/bin/python bench/compare/netns_ab.py --per-host 2 --size 8 \
      --iters 3000 --rounds 6 before=build/nexar-base now=build/nexar

Needs root and iproute2 (as compare.py --netns).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def run(net, binary, env, op, size, iters, per=1, warmup=3):
    port, token = compare.free_port(), os.urandom(16).hex()
    n = 2 * per
    base = dict(os.environ, NEXAR_WORLD_SIZE=str(n), NEXAR_SEED=f"{net.addrs[0]}:{port}", NEXAR_TOKEN=token,
                **compare.ONE_THREAD)
    if per == 1:
        base["NEXAR_BULK"] = "tcp"  # else the default: shared memory inside each namespace
    base.update(env)
    args = ["bench", "--json", "--warmup", str(warmup), "--iters", str(iters), "--ops", op, "--sizes", str(size)]
    ps = []
    for r in reversed(range(n)):  # rank 0, which prints the result, last
        e = dict(base, NEXAR_RANK=str(r), NEXAR_BIND_ADDR=f"{net.addrs[r // per]}:0")
        # A process group, not a session per rank: compare.py's rule (one
        # scheduler autogroup for all, as mpirun's ranks share).
        ps.append(subprocess.Popen(net.wrap(r // per) + [binary] + args, env=e, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, process_group=0))
    out = ps[-1].stdout.read()
    errs = [p.stderr.read() for p in ps]
    cpu = 0.0
    for p in ps:  # wait4, not wait: the rusage is what we are after
        _, status, ru = os.wait4(p.pid, 0)
        cpu += ru.ru_utime + ru.ru_stime
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            r["cpu_ms"] = 1000 * cpu / (iters + warmup)
            return r
    print(f"failed: {binary} {env}: " + " ".join(e[-300:] for e in errs), file=sys.stderr)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--op", default="allreduce")
    ap.add_argument("--size", type=int, default=16 << 20)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--per-host", type=int, default=1, help="ranks in each namespace")
    ap.add_argument("variants", nargs="+", help="LABEL=BINARY[,KEY=VALUE...]")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("netns_ab: needs root (network namespaces)")
    vs = []
    for v in a.variants:
        label, rest = v.split("=", 1)
        binary, *kv = rest.split(",")
        vs.append((label, os.path.abspath(binary), dict(x.split("=", 1) for x in kv)))
    res = {label: [] for label, _, _ in vs}
    with compare.NetNS() as net:
        for k in range(a.rounds):
            ceil = compare.tcp_stream_both(net)
            line = [f"round {k}: load {os.getloadavg()[0]:.1f}, ceiling {ceil or 0:.2f} GB/s"]
            for label, binary, env in (vs if k % 2 == 0 else vs[::-1]):
                r = run(net, binary, env, a.op, a.size, a.iters, a.per_host)
                if r:
                    res[label].append((r["busbw_gbs"], r["busbw_gbs"] / ceil if ceil else None, r["time_us"],
                                       r.get("p99_us"), r["cpu_ms"]))
                    line.append(f"{label} {r['busbw_gbs']:.3f} GB/s, {r['time_us']:.1f} µs (p99 {r.get('p99_us', 0):.0f}),"
                                f" {r['cpu_ms']:.3f} ms CPU")
            print("; ".join(line), flush=True)
    print(f"{a.op} {a.size} B, 2 x {a.per_host} ranks, {a.rounds} rounds, medians:")
    for label, _, _ in vs:
        xs = res[label]
        if not xs:
            print(f"{label}: no result")
            continue
        share = [x[1] for x in xs if x[1]]
        print(f"{label}: busbw {statistics.median(x[0] for x in xs):.3f} GB/s"
              + (f" ({100 * statistics.median(share):.0f} % of the two-way ceiling)" if share else "")
              + f", time {statistics.median(x[2] for x in xs):.1f} µs (p99 {statistics.median(x[3] for x in xs):.1f}),"
              f" CPU {statistics.median(x[4] for x in xs):.3f} ms per call (all ranks)")


if __name__ == "__main__":
    main()
