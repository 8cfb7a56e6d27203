"""One rank of the torch 2.x feature tests: dist.split_group and
torch.compile of a DDP model, each on a "nexar" group and on a gloo group
with the same inputs, results compared. Launched with torchrun's variables.

argv[1]: "split" or "compile"; argv[2] (compile): the torch.compile backend.
"""

import os
import sys

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401  (registers the backend)

R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])


def same(name, a, b, atol=0.0):
    ok = torch.allclose(a.double(), b.double(), atol=atol, rtol=0) if atol else torch.equal(a, b)
    if not ok:
        raise AssertionError(f"rank {R}: {name}: nexar {a} != gloo {b}")


def groups():
    dist.init_process_group("gloo")
    nx = dist.new_group(backend="nexar")
    gl = dist.new_group(backend="gloo")
    assert dist.get_backend(nx) == "nexar", dist.get_backend(nx)
    return nx, gl


def split():
    assert N == 3, "the splits below are written for 3 ranks"
    nx, gl = groups()
    # the order within a split is the new group's rank order
    for splits in ([[2, 0], [1]], [[0, 1]]):
        mine = next((s for s in splits if R in s), None)
        out = []
        for parent in (nx, gl):
            g = dist.split_group(parent_pg=parent, split_ranks=splits)
            if mine is None:
                assert g is dist.GroupMember.NON_GROUP_MEMBER, (splits, g)
                out.append(None)
                continue
            assert g.rank() == mine.index(R) and g.size() == len(mine), (splits, g.rank(), g.size())
            assert dist.get_process_group_ranks(g) == mine, dist.get_process_group_ranks(g)
            t = torch.arange(4, dtype=torch.float32) + 10 * R
            dist.all_reduce(t, group=g)
            b = torch.full((3,), float(R))
            dist.broadcast(b, group=g, group_src=len(mine) - 1)
            ag = [torch.empty(2, dtype=torch.int64) for _ in mine]
            dist.all_gather(ag, torch.tensor([R, R * R]), group=g)
            out.append((t, b, torch.cat(ag)))
            if g is not None and parent is nx:
                assert dist.get_backend(g) == "nexar", dist.get_backend(g)
        if out[0] is not None:
            for name, a, b in zip(("all_reduce", "broadcast", "all_gather"), out[0], out[1]):
                same(f"split {splits} {name}", a, b)
            print(f"rank {R}: split {splits} ranks {dist.get_process_group_ranks(g)} ok", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {R}: split ok", flush=True)


def _model():
    torch.manual_seed(0)
    # BatchNorm has buffers: DDP broadcasts them in every forward, from the
    # compiled frame (what tripped Dynamo on the backend's Python methods)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def compile_ddp(backend):
    from torch.nn.parallel import DistributedDataParallel as DDP

    nx, gl = groups()
    res = []
    for g in (nx, gl):
        torch._dynamo.reset()
        model = DDP(_model(), process_group=g)
        step = torch.compile(model, backend=backend)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + R)
        for _ in range(4):
            x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(step(x), y).backward()
            opt.step()

        # a collective inside a compiled function, synchronous and async
        @torch.compile(backend=backend)
        def f(x):
            dist.all_reduce(x, group=g)
            w = dist.all_reduce(x * 2, group=g, async_op=True)
            w.wait()
            return x + 1
        t = f(torch.arange(4, dtype=torch.float32) + R)
        res.append(([p.detach().clone() for p in model.module.parameters()]
                    + [b.clone() for b in model.module.buffers()], t))
    for i, (a, b) in enumerate(zip(res[0][0], res[1][0])):
        same(f"compiled ddp tensor {i}", a, b, atol=1e-5)
    same("compiled all_reduce", res[0][1], res[1][1])
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {R}: compile ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "split":
        split()
    else:
        compile_ddp(sys.argv[2])
