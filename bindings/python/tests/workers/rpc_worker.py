"""RPC from Python: every rank serves function 1 (echo), 2 (raises
ValueError) and 3 (raises nexar.UnavailableError), then calls every rank,
itself too. Run as N ranks with the launcher's variables."""

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
    c.barrier()  # nobody closes while others still call it
    c.close()
    print(f"rank {r}: rpc ok", flush=True)


if __name__ == "__main__":
    main()
