"""Allreduce a numpy array across ranks.

    nexar run -n 4 -- python examples/python/allreduce_numpy.py
    torchrun --nproc-per-node 4 examples/python/allreduce_numpy.py   (uses MASTER_ADDR/PORT;
        set NEXAR_TOKEN to the same secret on every rank)
"""

import numpy as np

import nexar


def main():
    with nexar.init() as comm:
        x = np.full(8, comm.rank + 1, dtype=np.float32)
        comm.allreduce(x)  # in place, sum over ranks
        expect = comm.size * (comm.size + 1) / 2
        assert np.all(x == expect), x
        # out of place, non-blocking, other ops and dtypes
        y = np.empty(8, dtype=np.float32)
        req = comm.iallreduce(np.arange(8, dtype=np.float32) * comm.rank, y, op=nexar.MAX)
        req.wait()
        gathered = np.empty(comm.size, dtype=np.int64)
        comm.allgather(np.array([comm.rank], dtype=np.int64), gathered)
        comm.barrier()
        if comm.rank == 0:
            print(f"allreduce over {comm.size} ranks: {x[:4]} ... max: {y[:4]} ... ranks: {gathered}")


if __name__ == "__main__":
    main()
