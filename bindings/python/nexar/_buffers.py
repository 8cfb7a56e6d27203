"""Turning user buffers into (address, count, datatype) for the C ABI.

Accepted: CPU torch tensors (any layout; non-contiguous ones go through a
contiguous copy that is written back after the operation), numpy arrays
(ml_dtypes.bfloat16 included; non-contiguous ones are handled the same way)
and any other object exporting a C-contiguous buffer (bytearray, array.array,
memoryview, ...). A Buffer keeps the object (and any temporary) alive until
the operation has completed.

CUDA arrays: torch CUDA tensors, objects with __cuda_array_interface__
(CuPy, Numba, JAX) and DLPack exporters (__dlpack__/__dlpack_device__:
torch, CuPy, JAX) give their device pointer, which goes to libnexar as it
is: libnexar asks the CUDA runtime what it points to and stages or routes
it (docs/device-memory.md). Nothing here reads device memory. They must be
C-contiguous (a device copy would need the array library's own kernels);
the stream a call is ordered on must be the one the array's producer names
(__cuda_array_interface__ v3), and DLPack exporters are told that stream.
"""

from __future__ import annotations

import ctypes
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

    __slots__ = ("obj", "addr", "nbytes", "itemsize", "dtype", "device", "_keep", "_writeback")

    def __init__(self, obj, addr, nbytes, itemsize, dtype, keep=None, writeback=None, device=False):
        self.obj = obj
        self.addr = addr
        self.nbytes = nbytes
        self.itemsize = itemsize
        self.dtype = dtype
        self.device = device  # a CUDA array's pointer: libnexar classifies it
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

    if t.device.type == "cuda":
        return _torch_cuda_buffer(t)
    if t.device.type != "cpu":
        raise ValueError(f"nexar: only CPU and CUDA tensors are supported, got a tensor on {t.device}")
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


def as_buffer(obj, writable: bool, lib, stream=None) -> Buffer:
    """Prepare obj for a C call; lib is the _nexar extension. stream: the
    cudaStream_t (an int) the call is ordered on, None for a blocking call
    (ordered after the legacy default stream)."""
    if isinstance(obj, Buffer):
        return obj
    if _is_torch_tensor(obj):
        return _torch_buffer(obj, writable)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_buffer(obj, writable, lib)
    if hasattr(obj, "__cuda_array_interface__"):
        b = _cai_buffer(obj, writable, stream)
        if b is not None:
            return b
    if hasattr(obj, "__dlpack_device__") and _dlpack_device(obj)[0] != _DL_CPU:
        return _dlpack_buffer(obj, stream)
    try:
        mv = memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__"):
            return _dlpack_buffer(obj, stream)  # e.g. a CPU array without the buffer protocol
        raise TypeError(f"nexar: expected a torch tensor, a numpy array, a CUDA array (DLPack or "
                        f"__cuda_array_interface__) or an object with the buffer protocol, "
                        f"got {type(obj).__name__}") from None
    if writable and mv.readonly:
        raise ValueError(f"nexar: the output buffer ({type(obj).__name__}) is read-only")
    if not mv.c_contiguous:
        raise ValueError("nexar: buffer-protocol objects must be C-contiguous")
    itemsize = mv.itemsize or 1
    dtype = _types.from_format(mv.format, itemsize)
    return Buffer(obj, lib.buffer_address(mv), mv.nbytes, itemsize, dtype, keep=mv)


# ---- CUDA arrays ---------------------------------------------------------------


