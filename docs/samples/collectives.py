import numpy as np

import nexar

with nexar.init() as comm:
    r, n = comm.rank, comm.size
    # non-blocking allreduce with another operator
    y = np.empty(3, dtype=np.float64)
    req = comm.iallreduce(np.array([r, -r, 2.0 * r]), y, op=nexar.MAX)
    req.wait()
    assert y.tolist() == [n - 1, 0, 2.0 * (n - 1)]
    # allgather and broadcast
    ranks = np.empty(n, dtype=np.int64)
    comm.allgather(np.array([r], dtype=np.int64), ranks)
    assert ranks.tolist() == list(range(n))
    b = np.array([42 if r == 0 else 0], dtype=np.int32)
    comm.broadcast(b, root=0)
    assert b[0] == 42
    # point to point: a ring
    out = np.array([r], dtype=np.int32)
    got = np.empty(1, dtype=np.int32)
    s = comm.isend(out, (r + 1) % n, tag=7)
    comm.recv(got, (r - 1) % n, tag=7)
    s.wait()
    assert got[0] == (r - 1) % n
