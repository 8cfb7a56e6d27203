"""Elastic DDP on the "nexar" backend: training survives a lost rank.

Run with 4 ranks and the manual failure policy, e.g.

    NEXAR_ON_FAILURE=manual nexar run -n 4 -- python examples/python/elastic_ddp.py

A linear model is trained with DDP on a global batch that the ranks share
equally. At step KILL_AT, rank VICTIM is SIGKILLed. The survivors' backward
pass raises; they shrink the process group (nexar agrees on who failed and
forms the survivors' group on the connections that exist), wrap the model
in DDP again on the new group, re-shard the global batch among themselves,
redo the step, and finish as 3. Since every step averages the gradient over
the whole global batch, the result equals single-process training, which
tests/test_elastic compares it with. Rank 0 prints the final weights.

What is not here yet: a replacement process joining the running job (grow).
"""

import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar
import nexar.torch
from nexar.torch import ProcessGroupNexar

STEPS, KILL_AT, VICTIM, LR = 12, 5, 3, 0.05


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(48, 1, generator=g)
    return x, y


def nexar_group(pg):
    """The ProcessGroupNexar behind a torch group (the default group may wrap it)."""
    if isinstance(pg, ProcessGroupNexar):
        return pg
    return pg._get_backend(torch.device("cpu"))


def main():
    nexar.torch.register()
    dist.init_process_group("nexar")
    world_rank = dist.get_rank()
    pg = nexar_group(dist.distributed_c10d._get_default_group())
    x, y = data()
    model = nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    ddp = DDP(model, process_group=pg)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    step, shrinks = 0, 0
    while step < STEPS:
        r, n = pg.rank(), pg.size()
        per = x.shape[0] // n
        xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
        if step == KILL_AT and world_rank == VICTIM:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(xs), ys)
            loss.backward()
            opt.step()
            step += 1
        except (RuntimeError, nexar.Error) as e:
            # A member is gone: the survivors agree and carry on as a
            # smaller group; the step is redone (its gradient was partial,
            # the weights untouched).
            print(f"rank {world_rank}: step {step}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            old, pg = pg, pg.shrink()
            shrinks += 1
            ddp = DDP(model, process_group=pg)
            print(f"rank {world_rank}: continuing as rank {pg.rank()} of {pg.size()}", flush=True)
    w = model.weight.detach().flatten().tolist()
    print(f"rank {world_rank}: done: {step} steps on {pg.size()} ranks after {shrinks} shrink(s); weights "
          + " ".join(f"{v:.7f}" for v in w), flush=True)
    pg.shutdown()


if __name__ == "__main__":
    main()
