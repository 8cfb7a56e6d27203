"""torch.distributed collectives through a backend: Gloo (system "gloo"),
or nexar (`--backend nexar --name nexar-torch`: what a torch user of the
nexar backend gets). One process per rank, started by compare.py with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; rank 0 prints JSON lines. Runs
under the project venv (torch)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    argv, backend, name = sys.argv[1:], "gloo", "gloo"
    while argv and argv[0] in ("--backend", "--name"):
        if argv[0] == "--backend":
            backend = argv[1]
        else:
            name = argv[1]
        argv = argv[2:]
    ops, sizes = common.parse_args(argv)
    if backend == "nexar":
        import nexar.torch  # noqa: F401  registers the backend
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    for op in ops:
        for size in sizes:
            S, cs, cr = common.layout(op, size, n)
            send = torch.ones(cs, dtype=torch.float32)
            recv = torch.empty(cr, dtype=torch.float32)
            if op == "allreduce":
                call = lambda: dist.all_reduce(send)  # noqa: E731
            elif op == "broadcast":
                call = lambda: dist.broadcast(send, 0)  # noqa: E731
            elif op == "allgather":
                call = lambda: dist.all_gather_into_tensor(recv, send)  # noqa: E731
            elif op == "reduce_scatter":
                # Gloo has no reduce_scatter_tensor; reduce_scatter on chunk
                # lists is what torch users get (it is not native either).
                chunks = list(send.chunk(n))

                def call():
                    try:
                        dist.reduce_scatter(recv, chunks)
                    except RuntimeError:  # not implemented by this Gloo
                        dist.all_reduce(send)
                        recv.copy_(send[rank * cr:(rank + 1) * cr])
            else:
                call = lambda: dist.all_to_all_single(recv, send)  # noqa: E731
            for _ in range(2):
                call()
            times = []
            cpu0 = common.cpu_seconds()
            for _ in range(common.iterations(S)):
                dist.barrier()
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            if rank == 0:
                common.report(name, op, S, n, times, common.cpu_seconds() - cpu0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
