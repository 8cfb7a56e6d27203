"""One rank of the knob tests (test_knobs.py): the NEXAR_* knobs of
core/knobs.go take effect through an explicit nexar.Comm(...) and through
the torch backend (environment or pg_options), as observed on the
communicator: its paths, a receive that times out, a mismatch.

argv[1]: "comm" (explicit Comm), "torch-env", "torch-opts" (pg_options,
which beat the environment), "mismatch-comm" (rank 0 alone sets
NEXAR_SCHEDULES); argv[2]: a file rank 0 creates when its timed-out
receive has returned (the others wait for it before they leave, so that
rank 0's receive sees silence, not a departure).
"""

import os
import sys
import time

import numpy as np

import nexar

R = int(os.environ["NEXAR_RANK"])
N = int(os.environ["NEXAR_WORLD_SIZE"])


def check_paths(paths):
    # kregular:2 on 4 ranks: r±1 are neighbours, r+2 is relayed; the
    # neighbours' data goes over plaintext TCP (NEXAR_BULK=tcp,
    # NEXAR_BULK_PLAINTEXT=1), not shared memory.
    far = (R + 2) % N
    assert paths[R] == "loopback", paths
    assert paths[far].startswith("relay via "), paths
    for nb in ((R + 1) % N, (R - 1) % N):
        assert paths[nb].startswith("tcp") and "plaintext" in paths[nb], paths
    print(f"rank {R}: paths {paths}", flush=True)


def timed_out(recv, flag):
    """Rank 0's receive from rank 1, which never sends: it must fail with a
    timeout bounded by NEXAR_TIMEOUT (3 s), not the 5-minute default or
    torch's 30 minutes. The others wait for rank 0 to be done."""
    if R == 0:
        t0 = time.monotonic()
        try:
            recv()
        except Exception as e:  # noqa: BLE001 - the kind is checked below
            took = time.monotonic() - t0
            print(f"rank 0: receive failed after {took:.1f} s: {type(e).__name__}: {e}", flush=True)
            assert "timeout" in (type(e).__name__ + str(e)).lower(), e
            # Bounded by the knob: far below the defaults, at least the knob.
            assert 2.5 <= took < 60, took
        else:
            raise AssertionError("a receive nobody sends to completed")
        open(flag, "w").close()
    else:
        deadline = time.monotonic() + 120
        while not os.path.exists(flag):
            assert time.monotonic() < deadline, "rank 0 never finished its receive"
            time.sleep(0.05)


def comm_case(flag):
    c = nexar.Comm(rank=R, world_size=N, seed=os.environ["NEXAR_SEED"], token=os.environ["NEXAR_TOKEN"])
    x = np.full(1 << 16, float(R), dtype=np.float64)
    c.allreduce(x)
    assert x[0] == N * (N - 1) / 2, x[0]
    check_paths(c.paths())
    c.barrier()
    timed_out(lambda: c.recv(np.zeros(1, dtype=np.int64), 1, tag=77), flag)
    c.close()


def mismatch_comm():
    if R == 0:
        os.environ["NEXAR_SCHEDULES"] = "rank"  # read by libnexar when the Comm is made
    c = nexar.Comm(rank=R, world_size=N, seed=os.environ["NEXAR_SEED"], token=os.environ["NEXAR_TOKEN"])
    x = np.ones(1000, dtype=np.float32)
    try:
        c.allreduce(x)
    except nexar.MismatchError as e:
        print(f"rank {R}: mismatch as expected: {e}", flush=True)
    else:
        raise AssertionError("ranks with different NEXAR_SCHEDULES ran an allreduce")
    c.close()


def torch_case(flag, opts):
    import torch
    import torch.distributed as dist

    import nexar.torch

    pg_options = nexar.torch.Options(topology="kregular:2", bulk="tcp", bulk_plaintext=True) if opts else None
    dist.init_process_group("nexar", rank=R, world_size=N, pg_options=pg_options)
    x = torch.full((1 << 16,), float(R), dtype=torch.float64)
    dist.all_reduce(x)
    assert x[0].item() == N * (N - 1) / 2, x[0]
    pg = dist.distributed_c10d._get_default_group()
    comm = pg._get_backend(torch.device("cpu")).comm if hasattr(pg, "_get_backend") else pg.comm
    check_paths(comm.paths())
    dist.barrier()
    timed_out(lambda: dist.recv(torch.zeros(1, dtype=torch.int64), src=1, tag=77), flag)
    dist.destroy_process_group()


def main():
    mode, flag = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "comm":
        comm_case(flag)
    elif mode == "mismatch-comm":
        mismatch_comm()
    elif mode in ("torch-env", "torch-opts"):
        torch_case(flag, mode == "torch-opts")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"rank {R}: ok", flush=True)


if __name__ == "__main__":
    main()
