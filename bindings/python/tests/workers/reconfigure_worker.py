"""A "nexar" torch process group reconfigured in place (torchft's way), 3
ranks started with torchrun's variables and NEXAR_ON_FAILURE=manual:
grow_() with nobody waiting keeps the 3; configure() through the job's
TCPStore (a new prefix) rebuilds the group with the ranks reversed; rank 1
(old numbering) dies and the survivors shrink_() the same object to 2.
The group object stays the same throughout; its rank() and size() follow."""

import os
import sys

import torch
import torch.distributed as dist

import nexar.torch
from nexar.torch import ProcessGroupNexar


def total(pg, v):
    t = torch.tensor([float(v)])
    pg.allreduce([t]).wait()
    return t.item()


def main():
    nexar.torch.register()
    dist.init_process_group("nexar")
    me = dist.get_rank()
    pg = dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupNexar):
        pg = pg._get_backend(torch.device("cpu"))
    obj = pg
    assert total(pg, me + 1) == 6

    pg.grow_()
    assert pg is obj and pg.size() == 3 and pg.rank() == me, (pg.rank(), pg.size())
    assert total(pg, me + 1) == 6

    store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}/quorum-1"
    pg.configure(store, 2 - me, 3)
    assert pg is obj and pg.rank() == 2 - me and pg.size() == 3, (pg.rank(), pg.size())
    got = torch.tensor([float(me)])
    pg.broadcast([got], dist.BroadcastOptions()).wait()  # from new rank 0: old rank 2
    assert got.item() == 2.0, got
    assert total(pg, pg.rank() + 1) == 6

    # Old rank 1 dies after everyone passed this barrier.
    pg.barrier().wait()
    if me == 1:
        sys.stdout.flush()
        os._exit(0)
    try:
        for _ in range(1000):
            total(pg, 1)
        raise AssertionError("no failure after rank 1 died")
    except (RuntimeError, nexar.Error) as e:
        print(f"rank {me}: failed as expected: {type(e).__name__}", flush=True)
    pg.shrink_()
    assert pg is obj and pg.size() == 2, pg.size()
    assert total(pg, pg.rank() + 1) == 3
    print(f"rank {me}: reconfigure ok, now rank {pg.rank()} of {pg.size()}", flush=True)
    pg.shutdown()


if __name__ == "__main__":
    main()
