"""Tensors to what a libnexar call takes: address, count, Datatype, op.

Staged is a nexar Buffer for a CPU tensor that may go through a contiguous
(optionally converted or copied) stand-in; back() writes the stand-in into
the tensor. Reduction adds what reductions need on top of it (bool, small
ints, complex, PREMUL_SUM). None of these objects is safe for concurrent
use; each lives for one operation.
"""

from __future__ import annotations

from functools import partial
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .._buffers import Buffer
from .._types import AVG, BAND, BOR, BXOR, MAX, MIN, PROD, SUM, Datatype, from_torch_dtype

__all__ = ["BYTE", "Staged", "Reduction", "op_of", "reduction_error", "offsets", "flat_cat", "bytes_cat",
           "copy_blocks", "nbytes", "tag64"]

BYTE = int(Datatype.UINT8)  # byte-moving calls pass nbytes elements of this

_RT = dist.ReduceOp.RedOpType
_OPS = {
    _RT.SUM: SUM,
    _RT.PRODUCT: PROD,
    _RT.MIN: MIN,
    _RT.MAX: MAX,
    _RT.AVG: AVG,
    _RT.BAND: BAND,
    _RT.BOR: BOR,
    _RT.BXOR: BXOR,
}
_PREMUL = getattr(_RT, "PREMUL_SUM", None)
_SMALL_INTS = (torch.int16,) + tuple(getattr(torch, n) for n in ("uint16",) if hasattr(torch, n))
# bool reduces as uint8 under the logical op that matches.
_BOOL_OPS = {SUM: BOR, MAX: BOR, BOR: BOR, PROD: BAND, MIN: BAND, BAND: BAND, BXOR: BXOR}


class Staged(Buffer):
    """A CPU tensor t prepared for a C call.

    w is a contiguous stand-in with t's shape: t itself (detached) when it
    can be, else a copy, converted to dtype when given, and a copy anyway
    with force_copy. addr/nbytes/itemsize/dtype describe w. back() (the
    Buffer's finish()) copies w into t when they are not the same memory
    and the tensor is writable (an output).
    """

    __slots__ = ("t", "w")

    def __init__(self, t: torch.Tensor, dtype: Optional[torch.dtype] = None, force_copy: bool = False,
                 writable: bool = True):
        if t.device.type != "cpu":
            raise ValueError(f"nexar: a call's tensors must all be CPU tensors or all CUDA tensors of one "
                             f"device, got one on {t.device} among CPU tensors")
        w = t.detach()
        if w.is_conj():
            w = w.resolve_conj()
        if w.is_neg():
            w = w.resolve_neg()
        if dtype is not None and w.dtype != dtype:
            w = w.to(dtype)
        if not w.is_contiguous():
            w = w.contiguous()
        elif force_copy and w.data_ptr() == t.data_ptr():
            w = w.clone()
        copy = w.data_ptr() != t.data_ptr() or w.dtype != t.dtype or not t.is_contiguous()
        es = w.element_size()
        # partial, not a bound method: no cycle keeps a staged copy alive.
        super().__init__(t, w.data_ptr(), w.numel() * es, es, from_torch_dtype(w.dtype), keep=w,
                         writeback=partial(_copy_into, t, w) if copy and writable else None)
        self.t = t
        self.w = w

    back = Buffer.finish


def _copy_into(t: torch.Tensor, w: torch.Tensor):
    with torch.no_grad():
        t.copy_(w)


def op_of(opts) -> Tuple[object, Optional[float]]:
    """(nexar Op, premul factor or None) for opts.reduceOp (SUM without opts)."""
    rop = getattr(opts, "reduceOp", None) if opts is not None else None
    if rop is None:
        return SUM, None
    kind = rop.op if hasattr(rop, "op") else rop
    if _PREMUL is not None and kind == _PREMUL:
        return SUM, _premul_factor(rop)
    try:
        return _OPS[kind], None
    except KeyError:
        raise ValueError(f"nexar: unsupported reduce op {rop}") from None


def _premul_factor(rop):
    f = getattr(rop, "factor", None)
    if f is None:
        try:
            f = rop.__getstate__()[1]
        except Exception:
            raise ValueError("nexar: PREMUL_SUM without a readable factor") from None
    return f


