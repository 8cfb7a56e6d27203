"""The torch backend's fast paths (issue 15): a synchronous all_reduce,
broadcast or barrier of one plain CPU tensor runs in the caller's thread;
an asynchronous one starts in the library and its Work waits in C. Checks
results, the Work types, futures, and issue order when fast and queued
operations mix. Run as 2+ ranks with torchrun's variables."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401
from nexar.torch._work import DoneWork, StartedWork


def main():
    dist.init_process_group("nexar")
    r, n = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cpu"))
    tri = n * (n - 1) // 2

    # Synchronous: run in place, in this thread; done, no Work is returned
    # (torch's collectives then skip the wait).
    t = torch.full((5,), float(r))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(tri))), t
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    t = torch.ones(3)
    w = be.allreduce([t], opts)
    assert w is None, type(w)
    assert torch.equal(t, torch.full((3,), float(n))), t
    b = torch.full((4,), float(r), dtype=torch.float64)
    bo = dist.BroadcastOptions()
    bo.rootRank, bo.asyncOp = n - 1, False
    assert be.broadcast([b], bo) is None
    assert torch.equal(b, torch.full((4,), float(n - 1), dtype=torch.float64)), b
    be.barrier(dist.BarrierOptions()).wait()  # asyncOp true by default: a Work
    bo = dist.BarrierOptions()
    bo.asyncOp = False
    assert be.barrier(bo) is None

    # Asynchronous: started in the library; wait() in C; a future on demand.
    ws = [dist.all_reduce(torch.full((1000,), float(r + k)), async_op=True) for k in range(4)]
    for k, w in enumerate(ws):
        assert isinstance(w, StartedWork), type(w)
        w.wait(timeout=timedelta(seconds=60))
    outs = []
    for k in range(4):
        t = torch.full((1 << 16,), float(r + k))
        outs.append((t, dist.all_reduce(t, async_op=True).get_future()))
    for k, (t, f) in enumerate(outs):
        v = f.wait()[0]
        assert v is t and torch.equal(t, torch.full((1 << 16,), float(tri + n * k))), (k, t[:3])
    b = torch.arange(7, dtype=torch.int64) * (r + 1)
    dist.broadcast(b, src=n - 1)
    assert torch.equal(b, torch.arange(7, dtype=torch.int64) * n), b

    # Issue order across the paths: slow ones (non-contiguous, bool,
    # int16 staging) between fast ones, all asynchronous; every rank
    # issues the same order, so results must match exactly.
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    works = []
    for k in range(6):
        works.append(dist.all_reduce(torch.full((4,), float(k)), async_op=True))       # fast
        works.append(dist.all_reduce(x.t(), async_op=True))                            # queued
        works.append(dist.all_reduce(torch.tensor([r == 0, False]), async_op=True))    # queued (bool)
        works.append(dist.all_reduce(torch.full((3,), k, dtype=torch.int16), async_op=True))  # queued
    for w in works:
        w.wait()
    # x was reduced 6 times in place (each time summing every rank's current x).
    cur = [torch.arange(12, dtype=torch.float32).reshape(3, 4) + q for q in range(n)]
    for _ in range(6):
        s = sum(cur)
        cur = [s.clone() for _ in range(n)]
    assert torch.equal(x, cur[r]), (x, cur[r])

    # An error in a started operation reaches wait() and the future.
    bad = dist.all_reduce(torch.ones(2) if r == 0 else torch.ones(3), async_op=True)
    fut = bad.get_future()
    mismatched(bad.wait, "a mismatched all_reduce")
    try:
        fut.wait()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the future of a failed all_reduce succeeded")
    # A synchronous call that fails (the group failed above) returns a
    # failed Work whose wait() raises, and dist.all_reduce raises.
    w = be.allreduce([torch.ones(2)], opts)
    assert isinstance(w, DoneWork), type(w)
    mismatched(w.wait, "a synchronous all_reduce on a failed group")
    mismatched(lambda: dist.all_reduce(torch.ones(2)), "dist.all_reduce on a failed group")
    print(f"rank {r}: fastpath ok", flush=True)
    sys.stdout.flush()


def mismatched(call, what):
    """call() must raise the group's mismatch error."""
    try:
        call()
    except Exception as e:  # noqa: BLE001
        assert "MISMATCH" in str(e) or "called" in str(e), e
    else:
        raise AssertionError(f"{what} succeeded")


if __name__ == "__main__":
    main()
