"""One rank of the statistics test: Comm.stats() after real traffic, with
the memory profile from argv[1] (NEXAR_MEMORY_PROFILE, set by the test).
Rank 1 sends rank 0 a message before rank 0 posts the receive: rank 0 sees
it buffered, then not once received (rank 1 sends nothing more meanwhile).

Launched with the launcher's variables.
"""

import sys
import time

import numpy as np

import nexar


def main():
    c = nexar.init()
    r, n = c.rank, c.size
    x = np.full(1 << 17, float(r), dtype=np.float64)  # 1 MiB: ring algorithm, scratch
    c.allreduce(x)
    assert x[-1] == n * (n - 1) / 2, x[-1]
    s = c.stats()
    assert s["relayed_bytes"] == 0, s
    assert s["messages_sent"] > 0 and s["bytes_sent"] > 0 and s["bytes_received"] > 0, s
    big = np.ones(1 << 22, dtype=np.float64)  # 32 MiB: its scratch exceeds the inference bound
    c.allreduce(big)
    assert big[0] == n, big[0]
    held = c.stats()["scratch_bytes"]
    if sys.argv[1] == "inference":
        assert held <= 4 << 20, held  # large scratch released when the call ends
        assert s["ring_bytes"] <= 1 << 20, s  # one ring of at most 1 MiB
    else:
        assert held > 4 << 20, held  # kept for the next call
    msg = np.arange(1000, dtype=np.int64)
    ack = np.zeros(1, dtype=np.int64)
    if r == 1:
        c.send(msg, 0, tag=9)
        c.recv(ack, 0, tag=10)  # nothing else goes to rank 0 until it checked
    elif r == 0:
        deadline = time.monotonic() + 20
        while c.stats()["bytes_buffered"] < msg.nbytes:
            assert time.monotonic() < deadline, c.stats()
            time.sleep(0.01)
        got = np.zeros_like(msg)
        c.recv(got, 1, tag=9)
        assert np.array_equal(got, msg)
        assert c.stats()["bytes_buffered"] == 0, c.stats()
        c.send(ack, 1, tag=10)
    c.barrier()
    print(f"rank {r}: stats ok {s}", flush=True)
    c.close()


if __name__ == "__main__":
    main()