def reduction_error(dt: torch.dtype, op) -> Optional[Exception]:
    """The error Reduction raises for a tensor of dtype dt under op, or
    None: checked when a CUDA operation is issued, whose host part runs
    later."""
    if dt == torch.bool:
        return ValueError("nexar: ReduceOp.AVG is not defined for bool tensors") if op == AVG else None
    if dt.is_complex:
        return None if op in (SUM, AVG) else ValueError(f"nexar: {op.name} is not defined for complex tensors")
    ndt = from_torch_dtype(torch.int32 if dt in _SMALL_INTS else dt)
    if ndt is None:
        return TypeError(f"nexar: reductions on {dt} are not supported")
    if op == AVG and not ndt.is_float:
        return ValueError(f"nexar: ReduceOp.AVG needs a floating-point tensor, got {dt}")
    if op in (BAND, BOR, BXOR) and ndt.is_float:
        return ValueError(f"nexar: {op.name} needs an integer tensor, got {dt}")
    return None


class Reduction:
    """A tensor prepared for a reduction: the staged tensor s, the memory to
    pass (addr, count elements of dt) and the op, all as the C ABI takes them.

    bool reduces as uint8 with logical ops, int16/uint16 through int32,
    complex as pairs of reals (SUM/AVG only); PREMUL_SUM scales a copy.
    """

    __slots__ = ("s", "addr", "count", "dt", "op")

    def __init__(self, t: torch.Tensor, op, factor=None):
        dt = t.dtype
        if isinstance(factor, torch.Tensor) and factor.device.type != "cpu":
            factor = factor.cpu()  # PREMUL_SUM's factor on the device of a staged CUDA tensor
        s = Staged(t, torch.int32 if dt in _SMALL_INTS else None, force_copy=factor is not None)
        if factor is not None:
            with torch.no_grad():
                s.w.mul_(factor)
        buf = s.w
        if dt == torch.bool:
            if op == AVG:
                raise ValueError("nexar: ReduceOp.AVG is not defined for bool tensors")
            op = _BOOL_OPS[op]
            buf = buf.view(torch.uint8)
        elif dt.is_complex:
            if op not in (SUM, AVG):
                raise ValueError(f"nexar: {op.name} is not defined for complex tensors")
            buf = torch.view_as_real(buf)
        ndt = from_torch_dtype(buf.dtype)
        if ndt is None:
            raise TypeError(f"nexar: reductions on {dt} are not supported")
        if op == AVG and not ndt.is_float:
            raise ValueError(f"nexar: ReduceOp.AVG needs a floating-point tensor, got {dt}")
        if op in (BAND, BOR, BXOR) and ndt.is_float:
            raise ValueError(f"nexar: {op.name} needs an integer tensor, got {dt}")
        self.s = s
        self.addr = buf.data_ptr()
        self.count = buf.numel()
        self.dt = int(ndt)
        self.op = int(op)


def offsets(sizes: Sequence[int]) -> Tuple[List[int], int]:
    """Packed displacements of consecutive blocks of the given sizes, and
    their total."""
    displs, off = [], 0
    for x in sizes:
        displs.append(off)
        off += x
    return displs, off


def flat_cat(tensors: List[torch.Tensor]) -> torch.Tensor:
    """The tensors' elements, flattened and concatenated (uint8 when none)."""
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def bytes_cat(tensors: List[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes, concatenated into one uint8 tensor."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else
                      torch.empty(0, dtype=torch.uint8) for t in tensors])


def copy_blocks(outs: List[torch.Tensor], tmp: torch.Tensor, displs: Sequence[int], sizes: Sequence[int]):
    """Copy block i of the uint8 tensor tmp (displs[i], sizes[i] bytes) into outs[i]."""
    with torch.no_grad():
        for o, d, x in zip(outs, displs, sizes):
            if x:
                o.copy_(tmp[d:d + x].view(o.dtype).view(o.shape))


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tag64(tag) -> int:
    """A torch tag as libnexar's uint64 tag (negative tags wrap)."""
    return int(tag) & 0xFFFFFFFFFFFFFFFF
