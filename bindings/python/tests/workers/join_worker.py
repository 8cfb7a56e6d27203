"""DDP under torch.distributed.algorithms.join.Join with uneven inputs
(issue 32): rank r trains on steps[r] batches of a small MLP with SGD;
the ranks that run out early shadow the others' collectives (the join
hook's all_reduces, dropped by torch as soon as they are issued). Every
rank's final model must equal a reference trained in this process by
the same rule (each step's gradient: the sum over the ranks still
training, divided by the world size). Run as n ranks with torchrun's
variables: join_worker.py BACKEND STEPS (STEPS: comma-separated, one per
rank)."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar.torch  # noqa: F401


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def reference(steps, lr):
    """The parameters DDP with Join must reach on every rank."""
    m, n = model(), len(steps)
    for s in range(max(steps)):
        grads = [torch.zeros_like(p) for p in m.parameters()]
        for r in range(n):
            if s < steps[r]:
                m.zero_grad()
                x, y = batch(r, s)
                torch.nn.functional.mse_loss(m(x), y).backward()
                for g, p in zip(grads, m.parameters()):
                    g += p.grad
        with torch.no_grad():
            for g, p in zip(grads, m.parameters()):
                p -= lr * g / n
    return [p.detach() for p in m.parameters()]


def main():
    backend, steps = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    dist.init_process_group(backend)
    r, n = dist.get_rank(), dist.get_world_size()
    assert len(steps) == n, (steps, n)
    lr = 0.1
    ddp = DDP(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    with Join([ddp]):
        for s in range(steps[r]):
            opt.zero_grad()
            x, y = batch(r, s)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    want = reference(steps, lr)
    for i, (p, q) in enumerate(zip(ddp.module.parameters(), want)):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (r, i, (p - q).abs().max().item())
    # the ranks agree bit for bit (the last joiner's model is broadcast)
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    for q in range(n):
        assert torch.equal(everyone[q], flat), (r, q)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: join {backend} {steps} ok", flush=True)


if __name__ == "__main__":
    main()
