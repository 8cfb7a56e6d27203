# @generated from internal/abi by go generate ./internal/abi. Do not edit.
"""The values of include/nexar.h's enums and the library version, generated
from the one Go source (internal/abi) so that no copy can drift."""

from __future__ import annotations

import enum

VERSION = "0.1.0"


class Datatype(enum.IntEnum):
    """nexar_datatype_t."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    BFLOAT16 = 7
    FLOAT32 = 8
    FLOAT64 = 9

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in FLOAT_TYPES


class Op(enum.IntEnum):
    """nexar_op_t."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


# Bytes per element, by Datatype value.
ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 2, 8: 4, 9: 8}

# Floating-point Datatype values.
FLOAT_TYPES = frozenset({6, 7, 8, 9})

# nexar_result_t: value -> (enumerator, exception class in _errors.py).
RESULTS = {
    1: ("NEXAR_ERR_INVALID_ARGUMENT", "InvalidArgumentError"),
    2: ("NEXAR_ERR_INVALID_HANDLE", "InvalidHandleError"),
    3: ("NEXAR_ERR_MISMATCH", "MismatchError"),
    4: ("NEXAR_ERR_PEER_DOWN", "PeerDownError"),
    5: ("NEXAR_ERR_TIMEOUT", "TimeoutError"),
    6: ("NEXAR_ERR_ABORTED", "AbortedError"),
    7: ("NEXAR_ERR_CLOSED", "ClosedError"),
    8: ("NEXAR_ERR_AUTH", "AuthError"),
    9: ("NEXAR_ERR_TRUNCATED", "TruncatedError"),
    10: ("NEXAR_ERR_UNAVAILABLE", "UnavailableError"),
    11: ("NEXAR_ERR_INTERNAL", "InternalError"),
    12: ("NEXAR_ERR_FORKED", "ForkedProcessError"),
    13: ("NEXAR_ERR_REVOKED", "RevokedError"),
    14: ("NEXAR_ERR_NO_QUORUM", "NoQuorumError"),
}