def stream_handle(stream):
    """The cudaStream_t (an int) that stream stands for: an int, or a
    stream object of torch (cuda_stream), CuPy (ptr) or the CUDA stream
    protocol (__cuda_stream__)."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"nexar: stream {stream} is not a cudaStream_t")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"nexar: stream must be a cudaStream_t (int) or a CUDA stream object (torch, CuPy), "
                    f"got {type(stream).__name__}")


# The two handles CUDA reserves: the legacy default stream, as 0 in the
# C ABI and 1 in the array protocols, and the per-thread default stream.
_LEGACY, _PER_THREAD = 1, 2


def _same_stream(required: int, stream) -> bool:
    """Whether a call on stream (None: blocking, after the legacy default
    stream) is ordered after the work of stream required (protocol form)."""
    call = _LEGACY if stream in (None, 0) else stream
    return required == call


def _c_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    want = itemsize
    for n, st in zip(reversed(shape), reversed(strides)):
        if n != 1 and st != want:
            return False
        want *= n
    return True


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _torch_cuda_buffer(t) -> Buffer:
    import torch

    if t.is_sparse or t.layout != torch.strided:
        raise ValueError("nexar: only dense (strided) CUDA tensors are supported")
    if not t.is_contiguous():
        raise ValueError(f"nexar: a non-contiguous CUDA tensor (shape {tuple(t.shape)}, strides {t.stride()}) "
                         f"is not supported: pass t.contiguous() and copy the result back")
    base = t.detach()
    if base.is_conj():
        raise ValueError("nexar: a conjugate-view CUDA tensor is not supported: pass t.resolve_conj()")
    return Buffer(t, base.data_ptr(), base.numel() * base.element_size(), base.element_size(),
                  _types.from_torch_dtype(base.dtype), keep=base, device=True)


# __cuda_array_interface__ typestr kinds.
_CAI_KINDS = {"i": _types._SIGNED, "u": _types._UNSIGNED, "b": _types._UNSIGNED, "f": _types._FLOAT}


def _cai_buffer(obj, writable: bool, stream):
    """Buffer over obj's __cuda_array_interface__, or None when its element
    type cannot be told from it and obj also exports DLPack (bfloat16 is
    exported as raw bytes, 'V2')."""
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    ts = cai["typestr"]
    itemsize = int(ts[2:])
    kind = ts[1]
    if ts[0] == ">" and itemsize > 1:
        raise ValueError(f"nexar: big-endian CUDA arrays ({ts}) are not supported")
    if kind == "V" and hasattr(obj, "__dlpack__"):
        return None
    dtype = _CAI_KINDS.get(kind, {}).get(itemsize)
    if cai.get("mask") is not None:
        raise ValueError("nexar: masked CUDA arrays are not supported")
    if not _c_contiguous(shape, cai.get("strides"), itemsize):
        raise ValueError(f"nexar: a non-contiguous CUDA array (shape {shape}, strides {cai['strides']}) is not "
                         f"supported: make it C-contiguous first")
    addr, readonly = cai["data"]
    if writable and readonly:
        raise ValueError(f"nexar: the output CUDA array ({type(obj).__name__}) is read-only")
    required = cai.get("stream")
    if required is not None and not _same_stream(required, stream):
        raise ValueError(f"nexar: {type(obj).__name__} was produced on CUDA stream {required:#x} "
                         f"(__cuda_array_interface__), but the call is ordered on "
                         f"{'the legacy default stream (blocking form)' if stream is None else hex(stream)}: "
                         f"pass stream= the array's stream")
    return Buffer(obj, addr or 0, _count(shape) * itemsize, itemsize, dtype, keep=obj, device=True)


# DLPack (dlpack.h, ABI 0.x: the "dltensor" capsule every exporter gives
# without max_version).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_NAMES = {4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host", 14: "oneAPI"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# A prototype of our own: setting restype on ctypes.pythonapi's shared
# function objects would change them for every other user in the process.
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

# DLPack type codes (kDLInt, kDLUInt, kDLFloat, kDLBfloat) and bits.
_DL_TYPES = {(0, 8): _types.Datatype.INT8, (0, 32): _types.Datatype.INT32, (0, 64): _types.Datatype.INT64,
             (1, 8): _types.Datatype.UINT8, (1, 32): _types.Datatype.UINT32, (1, 64): _types.Datatype.UINT64,
             (2, 16): _types.Datatype.FLOAT16, (2, 32): _types.Datatype.FLOAT32,
             (2, 64): _types.Datatype.FLOAT64, (4, 16): _types.Datatype.BFLOAT16}


def _dlpack_device(obj):
    dev = obj.__dlpack_device__()
    return int(dev[0]), int(dev[1])


def _dlpack_buffer(obj, stream) -> Buffer:
    kind = _dlpack_device(obj)[0] if hasattr(obj, "__dlpack_device__") else _DL_CPU
    if kind not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED):
        raise ValueError(f"nexar: DLPack device type {kind} ({_DL_NAMES.get(kind, 'unknown')}) is not supported "
                         f"(CPU and CUDA memory are)")
    if kind == _DL_CPU:
        capsule = obj.__dlpack__()
    else:
        # The exporter makes its pending work visible to this stream (the
        # legacy default stream, 1, for a blocking call; 0 is not allowed).
        s = _LEGACY if stream in (None, 0) else stream
        try:
            capsule = obj.__dlpack__(stream=s)
        except TypeError:  # an exporter without the stream argument
            capsule = obj.__dlpack__()
    p = _capsule_pointer(capsule, b"dltensor")
    if not p:
        raise ValueError(f"nexar: {type(obj).__name__}.__dlpack__() gave no DLPack tensor")
    t = _DLTensor.from_address(p)
    shape = [t.shape[i] for i in range(t.ndim)]
    bits, lanes = t.dtype.bits, t.dtype.lanes
    if lanes != 1 or bits % 8:
        raise ValueError(f"nexar: DLPack element type (code {t.dtype.code}, {bits} bits, {lanes} lanes) "
                         f"is not supported")
    itemsize = bits // 8
    strides = None if not t.strides else [t.strides[i] * itemsize for i in range(t.ndim)]
    if not _c_contiguous(shape, strides, itemsize):
        raise ValueError(f"nexar: a non-contiguous DLPack tensor (shape {tuple(shape)}) is not supported: "
                         f"make it C-contiguous first")
    addr = (t.data or 0) + t.byte_offset
    # The capsule, not renamed, stays the exporter's: it frees the tensor
    # when the capsule goes, after the operation (the Buffer holds it).
    return Buffer(obj, addr, _count(shape) * itemsize, itemsize, _DL_TYPES.get((t.dtype.code, bits)),
                  keep=(obj, capsule), device=kind != _DL_CPU)
