"""torch DDP, 2 processes, with one backend against another (scripts/gpu_check.sh).

    python scripts/gpu_check_ddp.py --device cuda --backends nexar,nccl --out ddp.json

Each backend trains the same model from the same seed on the same data for
--steps steps; rank 0 keeps the final weights. The JSON says, per backend,
the median and p90 step time (after --warmup steps) or the error that
stopped it, and whether its final weights equal the first backend's (max
absolute difference). With --device cuda the 2 ranks share GPU 0 when
there is one GPU (NCCL refuses that: "Duplicate GPU"; its error is then
the figure) and take GPU 0 and 1 otherwise. Exit status 1 when a backend
other than nccl failed or the weights of two that ran differ.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def use_bundle() -> None:
    """Import nexar from GPU_CHECK_NEXAR (gpu_check.sh's bundle) when set,
    even where an editable install's import hook would take precedence
    over sys.path (the dry run's venv): the bundle is what the GPU machine
    runs."""
    path = os.environ.get("GPU_CHECK_NEXAR")
    if path:
        sys.path.insert(0, path)
        sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(a) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if a.device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.cuda.init()  # before the process group: libnexar finds the loaded CUDA runtime then
    else:
        dev = torch.device("cpu")
    if a.backend == "nexar":
        import nexar.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(a.backend)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.width, 16)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1000 + rank)
    data = [(torch.randn(a.batch, a.width, generator=g).to(dev), torch.randn(a.batch, 16, generator=g).to(dev))
            for _ in range(4)]
    times = []
    for step in range(a.steps):
        x, y = data[step % len(data)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in model.parameters()])
    if rank == 0:
        torch.save({"weights": flat, "times": times[a.warmup:]}, a.result)
    dist.barrier()
    dist.destroy_process_group()


def run_backend(a, backend: str, tmp: str) -> dict:
    result = os.path.join(tmp, f"{backend}.pt")
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        argv = [sys.executable, __file__, "--worker", "--backend", backend, "--device", a.device, "--result", result,
                "--steps", str(a.steps), "--warmup", str(a.warmup), "--width", str(a.width), "--batch", str(a.batch)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs, failed = [], False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out = (p.communicate()[0] or "") + f"\n<killed after {a.timeout} s>"
        outs.append(out)
        failed |= p.returncode != 0
    entry = {"backend": backend, "device": a.device}
    if failed or not os.path.exists(result):
        tail = "\n".join(o.strip()[-1500:] for o in outs)
        entry.update(ok=False, error=tail)
        return entry
    import torch

    got = torch.load(result)
    ts = sorted(got["times"])
    entry.update(ok=True, steps=len(ts), median_step_ms=1e3 * statistics.median(ts),
                 p90_step_ms=1e3 * ts[(len(ts) * 9) // 10], _weights=got["weights"])
    return entry


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backends", default="nexar,nccl")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend", default="")
    ap.add_argument("--result", default="")
    a = ap.parse_args()
    use_bundle()
    if a.worker:
        worker(a)
        return 0
    report = {"part": "ddp", "device": a.device, "runs": []}
    try:
        import torch
    except ImportError as e:
        report.update(ok=False, not_run=f"{sys.executable} has no torch ({e})")
        return finish(a, report)
    report["torch"] = torch.__version__
    try:
        import nexar

        report["nexar"] = os.path.dirname(nexar.__file__)
    except ImportError as e:
        report["nexar"] = f"not importable: {e}"
    if a.device == "cuda" and not torch.cuda.is_available():
        report.update(ok=False, not_run=f"torch {torch.__version__} has no usable CUDA (torch.cuda.is_available() "
                                        f"is False)")
    else:
        if a.device == "cuda":
            report["gpus"] = torch.cuda.device_count()
        with tempfile.TemporaryDirectory() as tmp:
            runs = [run_backend(a, b, tmp) for b in a.backends.split(",")]
        ok = True
        ref = next((r for r in runs if r["ok"]), None)
        for r in runs:
            if not r["ok"]:
                ok &= r["backend"] == "nccl"  # one GPU: NCCL's refusal is the figure
                continue
            w = r.pop("_weights")
            if r is not ref:
                diff = float((w - ref["_w"]).abs().max()) if w.numel() == ref["_w"].numel() else float("inf")
                r.update(compared_with=ref["backend"], max_abs_diff=diff, weights_equal=diff == 0.0)
                ok &= diff == 0.0
            else:
                ref["_w"] = w
        if ref is not None:
            ref.pop("_w", None)
        report.update(ok=ok and ref is not None, runs=runs)
    return finish(a, report)


def finish(a, report) -> int:
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if report["ok"] or "not_run" in report else 1


if __name__ == "__main__":
    sys.exit(main())
