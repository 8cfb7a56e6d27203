"""Turning user buffers into (address, count, datatype) for the C ABI.

Accepted: CPU torch tensors (any layout; non-contiguous ones go through a
contiguous copy that is written back after the operation), numpy arrays
(ml_dtypes.bfloat16 included; non-contiguous ones are handled the same way)
and any other object exporting a C-contiguous buffer (bytearray, array.array,
memoryview, ...). A Buffer keeps the object (and any temporary) alive until
the operation has completed.
"""

from __future__ import annotations

import sys

from . import _types
from ._types import Datatype

__all__ = ["Buffer", "as_buffer"]


class Buffer:
    """One user buffer prepared for a C call.

    addr, nbytes: the contiguous memory; dtype: its Datatype, or None when the
    element type has no nexar equivalent (then only byte-moving operations
    accept it); itemsize: bytes per element. finish() writes a temporary
    copy back into a non-contiguous original. Not safe for concurrent use.
    """

    __slots__ = ("obj", "addr", "nbytes", "itemsize", "dtype", "_keep", "_writeback")

    def __init__(self, obj, addr, nbytes, itemsize, dtype, keep=None, writeback=None):
        self.obj = obj
        self.addr = addr
        self.nbytes = nbytes
        self.itemsize = itemsize
        self.dtype = dtype
        self._keep = keep
        self._writeback = writeback

    @property
    def count(self) -> int:
        return self.nbytes // self.itemsize

    def typed(self, what: str):
        """(count, dtype) for an operation that interprets elements."""
        if self.dtype is None:
            raise TypeError(f"nexar: {what}: element type of {_describe(self.obj)} is not supported "
                            "(supported: int8, uint8, int32, uint32, int64, uint64, "
                            "float16, bfloat16, float32, float64)")
        return self.count, self.dtype

    def raw(self):
        """(count, dtype) moving the same bytes as typed(), usable for any element type."""
        if self.dtype is None:
            return self.nbytes, Datatype.UINT8
        return self.count, self.dtype

    def finish(self):
        wb, self._writeback = self._writeback, None
        if wb is not None:
            wb()


def _describe(obj) -> str:
    dt = getattr(obj, "dtype", None)
    return f"{type(obj).__name__}" + (f" of {dt}" if dt is not None else "")


def _is_torch_tensor(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_buffer(t, writable: bool) -> Buffer:
    import torch

    if t.device.type != "cpu":
        raise ValueError(f"nexar: only CPU tensors are supported, got a tensor on {t.device}")
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError("nexar: only dense (strided) tensors are supported")
    base = t.detach()
    if base.is_conj():
        base = base.resolve_conj()
    dtype = _types.from_torch_dtype(base.dtype)
    writeback = None
    tmp = base
    if not base.is_contiguous():
        tmp = base.contiguous()
        if writable:
            def writeback(t=t, tmp=tmp):
                with torch.no_grad():
                    t.copy_(tmp)
    return Buffer(t, tmp.data_ptr(), tmp.numel() * tmp.element_size(), tmp.element_size(),
                  dtype, keep=tmp, writeback=writeback)


# numpy dtype -> Datatype (or None): the lookup by name and kind costs
# microseconds, and a program uses a handful of dtypes.
_NP_DTYPES = {}


def _numpy_buffer(a, writable: bool, lib=None) -> Buffer:
    import numpy as np

    dt = a.dtype
    try:
        dtype = _NP_DTYPES[dt]
    except KeyError:
        dtype = _NP_DTYPES[dt] = _types.from_numpy_dtype(dt)
    if lib is not None and dt.hasobject is False:
        # Fast path: one call describes the export.
        try:
            addr, nbytes, itemsize, _, contiguous, readonly = lib.buffer_info(a)
        except (BufferError, ValueError, TypeError):
            pass  # e.g. a dtype without a buffer format: the general path
        else:
            if writable and readonly:
                raise ValueError("nexar: the output array is read-only")
            if contiguous:
                return Buffer(a, addr, nbytes, itemsize, dtype, keep=a)
    if writable and not a.flags.writeable:
        raise ValueError("nexar: the output array is read-only")
    tmp = a
    writeback = None
    if not a.flags.c_contiguous:
        tmp = np.ascontiguousarray(a)
        if writable:
            def writeback(a=a, tmp=tmp):
                a[...] = tmp
    addr = tmp.__array_interface__["data"][0]
    return Buffer(a, addr, tmp.nbytes, tmp.itemsize, dtype, keep=tmp, writeback=writeback)


def as_buffer(obj, writable: bool, lib) -> Buffer:
    """Prepare obj for a C call; lib is the _nexar extension."""
    if isinstance(obj, Buffer):
        return obj
    if _is_torch_tensor(obj):
        return _torch_buffer(obj, writable)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_buffer(obj, writable, lib)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"nexar: expected a torch tensor, a numpy array or an object with the buffer "
                        f"protocol, got {type(obj).__name__}") from None
    if writable and mv.readonly:
        raise ValueError(f"nexar: the output buffer ({type(obj).__name__}) is read-only")
    if not mv.c_contiguous:
        raise ValueError("nexar: buffer-protocol objects must be C-contiguous")
    itemsize = mv.itemsize or 1
    dtype = _types.from_format(mv.format, itemsize)
    return Buffer(obj, lib.buffer_address(mv), mv.nbytes, itemsize, dtype, keep=mv)
