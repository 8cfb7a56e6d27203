"""RPC from Python: every rank serves function 1 (echo), 2 (raises
ValueError), 3 (raises nexar.UnavailableError) and 4 (sleeps 2 s), then
calls every rank, itself too, blocking, with a deadline and non-blocking
(icall futures). Run as N ranks with the launcher's variables."""

import time

import nexar


def main():
    c = nexar.init()
    r, n = c.rank, c.size

    def echo(frm, req):
        return f"{r}<-{frm}:".encode() + req

    def bad(frm, req):
        raise ValueError(f"bad input {req!r}")

    def busy(frm, req):
        raise nexar.UnavailableError(nexar.UnavailableError.code, "model not loaded")

    c.register(1, echo)
    c.register(2, bad)
    c.register(3, busy)
    c.register(4, lambda frm, req: time.sleep(2))
    c.barrier()
    for peer in range(n):
        got = c.call(peer, 1, b"hi")
        assert got == f"{peer}<-{r}:hi".encode(), got
        assert c.call(peer, 1) == f"{peer}<-{r}:".encode()
        try:
            c.call(peer, 2, b"x")
            raise AssertionError("a raising handler returned")
        except nexar.InternalError as e:
            assert "ValueError: bad input b'x'" in str(e) and f"rank {peer}" in str(e), e
        try:
            c.call(peer, 3)
            raise AssertionError("a raising handler returned")
        except nexar.UnavailableError as e:
            assert "model not loaded" in str(e), e
        try:
            c.call(peer, 9)
            raise AssertionError("an unknown function was served")
        except nexar.InvalidArgumentError as e:
            assert "no handler for function 9" in str(e), e
        # Non-blocking: several in flight, each reply its own.
        futs = [c.icall(peer, 1, f"f{i}".encode()) for i in range(8)]
        assert isinstance(futs[0], nexar.RPCFuture)
        for i, f in enumerate(futs):
            assert f.result() == f"{peer}<-{r}:f{i}".encode(), (i, f.result())
            assert f.done and f.test()
        f = c.icall(peer, 1, bytearray(b"ba"))
        while not f.test():
            pass
        assert f.result() == f"{peer}<-{r}:ba".encode()
        assert nexar.Request.testany([c.icall(peer, 1)]) in (None, 0)
        for fn, err, text in ((2, nexar.InternalError, "ValueError: bad input b'y'"),
                              (3, nexar.UnavailableError, "model not loaded"),
                              (9, nexar.InvalidArgumentError, "no handler for function 9")):
            f = c.icall(peer, fn, b"y")
            try:
                f.result()
                raise AssertionError(f"icall of function {fn} returned")
            except err as e:
                assert text in str(e), e
        # Deadlines: blocking, and non-blocking with nobody waiting.
        t0 = time.monotonic()
        try:
            c.call(peer, 4, timeout=0.2)
            raise AssertionError("a call past its deadline returned")
        except nexar.TimeoutError as e:
            assert "function 4" in str(e), e
        f = c.icall(peer, 4, timeout=0.2)
        time.sleep(0.4)
        try:
            f.test()
            raise AssertionError("an icall past its deadline did not fail")
        except nexar.TimeoutError:
            pass
        assert time.monotonic() - t0 < 1.8, time.monotonic() - t0
        assert c.call(peer, 1, b"t", timeout=10) == f"{peer}<-{r}:t".encode()
        # Large payloads (pooled buffers reused), requests of any buffer
        # type, and replies into the caller's buffer (out=).
        head = f"{peer}<-{r}:".encode()
        big = bytes((i * 7 + r) % 256 for i in range(256)) * 4096  # 1 MiB
        for _ in range(3):
            assert c.call(peer, 1, big) == head + big
        assert c.call(peer, 1, memoryview(big)[:5]) == head + big[:5]
        assert c.call(peer, 1, [104, 105]) == head + b"hi"  # through bytes(), as before
        out = bytearray(len(big) + 100)
        for _ in range(3):
            k = c.call(peer, 1, bytearray(big), out=out)
            assert k == len(head) + len(big) and out[:k] == head + big, k
        small = bytearray(len(head) + 1)
        try:
            c.call(peer, 1, b"ab", out=small)
            raise AssertionError("a reply larger than out was taken")
        except nexar.TruncatedError as e:
            assert f"out holds {len(small)} bytes" in str(e), e
        try:
            c.call(peer, 1, b"x", out=b"read-only")
            raise AssertionError("a read-only out was taken")
        except (BufferError, TypeError):
            pass
        for fn, err in ((2, nexar.InternalError), (9, nexar.InvalidArgumentError)):
            try:
                c.call(peer, fn, b"x", out=out)
                raise AssertionError(f"call of function {fn} into out returned")
            except err:
                pass
        try:
            c.call(peer, 4, timeout=0.2, out=out)
            raise AssertionError("a call into out past its deadline returned")
        except nexar.TimeoutError:
            pass
        for bad_timeout in (0, -1):
            try:
                c.call(peer, 1, timeout=bad_timeout)
                raise AssertionError("a non-positive timeout was taken")
            except ValueError:
                pass
    c.barrier()  # nobody closes while others still call it
    c.close()
    print(f"rank {r}: rpc ok", flush=True)


if __name__ == "__main__":
    main()
