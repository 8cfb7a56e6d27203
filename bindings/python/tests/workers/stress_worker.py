"""Every torch collective on the "nexar" backend, synchronous and
asynchronous, many times, with the tensors and Works of asynchronous calls
dropped as soon as torch allows (issue 32): what the library still writes
must stay alive without the caller's help. Run under `make test-asan` with
more calls, where a write to freed memory is reported at once. Run as 2+
ranks with torchrun's variables:

  stress_worker.py stress CALLS   CALLS calls (each rank the same sequence); results of
                                  the synchronous and the kept ones checked
  stress_worker.py lifetime       a dropped started all_reduce keeps its tensor until
                                  the peers join it, then lets go of it
"""

import gc
import sys
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401
from nexar.torch._work import StartedWork


def ops(r, n):
    """(name, fn(k, sync)) for every collective; fn issues one call and,
    when sync, checks its result. k varies the sizes (0 included)."""
    tri = float(n * (n - 1) // 2)

    def size(k):
        return (0, 1, 7, 100, 4099)[k % 5]

    def all_reduce_fast(k, sync):
        m = size(k)
        if not sync:
            dist.all_reduce(torch.full((m,), float(r)), async_op=True)
            return
        t = torch.full((m,), float(r))
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((m,), tri)), ("all_reduce", k)

    def all_reduce_staged(k, sync):
        # int16 (staged through int32), bool, a non-contiguous view, MAX
        m = size(k) + 2
        x = torch.arange(2 * m, dtype=torch.float64).reshape(2, m)[:, ::2] + r  # non-contiguous
        ts = [torch.full((m,), r + 1, dtype=torch.int16), torch.tensor([r == 0] * m), x]
        if not sync:
            for t in ts:
                dist.all_reduce(t, async_op=True)
            dist.all_reduce(torch.full((m,), r, dtype=torch.int64), op=dist.ReduceOp.MAX, async_op=True)
            del ts, x
            return
        for t in ts:
            dist.all_reduce(t)
        assert torch.equal(ts[0], torch.full((m,), n * (n + 1) // 2, dtype=torch.int16)), k
        assert bool(ts[1].all()), k
        base = torch.arange(2 * m, dtype=torch.float64).reshape(2, m)[:, ::2]
        assert torch.equal(x, n * base + tri), k
        y = torch.full((m,), r, dtype=torch.int64)
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        assert torch.equal(y, torch.full((m,), n - 1, dtype=torch.int64)), k

    def broadcast(k, sync):
        m, root = size(k), k % n
        if not sync:
            dist.broadcast(torch.full((m,), float(r), dtype=torch.float64), src=root, async_op=True)
            dist.broadcast(torch.zeros(3, m + 1)[:, 0], src=root, async_op=True)  # staged view
            return
        t = torch.full((m,), float(r), dtype=torch.float64)
        dist.broadcast(t, src=root)
        assert torch.equal(t, torch.full((m,), float(root), dtype=torch.float64)), k

    def reduce(k, sync):
        m, root = size(k), k % n
        t = torch.full((m,), float(r))
        w = dist.reduce(t, dst=root, async_op=not sync)
        if not sync:
            del w, t
            return
        if r == root:
            assert torch.equal(t, torch.full((m,), tri)), k

    def all_gather(k, sync):
        m = size(k)
        outs = [torch.empty(m) for _ in range(n)]
        w = dist.all_gather(outs, torch.full((m,), float(r)), async_op=not sync)
        if not sync:
            del w, outs
            return
        for q in range(n):
            assert torch.equal(outs[q], torch.full((m,), float(q))), k

    def all_gather_into_tensor(k, sync):
        m = size(k)
        out = torch.empty(n * m)
        w = dist.all_gather_into_tensor(out, torch.full((m,), float(r)), async_op=not sync)
        if not sync:
            del w, out
            return
        assert torch.equal(out, torch.arange(n).repeat_interleave(m).float()), k

    def reduce_scatter(k, sync):
        m = size(k)
        out = torch.empty(m)
        w = dist.reduce_scatter(out, [torch.full((m,), float(r + q)) for q in range(n)], async_op=not sync)
        if not sync:
            del w, out
            return
        assert torch.equal(out, torch.full((m,), tri + n * r)), k

    def reduce_scatter_tensor(k, sync):
        m = size(k)
        out = torch.empty(m)
        w = dist.reduce_scatter_tensor(out, torch.full((n * m,), float(r)), async_op=not sync)
        if not sync:
            del w, out
            return
        assert torch.equal(out, torch.full((m,), tri)), k

    def all_to_all_single(k, sync):
        m = size(k)
        out = torch.empty(n * m)
        inp = torch.arange(n * m, dtype=torch.float32) + 1000 * r
        w = dist.all_to_all_single(out, inp, async_op=not sync)
        if not sync:
            del w, out, inp
            return
        want = torch.cat([torch.arange(r * m, (r + 1) * m, dtype=torch.float32) + 1000 * q for q in range(n)])
        assert torch.equal(out, want), k

    def all_to_all(k, sync):
        m = size(k)
        outs = [torch.empty(m) for _ in range(n)]
        w = dist.all_to_all(outs, [torch.full((m,), float(10 * r + q)) for q in range(n)], async_op=not sync)
        if not sync:
            del w, outs
            return
        for q in range(n):
            assert torch.equal(outs[q], torch.full((m,), float(10 * q + r))), k

    def gather_scatter(k, sync):
        m, root = size(k), k % n
        gl = [torch.empty(m) for _ in range(n)] if r == root else None
        w1 = dist.gather(torch.full((m,), float(r)), gl, dst=root, async_op=not sync)
        sl = [torch.full((m,), float(q)) for q in range(n)] if r == root else None
        out = torch.empty(m)
        w2 = dist.scatter(out, sl, src=root, async_op=not sync)
        if not sync:
            del w1, w2, gl, sl, out
            return
        if r == root:
            for q in range(n):
                assert torch.equal(gl[q], torch.full((m,), float(q))), k
        assert torch.equal(out, torch.full((m,), float(r))), k

    def barrier(k, sync):
        w = dist.barrier(async_op=not sync)
        del w

    def send_recv(k, sync):
        m = size(k)
        nxt, prv = (r + 1) % n, (r - 1) % n
        got = torch.empty(m)
        if not sync:
            dist.isend(torch.full((m,), float(r)), nxt, tag=k)
            dist.irecv(got, prv, tag=k)
            del got
            return
        ws = [dist.isend(torch.full((m,), float(r)), nxt, tag=k), dist.irecv(got, prv, tag=k)]
        for w in ws:
            w.wait()
        assert torch.equal(got, torch.full((m,), float(prv))), k

    def batch_p2p(k, sync):
        m = size(k)
        nxt, prv = (r + 1) % n, (r - 1) % n
        got = torch.empty(m + 1)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((m + 1,), float(r)), nxt),
                                       dist.P2POp(dist.irecv, got, prv)])
        if not sync:
            del reqs, got
            return
        for w in reqs:
            w.wait()
        assert torch.equal(got, torch.full((m + 1,), float(prv))), k

    def coalesced(k, sync):
        m = size(k)
        ts = [torch.full((m,), float(r)), torch.full((m + 3,), float(r))]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        if not sync:
            del cm, ts
            return
        cm.wait()
        for t in ts:
            assert torch.equal(t, torch.full_like(t, tri)), k

    def future_only(k, sync):
        # the Work dropped, its future kept: the Completer holds the work
        m = size(k) + 1
        fut = dist.all_reduce(torch.full((m,), float(r)), async_op=True).get_future()
        if sync:
            assert torch.equal(fut.wait()[0], torch.full((m,), tri)), k

    def kept_tensor_dropped_work(k, sync):
        # the tensor kept, its Work dropped: the result still lands in it
        # (checked after a synchronous all_reduce, which completes after it)
        m = size(k) + 1
        t = torch.full((m,), float(r))
        dist.all_reduce(t, async_op=True)
        dist.all_reduce(torch.zeros(1))
        if sync:
            end = time.monotonic() + 60
            while not torch.equal(t, torch.full((m,), tri)):
                assert time.monotonic() < end, (k, t)
                time.sleep(0.001)

    return [(f.__name__, f) for f in (
        all_reduce_fast, all_reduce_staged, broadcast, reduce, all_gather, all_gather_into_tensor,
        reduce_scatter, reduce_scatter_tensor, all_to_all_single, all_to_all, gather_scatter, barrier,
        send_recv, batch_p2p, coalesced, future_only, kept_tensor_dropped_work)]


