"""Every collective's non-blocking form against its blocking form (numpy
buffers), several in flight at once; Request.testany and waitall. Run as
N ranks with the launcher's variables."""

import numpy as np

import nexar


def main():
    c = nexar.init()
    r, n = c.rank, c.size
    root = n - 1
    mine = np.array([r, 100 + r], dtype=np.int64)
    src = np.arange(2 * n, dtype=np.int64)
    counts = [k + 1 for k in range(n)]
    displs = list(np.cumsum([0] + counts[:-1]))
    tot = sum(counts)
    vsend = np.arange(r + 1, dtype=np.int64) + 10 * r
    vsrc = np.arange(tot, dtype=np.int64) + 5000
    sc = [r + j + 1 for j in range(n)]
    rc = [j + r + 1 for j in range(n)]
    a2s = np.arange(sum(sc), dtype=np.int64) + 1000 * r

    want = {}
    want["gather"] = c.gather(mine, np.zeros(2 * n, np.int64) if r == root else None, root=root)
    want["scatter"] = c.scatter(src if r == root else None, np.zeros(2, np.int64), root=root)
    want["scan"] = c.scan(mine, np.zeros(2, np.int64))
    want["exscan"] = c.exscan(mine, np.full(2, -7, np.int64))
    want["allgatherv"] = c.allgatherv(vsend, np.zeros(tot, np.int64), counts, displs)
    want["gatherv"] = c.gatherv(vsend, np.zeros(tot, np.int64) if r == root else None, counts, displs, root=root)
    want["scatterv"] = c.scatterv(vsrc if r == root else None, counts, displs,
                                  np.zeros(counts[r], np.int64), root=root)
    want["alltoallv"] = c.alltoallv(a2s, sc, None, np.zeros(sum(rc), np.int64), rc, None)

    got = {
        "gather": np.zeros(2 * n, np.int64) if r == root else None,
        "scatter": np.zeros(2, np.int64),
        "scan": np.zeros(2, np.int64),
        "exscan": np.full(2, -7, np.int64),
        "allgatherv": np.zeros(tot, np.int64),
        "gatherv": np.zeros(tot, np.int64) if r == root else None,
        "scatterv": np.zeros(counts[r], np.int64),
        "alltoallv": np.zeros(sum(rc), np.int64),
    }
    reqs = [
        c.igather(mine, got["gather"], root=root),
        c.iscatter(src if r == root else None, got["scatter"], root=root),
        c.iscan(mine, got["scan"]),
        c.iexscan(mine, got["exscan"]),
        c.iallgatherv(vsend, got["allgatherv"], counts, displs),
        c.igatherv(vsend, got["gatherv"], counts, displs, root=root),
        c.iscatterv(vsrc if r == root else None, counts, displs, got["scatterv"], root=root),
        c.ialltoallv(a2s, sc, None, got["alltoallv"], rc, None),
    ]
    first = None
    for _ in range(10_000_000):
        first = nexar.Request.testany(reqs)
        if first is not None:
            break
    assert first is not None and 0 <= first < len(reqs), first
    nexar.Request.waitall(reqs)
    for k, w in want.items():
        g = got[k]
        if w is None:
            assert g is None, k
            continue
        assert np.array_equal(g, w), (k, g, w)
    assert got["scan"][0] == r * (r + 1) // 2
    assert got["scatter"][0] == 2 * r
    print(f"rank {r}: nonblocking ok", flush=True)
    c.close()


if __name__ == "__main__":
    main()
