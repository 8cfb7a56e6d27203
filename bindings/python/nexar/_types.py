"""Datatype and reduction-operator constants of include/nexar.h (generated
into _abi.py from internal/abi), and the mapping from numpy, torch and
buffer-protocol element types to them."""

from __future__ import annotations

__all__ = ["Datatype", "Op", "SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]

from ._abi import Datatype, Op  # generated from internal/abi

SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR = (
    Op.SUM, Op.PROD, Op.MIN, Op.MAX, Op.AVG, Op.BAND, Op.BOR, Op.BXOR,
)

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
