"""Open MPI through mpi4py (Debian python3-mpi4py, /usr/bin/python3), run by
mpirun; rank 0 prints JSON lines. Buffers are bytearrays typed as MPI.FLOAT,
so numpy is not needed. The system name comes from --name."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from mpi4py import MPI  # noqa: E402


def main():
    argv = sys.argv[1:]
    name = "mpi"
    if argv[:1] == ["--name"]:
        name, argv = argv[1], argv[2:]
    ops, sizes = common.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    F = MPI.FLOAT
    for op in ops:
        for size in sizes:
            S, cs, cr = common.layout(op, size, n)
            send = bytearray(cs * common.ELEM)
            recv = bytearray(cr * common.ELEM)
            if op == "allreduce":
                call = lambda: comm.Allreduce([send, F], [recv, F], op=MPI.SUM)  # noqa: E731
            elif op == "broadcast":
                call = lambda: comm.Bcast([send, F], root=0)  # noqa: E731
            elif op == "allgather":
                call = lambda: comm.Allgather([send, F], [recv, F])  # noqa: E731
            elif op == "reduce_scatter":
                call = lambda: comm.Reduce_scatter_block([send, F], [recv, F], op=MPI.SUM)  # noqa: E731
            else:
                call = lambda: comm.Alltoall([send, F], [recv, F])  # noqa: E731
            for _ in range(2):
                call()
            times = []
            cpu0 = common.cpu_seconds()
            for _ in range(common.iterations(S)):
                comm.Barrier()
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            if rank == 0:
                common.report(name, op, S, n, times, common.cpu_seconds() - cpu0)


if __name__ == "__main__":
    main()
