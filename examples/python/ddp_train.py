"""Train a small model with DistributedDataParallel over the "nexar" backend.

    torchrun --nproc-per-node 4 examples/python/ddp_train.py
    nexar run -n 4 -- python examples/python/ddp_train.py

`nexar run` sets torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT too, so
the same env:// initialisation works under both launchers. With torch >= 2.5
the backend registers itself; `import nexar.torch` makes it explicit.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar.torch  # noqa: F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--backend", default=os.environ.get("BACKEND", "nexar"))
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts them anyway)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))

    for step in range(args.steps):
        x = torch.randn(64, 32, generator=gen)
        y = x @ w_true
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients are averaged across ranks by nexar allreduce
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:4d}  loss {avg.item():.5f}  ({world} ranks, backend {dist.get_backend()})")

    # every replica ends with the same parameters
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    assert all(torch.equal(c, flat) for c in copies), "replicas diverged"
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
