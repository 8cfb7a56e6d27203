"""Elastic DDP on the "nexar" backend: training survives a lost rank.

Run with 4 ranks and the manual failure policy, e.g.

    NEXAR_ON_FAILURE=manual nexar run -n 4 -- python examples/python/elastic_ddp.py

A linear model is trained with DDP on a global batch that the ranks share
equally. At step KILL_AT, rank VICTIM is SIGKILLed. The survivors' backward
pass raises; they shrink the process group (nexar agrees on who failed and
forms the survivors' group on the connections that exist), wrap the model
in DDP again on the new group, re-shard the global batch among themselves,
redo the step. The new rank 0 starts a replacement process, which waits to
join the running job (ProcessGroupNexar.join, through the survivors'
lobbies); at step GROW_AT the survivors grow the group to 4 again, the
replacement receives the step and the model (DDP's constructor broadcasts
it from rank 0), the batch is re-sharded among 4, and training finishes as
4. Since every step averages the gradient over the whole global batch, the
result equals single-process training, which tests/test_elastic compares
it with. Every rank prints its final weights.
"""

import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar
import nexar.torch
from nexar.torch import ProcessGroupNexar

STEPS, KILL_AT, VICTIM, GROW_AT, LR = 12, 5, 3, 8, 0.05


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


def say(line):
    """One line in one write: the replacement shares rank 0's output, and
    print's separate write of the newline would let their lines mix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def start_replacement(pg):
    """Start a process that joins the job through the live members' lobbies."""
    env = dict(os.environ, ELASTIC_JOIN=",".join(pg.join_addrs), ELASTIC_TOKEN=pg.join_token.hex())
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env)


def grow_until(pg, n, deadline=120.0):
    """Grow pg (every member calls this at the same step) until it has n
    ranks: a grow with nobody waiting yet keeps the members."""
    end = time.monotonic() + deadline
    while True:
        g = pg.grow()
        if g.size() >= n or time.monotonic() > end:
            return g
        g.shutdown()
        time.sleep(0.2)


def sync_step(pg, step):
    """Rank 0's step, for a joiner that does not know it."""
    t = torch.tensor([step], dtype=torch.int64)
    pg.broadcast([t], dist.BroadcastOptions()).wait()
    return int(t.item())


def train(pg, model, step, name, shrinks=0, grows=0, child=None):
    x, y = data()
    ddp = DDP(model, process_group=pg)  # broadcasts the model from rank 0
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    while step < STEPS:
        if step == GROW_AT and pg.size() < 4:
            old, pg = pg, grow_until(pg, 4)
            old.shutdown()
            grows += 1
            step = sync_step(pg, step)
            ddp = DDP(model, process_group=pg)
            say(f"rank {name}: grown to {pg.size()} ranks, now rank {pg.rank()}")
        r, n = pg.rank(), pg.size()
        per = x.shape[0] // n
        xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
        if step == KILL_AT and name == VICTIM:
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
            say(f"rank {name}: step {step}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            old, pg = pg, pg.shrink()
            shrinks += 1
            ddp = DDP(model, process_group=pg)
            say(f"rank {name}: continuing as rank {pg.rank()} of {pg.size()}")
            if pg.rank() == 0 and child is None:
                child = start_replacement(pg)
    w = model.weight.detach().flatten().tolist()
    say(f"rank {name}: done: {step} steps on {pg.size()} ranks after {shrinks} shrink(s) and {grows} grow(s); "
          "weights " + " ".join(f"{v:.7f}" for v in w))
    pg.shutdown()
    if child is not None and child.wait() != 0:
        raise SystemExit(f"the replacement process exited with status {child.returncode}")


def main():
    nexar.torch.register()
    model = nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    if os.environ.get("ELASTIC_JOIN"):
        # The replacement: it waits until the members grow, then learns the
        # step and the model from rank 0.
        pg = ProcessGroupNexar.join(os.environ["ELASTIC_JOIN"], token=bytes.fromhex(os.environ["ELASTIC_TOKEN"]))
        step = sync_step(pg, 0)
        say(f"rank joiner: joined as rank {pg.rank()} of {pg.size()} at step {step}")
        train(pg, model, step, "joiner", grows=1)
        return
    dist.init_process_group("nexar")
    train(nexar_group(dist.distributed_c10d._get_default_group()), model, 0, dist.get_rank())


if __name__ == "__main__":
    main()
