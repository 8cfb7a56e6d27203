"""Exceptions raised by nexar: one subclass of Error per nexar_result_t code."""

from __future__ import annotations

import builtins

from . import _abi

__all__ = [
    "Error",
    "InvalidArgumentError",
    "InvalidHandleError",
    "MismatchError",
    "PeerDownError",
    "TimeoutError",
    "AbortedError",
    "ClosedError",
    "AuthError",
    "TruncatedError",
    "UnavailableError",
    "InternalError",
    "ForkedProcessError",
    "RevokedError",
    "NoQuorumError",
    "error_for",
]


class Error(RuntimeError):
    """A failed nexar call.

    ``code`` is the nexar_result_t value (see include/nexar.h), ``message``
    the library's detail (the function and the argument or peer at fault).
    """

    code = -1
    name = "NEXAR_ERROR"

    def __init__(self, code: int, message: str):
        super().__init__(f"{message} [{_NAMES.get(code, 'NEXAR_ERR_' + str(code))}]")
        self.code = code
        self.message = message

    def __reduce__(self):  # picklable across processes
        return (error_for, (self.code, self.message))


class InvalidArgumentError(Error, ValueError):
    """NEXAR_ERR_INVALID_ARGUMENT: bad pointer, count, dtype, op, root, peer or config."""


class InvalidHandleError(Error):
    """NEXAR_ERR_INVALID_HANDLE: unknown, NULL or destroyed communicator/request."""


class MismatchError(Error):
    """NEXAR_ERR_MISMATCH: ranks made different collective calls."""


class PeerDownError(Error, ConnectionError):
    """NEXAR_ERR_PEER_DOWN: a peer died or became unreachable."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001
    """NEXAR_ERR_TIMEOUT: the operation did not finish in time."""


class AbortedError(Error):
    """NEXAR_ERR_ABORTED: the communicator was aborted."""


class ClosedError(Error):
    """NEXAR_ERR_CLOSED: the communicator was closed."""


class AuthError(Error, PermissionError):
    """NEXAR_ERR_AUTH: authentication with the seed or a peer failed."""


class TruncatedError(Error):
    """NEXAR_ERR_TRUNCATED: a message was larger than the receive buffer."""


class UnavailableError(Error):
    """NEXAR_ERR_UNAVAILABLE: a feature or device is not available."""


class InternalError(Error):
    """NEXAR_ERR_INTERNAL: a bug in nexar."""


class ForkedProcessError(Error):
    """NEXAR_ERR_FORKED: nexar was used in a child made by fork() without exec().

    Raised by the bindings' own check before the library is entered, and
    for the C ABI's NEXAR_ERR_FORKED. Takes ``(message)`` or ``(code, message)``.
    """

    def __init__(self, code_or_message, message=None):
        if message is None:
            code_or_message, message = type(self).code, code_or_message
        super().__init__(code_or_message, message)


class RevokedError(Error):
    """NEXAR_ERR_REVOKED: the communicator was revoked (here or by a peer).

    Every pending and later operation on it fails so; ``agree`` and
    ``shrink`` still work on it.
    """


class NoQuorumError(Error):
    """NEXAR_ERR_NO_QUORUM: this rank's side of a failure or partition holds
    no quorum of the last membership, so it must not continue as the job
    (the other side may)."""


# The code -> class table comes from internal/abi (through _abi.py): a class
# named there and missing here fails at import, so the two cannot drift.
_BY_CODE = {code: globals()[cls] for code, (_, cls) in _abi.RESULTS.items()}
_NAMES = {code: name for code, (name, _) in _abi.RESULTS.items()}

for _code, _cls in _BY_CODE.items():
    _cls.code = _code
    _cls.name = _NAMES[_code]


def error_for(code: int, message: str) -> Error:
    """Return the exception instance for a nexar_result_t code.

    Code -2 is the extension's own "used after fork()" error.
    """
    if code == -2:
        return ForkedProcessError(message)  # the extension's own check
    return _BY_CODE.get(code, Error)(code, message)
