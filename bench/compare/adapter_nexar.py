"""nexar through its Python package, run under `nexar run -n N`; rank 0
prints JSON lines. Used when `nexar bench --json` is not available."""

import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "bindings", "python"))
import common  # noqa: E402
import nexar  # noqa: E402
import numpy as np  # noqa: E402


def main():
    ops, sizes = common.parse_args(sys.argv[1:])
    with nexar.init() as comm:
        rank, n = comm.rank, comm.size
        for op in ops:
            for size in sizes:
                S, cs, cr = common.layout(op, size, n)
                send = np.ones(cs, dtype=np.float32)
                recv = np.empty(cr, dtype=np.float32)
                if op == "allreduce":
                    call = lambda: comm.allreduce(send, recv)  # noqa: E731
                elif op == "broadcast":
                    call = lambda: comm.broadcast(send, 0)  # noqa: E731
                elif op == "allgather":
                    call = lambda: comm.allgather(send, recv)  # noqa: E731
                elif op == "reduce_scatter":
                    call = lambda: comm.reduce_scatter(send, recv)  # noqa: E731
                else:
                    call = lambda: comm.alltoall(send, recv)  # noqa: E731
                for _ in range(2):
                    call()
                times = []
                cpu0 = common.cpu_seconds()
                for _ in range(common.iterations(S)):
                    comm.barrier()
                    t = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t)
                if rank == 0:
                    common.report("nexar", op, S, n, times, common.cpu_seconds() - cpu0)


if __name__ == "__main__":
    main()
