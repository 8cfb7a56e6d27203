"""RPC to a rank that dies mid-call, from Python: 2 ranks; rank 1 serves
function 1 by exiting at once. Rank 0's blocking call, its non-blocking
call and its call with a deadline all fail with nexar.PeerDownError naming
rank 1 (or, once the communicator has failed, with that failure), never
hang. Run with the launcher's variables."""

import os

import nexar


def main():
    c = nexar.init(heartbeat_interval=0.1, heartbeat_timeout=1.0)
    r, n = c.rank, c.size
    assert n == 2, n
    c.register(1, lambda frm, req: os._exit(0))
    c.barrier()
    if r == 1:
        import time
        time.sleep(30)  # until rank 0's call ends this process
        return
    f = c.icall(1, 1, b"die", timeout=20)
    try:
        f.result()
        raise AssertionError("a call to a dead rank returned")
    except nexar.PeerDownError as e:
        assert "rank 1" in str(e), e
    for form in (lambda: c.call(1, 1), lambda: c.call(1, 1, timeout=5), lambda: c.icall(1, 1).result(),
                 lambda: c.call(1, 1, out=bytearray(8))):
        try:
            form()
            raise AssertionError("a call to a dead rank returned")
        except nexar.Error as e:
            assert isinstance(e, nexar.PeerDownError) or "rank 1" in str(e), e
    c.close()
    print(f"rank {r}: rpc down ok", flush=True)


if __name__ == "__main__":
    main()
