"""nexar: distributed communication (point-to-point and collectives) for
Python, numpy and PyTorch, over libnexar (QUIC, mutual TLS).

    import nexar, numpy as np
    with nexar.init() as comm:            # under `nexar run -n 4` or torchrun
        x = np.full(4, comm.rank, dtype=np.float32)
        comm.allreduce(x)                 # in place: x == sum of ranks

`import nexar.torch` registers the torch.distributed backend "nexar"
(torch >= 2.5 does it by itself through an entry point).

The native library is loaded on first use of Comm/init, not at import, so
that importing nexar (or torch, through the entry point) does not start the
Go runtime in processes that never communicate.
"""

from ._errors import (  # noqa: F401
    AbortedError,
    AuthError,
    ClosedError,
    Error,
    ForkedProcessError,
    NoQuorumError,
    RevokedError,
    InternalError,
    InvalidArgumentError,
    InvalidHandleError,
    MismatchError,
    PeerDownError,
    TimeoutError,
    TruncatedError,
    UnavailableError,
)
from ._types import AVG, BAND, BOR, BXOR, MAX, MIN, PROD, SUM, Datatype, Op  # noqa: F401
from ._compress import RANDOMK, TOPK, CompressState  # noqa: F401

from ._abi import VERSION as __version__  # internal/abi is its one source

ANY_SOURCE = -1
UNDEFINED = -1

_LAZY = {"Comm", "Request", "RPCFuture", "Status", "init", "version"}

__all__ = sorted(
    _LAZY
    | {
        "Error", "InvalidArgumentError", "InvalidHandleError", "MismatchError", "PeerDownError",
        "TimeoutError", "AbortedError", "ClosedError", "AuthError", "TruncatedError",
        "UnavailableError", "InternalError", "ForkedProcessError", "RevokedError", "NoQuorumError", "Datatype", "Op", "SUM", "PROD",
        "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "ANY_SOURCE", "UNDEFINED",
        "CompressState", "TOPK", "RANDOMK",
    }
)


def __getattr__(name):
    if name in _LAZY:
        from . import _comm

        return getattr(_comm, name)
    raise AttributeError(f"module 'nexar' has no attribute {name!r}")


def __dir__():
    return __all__
