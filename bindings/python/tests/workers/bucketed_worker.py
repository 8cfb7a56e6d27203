"""One rank of the bucketed allreduce tests. argv[1]:

- "comm": nexar.Comm.allreduce_multi / iallreduce_multi on numpy arrays
  (mixed sizes and element types, tiny buckets) and their errors;
- "torch": the "nexar" backend's allreduce_coalesced (all_reduce_coalesced,
  sync and async, _coalescing_manager, staged tensors) against the expected
  sums, with per-tensor allreduce disabled so the bucketed path must serve;
  batch_isend_irecv under supports_coalescing.

Launched with the launcher's variables (torch: torchrun's too).
"""

import sys

import numpy as np

import nexar


def comm_part():
    c = nexar.init()
    r, n = c.rank, c.size
    sizes = [3, 0, 1000, 1, 70000, 17]
    tri = n * (n - 1) // 2
    for bucket in (0, 64, 8192):
        bufs = [np.arange(k, dtype=np.float64) + r for k in sizes]
        bufs.append(np.full(5, r + 1, dtype=np.int32))  # a second type: its own call
        out = c.allreduce_multi(bufs, bucket_bytes=bucket)
        assert out is bufs
        for k, b in zip(sizes, bufs):
            assert np.array_equal(b, np.arange(k) * n + tri), (bucket, k, b[:4])
        assert np.array_equal(bufs[-1], np.full(5, n * (n + 1) // 2)), bufs[-1]

        bufs = [np.arange(k, dtype=np.float32) + r for k in sizes]
        q = c.iallreduce_multi(bufs, op=nexar.Op.MAX, bucket_bytes=bucket)
        one = np.array([r + 1], dtype=np.int64)
        c.allreduce(one)  # issued while the bucketed call runs
        q.wait()
        assert one[0] == n * (n + 1) // 2
        for k, b in zip(sizes, bufs):
            assert np.array_equal(b, np.arange(k) + n - 1), (bucket, k, b[:4])
    try:
        c.iallreduce_multi([np.zeros(2, np.float32), np.zeros(2, np.int32)])
        raise AssertionError("mixed types accepted")
    except TypeError as e:
        assert "iallreduce_multi" in str(e), e
    try:
        c.allreduce_multi([np.zeros(2, np.float32)], op=nexar.Op.BAND)
        raise AssertionError("BAND on float accepted")
    except nexar.Error as e:
        assert "nexar_allreduce_multi" in str(e), e
    try:
        c.allreduce_multi([np.zeros(2, np.float32)], bucket_bytes=-1)
        raise AssertionError("negative bucket accepted")
    except (OverflowError, TypeError, nexar.Error):
        pass
    c.barrier()  # nothing was started by the failed calls
    c.close()
    print(f"rank {r}: bucketed comm ok", flush=True)


def torch_part():
    import torch
    import torch.distributed as dist
    import nexar.torch  # noqa: F401
    from nexar._comm import RawComm

    dist.init_process_group("nexar")
    r, n = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    assert getattr(pg, "supports_coalescing", False) is True
    pg.bucket_bytes = 4096  # several buckets for the lists below

    # The bucketed path must serve coalesced calls: no per-tensor allreduce.
    def no_allreduce(*a, **k):
        raise AssertionError("per-tensor allreduce used for a coalesced call")
    # (the group's own all_reduce, a C method set on it, and the raw call)
    saved = RawComm.allreduce
    RawComm.allreduce = pg.allreduce = no_allreduce

    sizes = [1, 300, 0, 2000, 7, 513]
    tri = n * (n - 1) / 2

    def make(dt=torch.float32):
        return [(torch.arange(k) + r).to(dt) for k in sizes]

    def check(ts, what):
        for k, t in zip(sizes, ts):
            want = (torch.arange(k) * n + tri).to(t.dtype)
            assert torch.equal(t, want), (what, k, t[:4], want[:4])

    ts = make()
    dist.all_reduce_coalesced(ts)
    check(ts, "sync")
    ts = make(torch.float64)
    fut = dist.all_reduce_coalesced(ts, async_op=True)
    fut.wait()
    check(ts, "async")
    ts = make()
    with dist._coalescing_manager(device=torch.device("cpu")):
        for t in ts:
            dist.all_reduce(t)
    check(ts, "coalescing manager")
    ts = make()
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    check(ts, "coalescing manager async")
    # Staged tensors: non-contiguous, int16, bool; with the queue busy.
    m = (torch.arange(12.0).reshape(3, 4) + r).t()
    s16 = torch.arange(5, dtype=torch.int16) + r
    b = torch.tensor([r == 0, False, True])
    # torch's all_reduce_coalesced wants one dtype; the group takes more.
    pg.allreduce_coalesced([m, s16], dist.AllreduceCoalescedOptions()).wait()
    assert torch.equal(m, (torch.arange(12.0).reshape(3, 4) * n + tri).t()), m
    assert torch.equal(s16, (torch.arange(5) * n + int(tri)).to(torch.int16)), s16
    dist.all_reduce_coalesced([b], op=dist.ReduceOp.SUM)
    assert b.tolist() == [True, False, True], b
    # AVG and MAX through the bucketed call.
    ts = make()
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
    for k, t in zip(sizes, ts):
        assert torch.equal(t, torch.arange(k).float() + n - 1), t[:4]

    RawComm.allreduce = saved
    del pg.allreduce
    pg._install_fast()
    # batch_isend_irecv now goes through _start/_end_coalescing.
    if n > 1:
        send = torch.full((4,), float(r))
        recv = torch.zeros(4)
        ops = [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert torch.equal(recv, torch.full((4,), float((r - 1) % n))), recv
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: bucketed torch ok", flush=True)


if __name__ == "__main__":
    {"comm": comm_part, "torch": torch_part}[sys.argv[1]]()
