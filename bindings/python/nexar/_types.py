"""Datatype and reduction-operator constants of include/nexar.h, and the
mapping from numpy/torch/buffer-protocol element types to them."""

from __future__ import annotations

import enum

__all__ = ["Datatype", "Op", "SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]


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
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self >= Datatype.FLOAT16


_ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 2, 8: 4, 9: 8}


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


SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR = (Op(i) for i in range(8))

# struct-module format characters (buffer protocol) by kind and size.
_SIGNED = {1: Datatype.INT8, 4: Datatype.INT32, 8: Datatype.INT64}
_UNSIGNED = {1: Datatype.UINT8, 4: Datatype.UINT32, 8: Datatype.UINT64}
_FLOAT = {2: Datatype.FLOAT16, 4: Datatype.FLOAT32, 8: Datatype.FLOAT64}


def from_format(fmt: str, itemsize: int):
    """Datatype for a buffer-protocol format string, or None."""
    fmt = fmt.lstrip("@=<>!")
    if len(fmt) != 1:
        return None
    if fmt in "bhilqn":
        return _SIGNED.get(itemsize)
    if fmt in "BHILQN?c":
        return _UNSIGNED.get(itemsize)
    if fmt in "efd":
        return _FLOAT.get(itemsize)
    return None


def from_numpy_dtype(dt):
    """Datatype for a numpy dtype (ml_dtypes.bfloat16 included), or None."""
    if dt.byteorder == ">":
        return None
    if dt.name == "bfloat16":
        return Datatype.BFLOAT16
    kind = dt.kind
    if kind == "i":
        return _SIGNED.get(dt.itemsize)
    if kind in "ub":
        return _UNSIGNED.get(dt.itemsize)
    if kind == "f":
        return _FLOAT.get(dt.itemsize)
    return None


_TORCH_MAP = None


def from_torch_dtype(dt):
    """Datatype for a torch dtype, or None."""
    global _TORCH_MAP
    if _TORCH_MAP is None:
        import torch

        m = {
            torch.int8: Datatype.INT8,
            torch.uint8: Datatype.UINT8,
            torch.bool: Datatype.UINT8,
            torch.int32: Datatype.INT32,
            torch.int64: Datatype.INT64,
            torch.float16: Datatype.FLOAT16,
            torch.bfloat16: Datatype.BFLOAT16,
            torch.float32: Datatype.FLOAT32,
            torch.float64: Datatype.FLOAT64,
        }
        for name, code in (("uint32", Datatype.UINT32), ("uint64", Datatype.UINT64)):
            if hasattr(torch, name):
                m[getattr(torch, name)] = code
        _TORCH_MAP = m
    return _TORCH_MAP.get(dt)