def stress(calls: int):
    dist.init_process_group("nexar", timeout=timedelta(seconds=120))
    r, n = dist.get_rank(), dist.get_world_size()
    table = ops(r, n)
    done, k = 0, 0
    while done < calls:
        for name, fn in table:
            sync = (k // len(table)) % 3 == 2  # two async rounds, then a checked one
            try:
                fn(k, sync)
            except AssertionError as e:
                raise AssertionError(f"rank {r}: {name} (call {done}, {'sync' if sync else 'async'}): {e}") from None
            done += 1
            k += 1
        gc.collect()
    # In step: every rank has run the same calls (a check all_reduce).
    t = torch.full((1,), float(done))
    dist.all_reduce(t)
    assert t.item() == n * done, (t, done)
    # Shut down with dropped operations possibly still in flight.
    for _ in range(8):
        dist.all_reduce(torch.ones(64), async_op=True)
    dist.destroy_process_group()
    print(f"rank {r}: stress {done} calls ok", flush=True)


def lifetime():
    dist.init_process_group("nexar", timeout=timedelta(seconds=120))
    r, n = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    if r == 0:
        # Dropped at once, before the peers call: the operation is started
        # and cannot end until they do. The tensor must outlive the Work.
        t = torch.full((1000,), 1.0)
        ref = weakref.ref(t)
        w = dist.all_reduce(t, async_op=True)
        assert isinstance(w, StartedWork), type(w)
        del w, t
        gc.collect()
        time.sleep(0.2)
        gc.collect()
        assert ref() is not None, "rank 0: the tensor of a running all_reduce was freed with its Work"
        store.set("nexar-lifetime", "go")
        end = time.monotonic() + 60
        while ref() is not None:  # released once the operation ended
            assert time.monotonic() < end, "rank 0: the dropped all_reduce's tensor was never released"
            time.sleep(0.01)
            gc.collect()
    else:
        store.wait(["nexar-lifetime"], timedelta(seconds=60))
        t = torch.full((1000,), 1.0)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((1000,), float(n))), t
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: lifetime ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "stress":
        stress(int(sys.argv[2]))
    else:
        lifetime()
