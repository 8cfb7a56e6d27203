"""Failure notification from Python: 3 ranks; rank 2 dies after a
barrier. Ranks 0 and 1 get one on_failure call for rank 2 with a
PeerDownError (the handler raises, which must reach sys.unraisablehook and
nothing else), Comm.failed lists rank 2, and a later allreduce fails
naming it. Run with the launcher's variables."""

import os
import sys
import threading

import numpy as np

import nexar


def main():
    c = nexar.init(heartbeat_interval=0.1, heartbeat_timeout=1.0)
    r, n = c.rank, c.size
    assert n == 3, n
    calls = []
    told = threading.Event()
    unraisable = []
    sys.unraisablehook = lambda u: unraisable.append(u.exc_value)

    def on_failure(rank, err):
        calls.append((rank, err, threading.current_thread() is threading.main_thread()))
        told.set()
        raise RuntimeError("a handler that raises")

    c.on_failure(on_failure)
    assert c.failed == []
    c.barrier()
    # Rank 2 dies once the others are past the barrier: a death on one host
    # is seen at once and must not fail a barrier still finishing.
    one = np.ones(1, np.int32)
    if r == 2:
        for _ in range(n - 1):
            c.recv(one, nexar.ANY_SOURCE, 99)
        sys.stdout.flush()
        os._exit(0)  # dies without a goodbye
    c.send(one, 2, 99)
    assert told.wait(20), "no failure reported"
    rank, err, on_main = calls[0]
    assert rank == 2 and isinstance(err, nexar.PeerDownError) and "rank 2" in str(err), calls
    assert not on_main, "the handler ran on the main thread"
    try:
        c.allreduce(np.ones(4, np.float32))
        raise AssertionError("allreduce succeeded with rank 2 dead")
    except nexar.PeerDownError as e:
        assert "rank 2" in str(e), e
    assert c.failed == [2], c.failed
    assert len(calls) == 1, calls
    assert len(unraisable) == 1 and "raises" in str(unraisable[0]), unraisable
    c.close()
    print(f"rank {r}: failures ok", flush=True)


if __name__ == "__main__":
    main()
