"""One rank of the multi-process Python API test: every call, every dtype,
checked against a reference computed locally. Run by test_api.py."""

import sys

import numpy as np

import nexar

try:
    import ml_dtypes  # noqa: F401
except ImportError:
    ml_dtypes = None

import torch

NP_DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]
TORCH_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64]


def data(rank, n, dt, salt=0):
    # small values so that sums/products are exact in every dtype
    return (np.arange(n) % 3 + rank + 1 + salt).astype(dt)


def ref(op, arrs):
    a = np.stack([x.astype(np.float64) if x.dtype.kind == "f" else x for x in arrs])
    if op == nexar.SUM:
        return a.sum(0)
    if op == nexar.PROD:
        return a.prod(0)
    if op == nexar.MIN:
        return a.min(0)
    if op == nexar.MAX:
        return a.max(0)
    if op == nexar.AVG:
        return a.mean(0)
    r = a[0]
    for x in a[1:]:
        r = {nexar.BAND: np.bitwise_and, nexar.BOR: np.bitwise_or, nexar.BXOR: np.bitwise_xor}[op](r, x)
    return r


def check(name, got, want):
    got = np.asarray(got, dtype=np.float64) if np.asarray(got).dtype.kind == "f" else np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape or not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2):
        raise AssertionError(f"{name}: got {got}, want {want}")


