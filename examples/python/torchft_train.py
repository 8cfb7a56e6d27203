"""Fault-tolerant training with torchft over nexar: a lighthouse and 2
replica groups; replica group 1 is killed mid-step, restarted, and heals
from the survivor.

    python examples/python/torchft_train.py            # the whole demo
    python examples/python/torchft_train.py replica --id 0 --lighthouse http://host:port

torchft's own training loop (Manager, its DistributedDataParallel and
Optimizer wrappers) with nexar.torchft.ProcessGroupNexar as the process
group between replica groups. Each replica group here is one process
(rank 0 of a group of 1) with its own TCPStore and its own data; the
lighthouse forms a quorum of the live groups at every step, and the Manager
reconfigures the nexar group whenever the quorum changes. The survivor keeps
training alone while group 1 is down (min_replica_size=1); the restarted
group joins the next quorum, receives the survivor's model, optimizer and
step (torchft's checkpoint transport), and both go on in lockstep.

A replica stops once it has committed --steps steps and the last one had
all --replicas groups participating, so the groups stop after the same
step; it then prints its weights' digest and, with --out, saves them.

Needs torchft (pip install torchft==0.2.0, as requirements-dev.txt pins).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F


def replica(args) -> None:
    import faulthandler
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack, to stderr
    from torchft import DistributedDataParallel, Manager, Optimizer

    from nexar.torchft import ProcessGroupNexar

    torch.manual_seed(0)  # the same initial model everywhere (torchft syncs it at step 0 anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        optim.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    # The replica group's own store (torchft's Manager connects to it; the
    # quorum hands its address to the other groups for the nexar rendezvous).
    store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=args.timeout)
    pg = ProcessGroupNexar(timeout=timeout)
    manager = Manager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        replica_id=f"train_{args.id}",
        lighthouse_addr=args.lighthouse,
        store_addr=args.host,
        store_port=store.port,
        hostname=args.host,
        rank=0,
        world_size=1,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=4 * args.timeout),
        connect_timeout=timeout,
    )
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, optim)

    while True:
        step = manager.current_step()
        # This group's batch of this step (groups see different data).
        g = torch.Generator().manual_seed(1000 * args.id + step)
        x = torch.randn(32, 16, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()  # starts the quorum
        loss = F.mse_loss(ddp(x), y)
        loss.backward()  # gradients averaged across the quorum's groups (nexar)
        if args.step_sleep:
            time.sleep(args.step_sleep)  # mid-step: where a kill lands
        opt.step()  # commits only if every group of the quorum succeeded
        n = manager.num_participants()
        print(f"replica {args.id} step {manager.current_step()} participants {n} loss {loss.item():.5f}", flush=True)
        if manager.current_step() >= args.steps and n == args.replicas:
            break

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(f"replica {args.id} done at step {manager.current_step()} weights {digest}", flush=True)
    if args.out:
        torch.save({"step": manager.current_step(), "params": [p.detach().clone() for p in model.parameters()]},
                   args.out)
    manager.shutdown(wait=False)
    pg.shutdown()  # a goodbye to the other group: it sees this one leave, not fail


def _start(script, rid, lighthouse, args, log):
    cmd = [sys.executable, script, "replica", "--id", str(rid), "--lighthouse", lighthouse,
           "--steps", str(args.steps), "--step-sleep", str(args.step_sleep), "--host", args.host]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _steps(path, rid) -> int:
    """The last step replica rid reported in its log."""
    last = 0
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[:3] == ["replica", str(rid), "step"]:
                last = int(parts[3])
    return last


def demo(args) -> None:
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000)
    script = os.path.abspath(__file__)
    logs = [f"torchft_replica{r}.log" for r in range(2)]
    files = [open(p, "w") for p in logs]
    procs = [_start(script, r, lighthouse.address(), args, files[r]) for r in range(2)]
    deadline = time.monotonic() + 300
    try:
        while _steps(logs[1], 1) < args.steps // 3:
            time.sleep(0.1)
            assert time.monotonic() < deadline and procs[1].poll() is None, "replica 1 did not get going"
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        at = _steps(logs[0], 0)
        print(f"killed replica 1 at its step {_steps(logs[1], 1)}; replica 0 at step {at}")
        while _steps(logs[0], 0) < at + 3:  # the survivor carries on alone
            time.sleep(0.1)
            assert time.monotonic() < deadline and procs[0].poll() is None, "replica 0 stopped"
        print(f"replica 0 went on alone to step {_steps(logs[0], 0)}; restarting replica 1")
        procs[1] = _start(script, 1, lighthouse.address(), args, files[1])
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        lighthouse.shutdown()
    for p in logs:
        with open(p) as f:
            print("".join(line for line in f if " done at step " in line), end="")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", default="demo", choices=["demo", "replica"])
    ap.add_argument("--id", type=int, default=0, help="replica group id (replica mode)")
    ap.add_argument("--lighthouse", default=os.environ.get("TORCHFT_LIGHTHOUSE", ""))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--replicas", type=int, default=2, help="groups that must share the last step")
    ap.add_argument("--step-sleep", type=float, default=0.05, help="seconds between backward and step")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds: collectives, configuration")
    ap.add_argument("--host", default="127.0.0.1", help="address this host's stores and servers advertise")
    ap.add_argument("--out", default="", help="save the final parameters here (replica mode)")
    args = ap.parse_args()
    if args.mode == "replica":
        replica(args)
    else:
        demo(args)


if __name__ == "__main__":
    main()
