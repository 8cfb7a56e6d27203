"""nexar.Comm with real CUDA arrays, 2 processes (scripts/gpu_check.sh).

    python scripts/gpu_check_pycomm.py --out pycomm.json

torch CUDA tensors as they are (data_ptr), through their DLPack and
__cuda_array_interface__ exports, and CuPy arrays where CuPy is installed;
blocking and with stream=; every result checked element by element on the
host (.cpu()). JSON: each case and whether it passed, or why nothing ran
(no torch, no CUDA). Exit status 1 when a case failed.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys


def use_bundle() -> None:
    """Import nexar from GPU_CHECK_NEXAR (see gpu_check_ddp.py)."""
    path = os.environ.get("GPU_CHECK_NEXAR")
    if path:
        sys.path.insert(0, path)
        sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_")]


class DL:
    """Only the DLPack export of t."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class CAI:
    """Only the __cuda_array_interface__ of t."""

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def worker(out: str) -> None:
    import torch

    import nexar

    rank = int(os.environ["NEXAR_RANK"])
    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.cuda.init()  # before the communicator: libnexar finds the loaded CUDA runtime then
    comm = nexar.init()
    n = comm.size
    cases = []

    def check(name, got, want):
        got, want = got.cpu(), want.cpu()
        bad = (got != want).nonzero()
        err = "" if bad.numel() == 0 else f"element {bad[0].tolist()} is {got.flatten()[bad[0][0]]}, want {want.flatten()[bad[0][0]]}"
        cases.append({"case": name, "ok": not err, **({"error": err} if err else {})})

    def run(name, f):
        try:
            f()
        except Exception as e:  # noqa: BLE001 - the figure is the error
            cases.append({"case": name, "ok": False, "error": f"{type(e).__name__}: {e}"})

    count = 4099

    def inp(r, dtype, k=count):
        return ((torch.arange(k) * 7 + r * 3) % 5 + 1).to(dtype)

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                  torch.uint8, torch.int8):
        want = sum(inp(q, torch.float64) for q in range(n)).to(dtype)
        for how, wrap in (("tensor", lambda t: t), ("dlpack", DL), ("cai", CAI)):
            if how == "cai" and dtype == torch.bfloat16:
                continue  # torch exports no bfloat16 through __cuda_array_interface__

            def blocking(dtype=dtype, wrap=wrap, want=want, how=how):
                t = inp(rank, dtype).cuda()
                comm.allreduce(wrap(t))
                check(f"allreduce {how} {dtype} blocking", t, want)

            def on_stream(dtype=dtype, wrap=wrap, want=want, how=how):
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    t = inp(rank, dtype).cuda()
                    comm.allreduce(wrap(t), stream=s)
                    got = t.clone()
                s.synchronize()
                check(f"allreduce {how} {dtype} stream", got, want)

            run(f"allreduce {how} {dtype} blocking", blocking)
            if how != "cai":  # torch's interface names no stream: blocking only
                run(f"allreduce {how} {dtype} stream", on_stream)

    def others():
        s = torch.cuda.current_stream()
        b = inp(rank, torch.int64).cuda()
        comm.broadcast(b, root=n - 1, stream=s)
        check("broadcast stream", b, inp(n - 1, torch.int64))
        g = torch.empty(count * n, dtype=torch.float32, device="cuda")
        comm.allgather(inp(rank, torch.float32).cuda(), g, stream=s)
        check("allgather stream", g, torch.cat([inp(q, torch.float32) for q in range(n)]))
        r = torch.empty(count, dtype=torch.float32, device="cuda")
        comm.reduce_scatter(inp(rank, torch.float32, count * n).cuda(), r, stream=s)
        full = sum(inp(q, torch.float32, count * n) for q in range(n))
        check("reduce_scatter stream", r, full[rank * count:(rank + 1) * count])
        x, y = inp(rank, torch.uint8).cuda(), torch.zeros(count, dtype=torch.uint8, device="cuda")
        steps = [lambda: comm.send(x, (rank + 1) % n, stream=s), lambda: comm.recv(y, (rank + n - 1) % n, stream=s)]
        for f in steps if rank % 2 == 0 else steps[::-1]:
            f()
        check("send/recv stream", y, inp((rank + n - 1) % n, torch.uint8))

    run("broadcast, allgather, reduce_scatter, send/recv", others)
    try:
        import cupy
    except ImportError as e:
        cases.append({"case": "cupy", "ok": True, "not_run": f"no CuPy ({e})"})
    else:
        def cupy_case():
            a = cupy.asarray(inp(rank, torch.float32).numpy())
            comm.allreduce(a)
            check("cupy allreduce blocking", torch.from_numpy(cupy.asnumpy(a)),
                  sum(inp(q, torch.float32) for q in range(n)))
        run("cupy allreduce blocking", cupy_case)
    comm.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(cases, f)
    comm.close()


def main() -> int:
    use_bundle()
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return 0
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else ""
    report = {"part": "pycomm"}
    try:
        import torch
    except ImportError as e:
        report.update(ok=False, not_run=f"{sys.executable} has no torch ({e})")
        return finish(out, report)
    if not torch.cuda.is_available():
        report.update(ok=False, not_run=f"torch {torch.__version__} has no usable CUDA (torch.cuda.is_available() "
                                        f"is False)")
        return finish(out, report)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = out + ".cases" if out else "/tmp/gpu_check_pycomm.cases"
    token = secrets.token_hex(16)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", res],
                              env=dict(os.environ, NEXAR_RANK=str(r), NEXAR_WORLD_SIZE="2",
                                       NEXAR_SEED=f"127.0.0.1:{port}", NEXAR_TOKEN=token),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    if any(p.returncode for p in procs) or not os.path.exists(res):
        report.update(ok=False, error="\n".join(o[-2000:] for o in outs))
        return finish(out, report)
    with open(res) as f:
        cases = json.load(f)
    report.update(ok=all(c["ok"] for c in cases), cases=cases)
    return finish(out, report)


def finish(out, report) -> int:
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return 0 if report["ok"] or "not_run" in report else 1


if __name__ == "__main__":
    sys.exit(main())