def main():
    c = nexar.init()
    r, n = c.rank, c.size
    N = 7
    ops_int = [nexar.SUM, nexar.PROD, nexar.MIN, nexar.MAX, nexar.BAND, nexar.BOR, nexar.BXOR]
    ops_float = [nexar.SUM, nexar.PROD, nexar.MIN, nexar.MAX, nexar.AVG]
    for dt in NP_DTYPES:
        ops = ops_float if np.dtype(dt).kind == "f" else ops_int
        all_in = [data(q, N, dt) for q in range(n)]
        for op in ops:
            x = data(r, N, dt)
            out = np.zeros_like(x)
            c.allreduce(x, out, op=op)
            check(f"allreduce {dt} {op!r}", out, ref(op, all_in).astype(dt))
            c.allreduce(x, op=op)  # in place
            check(f"allreduce in place {dt} {op!r}", x, ref(op, all_in).astype(dt))
            x = data(r, N, dt)
            req = c.iallreduce(x, np.zeros_like(x), op=op)
            assert req.wait() is None
            x = data(r, N, dt)
            res = np.zeros_like(x)
            c.reduce(x, res, op=op, root=n - 1)
            if r == n - 1:
                check(f"reduce {dt}", res, ref(op, all_in).astype(dt))
            x = data(r, N, dt)
            c.scan(x, res, op=op)
            check(f"scan {dt} {op!r}", res, ref(op, all_in[: r + 1]).astype(dt))
            if r > 0:
                c.exscan(x, res, op=op)
                check(f"exscan {dt} {op!r}", res, ref(op, all_in[:r]).astype(dt))
            else:
                c.exscan(x, res, op=op)
            big = np.concatenate([data(r, N, dt, salt=b) for b in range(n)])
            rs = np.zeros(N, dtype=dt)
            c.reduce_scatter(big, rs, op=op)
            check(f"reduce_scatter {dt} {op!r}", rs, ref(op, [data(q, N, dt, salt=r) for q in range(n)]).astype(dt))
        # data movement
        x = data(r, N, dt)
        b = x.copy() if r == 0 else np.zeros_like(x)
        c.broadcast(b, root=0)
        check("broadcast", b, data(0, N, dt))
        ag = np.zeros(n * N, dtype=dt)
        c.allgather(x, ag)
        check("allgather", ag, np.concatenate(all_in))
        ag2 = np.zeros(n * N, dtype=dt)
        ag2[r * N:(r + 1) * N] = x
        c.allgather(None, ag2)
        check("allgather in place", ag2, np.concatenate(all_in))
        counts = [q + 1 for q in range(n)]
        agv = np.zeros(sum(counts), dtype=dt)
        c.allgatherv(data(r, r + 1, dt), agv, counts)
        check("allgatherv", agv, np.concatenate([data(q, q + 1, dt) for q in range(n)]))
        a2a_in = np.concatenate([data(r, 2, dt, salt=j) for j in range(n)])
        a2a = np.zeros_like(a2a_in)
        c.alltoall(a2a_in, a2a)
        check("alltoall", a2a, np.concatenate([data(j, 2, dt, salt=r) for j in range(n)]))
        # alltoallv: rank i sends j+1 elements to rank j
        sc = [j + 1 for j in range(n)]
        rc = [r + 1] * n
        sv = np.concatenate([data(r, j + 1, dt, salt=j) for j in range(n)])
        rv = np.zeros(sum(rc), dtype=dt)
        c.alltoallv(sv, sc, None, rv, rc, None)
        check("alltoallv", rv, np.concatenate([data(i, r + 1, dt, salt=r) for i in range(n)]))
        g = np.zeros(n * N, dtype=dt) if r == 0 else None
        c.gather(x, g, root=0)
        if r == 0:
            check("gather", g, np.concatenate(all_in))
        gv = np.zeros(sum(counts), dtype=dt) if r == 0 else None
        c.gatherv(data(r, r + 1, dt), gv, counts, root=0)
        if r == 0:
            check("gatherv", gv, np.concatenate([data(q, q + 1, dt) for q in range(n)]))
        sc_in = np.concatenate(all_in) if r == 0 else None
        so = np.zeros(N, dtype=dt)
        c.scatter(sc_in, so, root=0)
        check("scatter", so, data(r, N, dt))
        sv_in = np.concatenate([data(q, q + 1, dt) for q in range(n)]) if r == 0 else None
        svo = np.zeros(r + 1, dtype=dt)
        c.scatterv(sv_in, counts, None, svo, root=0)
        check("scatterv", svo, data(r, r + 1, dt))
        # point to point: ring
        nxt, prv = (r + 1) % n, (r - 1) % n
        rb = np.zeros(N, dtype=dt)
        if n > 1:
            q = c.irecv(rb, prv, tag=5)
            c.send(x, nxt, tag=5)
            st = q.wait()
            assert st.source == prv and st.tag == 5 and st.count == N, st
            check("send/recv", rb, data(prv, N, dt))
            s = c.isend(x, nxt, tag=6)
            st = c.recv(rb, nexar.ANY_SOURCE, tag=6)
            s.wait()
            assert st.source == prv
    # non-blocking collectives, several in flight
    reqs, bufs = [], []
    for i in range(4):
        x = np.full(5, r + i, dtype=np.float32)
        bufs.append(x)
        reqs.append(c.iallreduce(x))
    b = np.full(3, 7 if r == 0 else 0, dtype=np.int32)
    reqs.append(c.ibroadcast(b, 0))
    g = np.zeros(2 * n, dtype=np.int64)
    reqs.append(c.iallgather(np.full(2, r, dtype=np.int64), g))
    reqs.append(c.ibarrier())
    for q in reqs:
        q.wait()
    for i, x in enumerate(bufs):
        check("iallreduce in flight", x, np.full(5, sum(q + i for q in range(n)), dtype=np.float32))
    check("ibroadcast", b, np.full(3, 7))
    check("iallgather", g, np.repeat(np.arange(n), 2))
    # torch tensors: every dtype, non-contiguous, bfloat16
    for dt in TORCH_DTYPES:
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dt)
        view = t[:, 1]  # non-contiguous
        c.allreduce(view)
        want = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        want[:, 1] *= n
        assert torch.equal(t.float(), want), (dt, t)
        o = torch.empty(n * 4, dtype=dt)
        c.allgather(torch.full((4,), r, dtype=dt), o)
        assert torch.equal(o.float(), torch.arange(n).repeat_interleave(4).float()), (dt, o)
    # split
    sub = c.split(r % 2, key=-r)
    assert sub is not None and sub.size == len([q for q in range(n) if q % 2 == r % 2])
    x = np.ones(1, dtype=np.int64)
    sub.allreduce(x)
    assert x[0] == sub.size
    sub.close()
    none = c.split(nexar.UNDEFINED if r == 0 else 1)
    assert (none is None) == (r == 0)
    if none:
        none.close()
    # errors
    try:
        c.broadcast(np.zeros(1), root=n)
    except nexar.InvalidArgumentError as e:
        assert e.code == 1 and "root" in e.message, e
    else:
        raise AssertionError("bad root accepted")
    if n > 1:
        small = np.zeros(1, dtype=np.int32)
        if r == 0:
            c.send(np.zeros(4, dtype=np.int32), 1, tag=9)
        elif r == 1:
            try:
                c.recv(small, 0, tag=9)
            except nexar.TruncatedError:
                pass
            else:
                raise AssertionError("truncation not reported")
    c.barrier()
    c.close()  # at once: a graceful departure must not fail slower peers
    try:
        c.barrier()
    except nexar.ClosedError:
        pass
    else:
        raise AssertionError("closed comm usable")
    print(f"rank {r}: ok")


if __name__ == "__main__":
    main()
    sys.exit(0)
