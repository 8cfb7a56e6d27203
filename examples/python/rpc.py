"""RPC from Python: every rank serves function 1, which squares an integer;
rank 0 calls every rank at once (non-blocking, with a deadline) and prints
the answers. Start it with the launcher:

    nexar run -n 4 -- python examples/python/rpc.py
"""

import nexar

SQUARE = 1  # the function id


def main():
    comm = nexar.init()

    def square(caller, request):
        v = int.from_bytes(request, "little", signed=True)
        return (v * v).to_bytes(16, "little", signed=True)

    comm.register(SQUARE, square)
    comm.barrier()  # every rank serves from here
    if comm.rank == 0:
        # Every call in flight at once (icall returns a future), each with
        # a deadline of 5 s; then the replies, in order.
        futures = [comm.icall(r, SQUARE, (r + 2).to_bytes(8, "little", signed=True), timeout=5)
                   for r in range(comm.size)]
        for r, f in enumerate(futures):
            v = r + 2
            got = int.from_bytes(f.result(), "little", signed=True)
            print(f"rank {r}: {v} squared is {got}", flush=True)
            assert got == v * v
        # The blocking form.
        assert int.from_bytes(comm.call(0, SQUARE, (3).to_bytes(8, "little", signed=True)), "little") == 9
    comm.barrier()  # nobody leaves while rank 0 still calls
    comm.close()


if __name__ == "__main__":
    main()
