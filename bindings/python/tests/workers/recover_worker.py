"""Recovery without restart from Python: 4 ranks, NEXAR_ON_FAILURE=manual
from the environment. A revoke on a copy of the world reaches every rank;
rank 3 dies, the survivors agree (the AND of their flags, failed [3]) and
shrink to 3 ranks that compute right; then under the "shrink" policy the
shrunk communicator's rank 2 dies, the call that meets it raises, and the
same Comm object carries on as the 2 survivors. Run with the launcher's
variables."""

import os
import sys

import numpy as np

import nexar


def past_barrier_then_die(c, victim):
    """After a barrier on c, rank victim exits (no goodbye) once every other
    rank told it that its barrier returned: a death on one host is seen at
    once and must not fail a barrier another rank is still finishing."""
    one = np.ones(1, np.int32)
    if c.rank != victim:
        c.send(one, victim, 99)
        return
    for _ in range(c.size - 1):
        c.recv(one, nexar.ANY_SOURCE, 99)
    sys.stdout.flush()
    os._exit(0)  # dies without a goodbye


def sum_check(c):
    x = np.arange(100, dtype=np.int64) + c.rank + 1
    c.allreduce(x)
    n = c.size
    want = np.arange(100, dtype=np.int64) * n + n * (n + 1) // 2
    assert np.array_equal(x, want), (c.rank, n, x[:4], want[:4])


def expect_lost(c, dead):
    """An allreduce on c must fail now that rank `dead` is gone."""
    try:
        c.allreduce(np.ones(4, np.float32))
    except (nexar.PeerDownError, nexar.RevokedError):
        return
    raise AssertionError(f"allreduce succeeded with rank {dead} dead")


def main():
    c = nexar.init(heartbeat_interval=0.1, heartbeat_timeout=1.5)
    r, n = c.rank, c.size
    assert n == 4, n
    assert c.failure_policy == "manual", c.failure_policy
    try:
        c.failure_policy = "restart"
        raise AssertionError("a bad policy was accepted")
    except ValueError:
        pass

    dup = c.split(0, r)
    if r == 0:
        dup.revoke()
    else:
        try:
            dup.barrier()
            raise AssertionError("barrier on a revoked communicator succeeded")
        except nexar.RevokedError as e:
            assert "revoked by rank 0" in str(e), e
    assert dup.revoked
    assert dup.agree(0xF0 | r) == (0xF0, []), "agree on the revoked communicator"
    dup.close()

    c.barrier()
    past_barrier_then_die(c, 3)
    expect_lost(c, 3)
    flag, failed = c.agree(~(1 << r) & ((1 << 64) - 1))
    assert flag == ((1 << 64) - 1) & ~7 and failed == [3], (hex(flag), failed)
    s = c.shrink()
    assert (s.rank, s.size) == (r, 3), (s.rank, s.size)
    sum_check(s)

    s.failure_policy = "shrink"
    s.barrier()
    past_barrier_then_die(s, 2)
    expect_lost(s, 2)
    sum_check(s)  # the same object, now the 2 survivors
    assert (s.rank, s.size) == (r, 2), (s.rank, s.size)
    s.close()
    c.close()
    print(f"rank {r}: recover ok", flush=True)


if __name__ == "__main__":
    main()
