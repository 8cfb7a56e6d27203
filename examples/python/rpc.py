"""RPC from Python: every rank serves function 1, which squares an integer;
rank 0 calls every rank and prints the answers. Start it with the launcher:

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
        for r in range(comm.size):
            v = r + 2
            got = int.from_bytes(comm.call(r, SQUARE, v.to_bytes(8, "little", signed=True)), "little", signed=True)
            print(f"rank {r}: {v} squared is {got}", flush=True)
            assert got == v * v
    comm.barrier()  # nobody leaves while rank 0 still calls
    comm.close()


if __name__ == "__main__":
    main()
