"""nexar.Comm with CUDA arrays, against the fake CUDA runtime
(tests/fakes/cudart, named by NEXAR_CUDART): array objects over fake device
memory (which the host cannot read: a host read dies by SIGSEGV) that
export __cuda_array_interface__ (v3, with the producer's stream, as CuPy
does) or DLPack (__dlpack__/__dlpack_device__, as torch, CuPy and JAX do).
Inputs are written and results read back through the fake's copies on a
stream, and checked element by element against numpy. What this does not
prove: that CuPy's, torch's and JAX's own exports look like these (that
needs a GPU: scripts/gpu_check.sh). Run as 2+ ranks."""

import ctypes
import os
import sys
import threading

import numpy as np

import nexar

lib = ctypes.CDLL(os.environ["NEXAR_CUDART"])
vp = ctypes.c_void_p
H2D, D2H = 1, 2


def ck(rc, what):
    assert rc == 0, f"{what}: cudaError {rc}"


def new_stream() -> int:
    s = vp()
    ck(lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "cudaStreamCreateWithFlags")  # non-blocking
    return s.value


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))

# numpy dtype -> DLPack (code, bits); "bf16" is bfloat16 held as uint16 bits.
_DL = {"int8": (0, 8), "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8), "uint32": (1, 32),
       "uint64": (1, 64), "float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bf16": (4, 16)}


class DevArray:
    """n elements of fake device memory. host_dtype: the numpy dtype of
    the values (uint16 bits for "bf16")."""

    def __init__(self, n, kind, stream=None, byte_offset=0):
        self.kind = kind
        self.host_dtype = np.dtype("uint16" if kind == "bf16" else kind)
        self.n = n
        self.stream = stream  # the producer's stream: its writes are ordered there
        self.nbytes = n * self.host_dtype.itemsize
        p = vp()
        ck(lib.cudaMalloc(ctypes.byref(p), self.nbytes + byte_offset), "cudaMalloc")
        self.base = p.value
        self.ptr = p.value + byte_offset
        self.byte_offset = byte_offset
        self.dlpack_streams = []
        self._keep = []

    def put(self, values, stream):
        """Write values by a (delayed) copy queued on stream."""
        v = np.ascontiguousarray(values, dtype=self.host_dtype)
        h = vp()
        ck(lib.cudaMallocHost(ctypes.byref(h), self.nbytes), "cudaMallocHost")
        ctypes.memmove(h.value, v.ctypes.data, self.nbytes)
        ck(lib.cudaMemcpyAsync(vp(self.ptr), h, self.nbytes, H2D, vp(stream)), "cudaMemcpyAsync H2D")
        self._keep.append(h)
        return self

    def get(self, stream):
        """The contents after the work queued on stream so far."""
        h = vp()
        ck(lib.cudaMallocHost(ctypes.byref(h), self.nbytes), "cudaMallocHost")
        ck(lib.cudaMemcpyAsync(h, vp(self.ptr), self.nbytes, D2H, vp(stream)), "cudaMemcpyAsync D2H")
        ck(lib.cudaStreamSynchronize(vp(stream)), "cudaStreamSynchronize")
        out = np.empty(self.n, dtype=self.host_dtype)
        ctypes.memmove(out.ctypes.data, h.value, self.nbytes)
        lib.cudaFreeHost(h)
        return out


class CaiArray(DevArray):
    """Exports __cuda_array_interface__ v3, as CuPy does."""

    strides = None

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": self.host_dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": self.strides, "stream": self.stream}


class DLArray(DevArray):
    """Exports DLPack on CUDA device 0, as torch, CuPy and JAX do."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        self.dlpack_streams.append(stream)
        shape = (ctypes.c_int64 * 1)(self.n)
        code, bits = _DL[self.kind]
        m = _DLManagedTensor()
        m.dl_tensor = _DLTensor(vp(self.base), _DLDevice(2, 0), 1, _DLDataType(code, bits, 1), shape, None,
                                self.byte_offset)
        self._keep += [shape, m]
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)


HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def hold(stream, seconds):
    """Hold stream (a host function that waits) for seconds: work queued
    after it runs late, so a call not ordered on the stream reads too early."""
    opened = threading.Event()
    fn = HOSTFN(lambda _: opened.wait(60))
    ck(lib.cudaLaunchHostFunc(vp(stream), fn, None), "cudaLaunchHostFunc")
    threading.Timer(seconds, opened.set).start()
    return fn  # keep the callback alive until the stream has run it


class TorchLikeStream:
    """What nexar reads of a torch.cuda.Stream."""

    def __init__(self, s):
        self.cuda_stream = s


def bf16(x):
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def values(kind, r, n):
    """Rank r's input: small integers, exact in every type and any order."""
    v = (np.arange(n) * 7 + r * 3) % 5 + 1
    return bf16(v) if kind == "bf16" else v.astype(kind)


def expect(what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{what}: element {bad[0]} is {got[bad[0]]!r}, want {want[bad[0]]!r} ({bad.size} differ)"


def main():
    comm = nexar.init()
    r, n = comm.rank, comm.size
    s = new_stream()
    count = 1001

    # Blocking calls, every dtype, __cuda_array_interface__ without a
    # stream (v2 exporters) and with the legacy default stream (CuPy on its
    # default stream), and DLPack.
    ops = {"sum": (nexar.Op.SUM, np.add), "max": (nexar.Op.MAX, np.maximum), "prod": (nexar.Op.PROD, np.multiply)}
    for kind in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bf16"):
        cls = DLArray if kind == "bf16" else (CaiArray if kind.startswith(("int", "float1")) else DLArray)
        for opname, (op, f) in ops.items():
            if kind == "bf16" and opname != "sum":
                continue
            a = cls(count, kind, stream=1 if cls is CaiArray and kind != "int8" else None).put(values(kind, r, count), s)
            b = cls(count, kind)
            ck(lib.cudaStreamSynchronize(vp(s)), "sync")  # a blocking call orders after the legacy stream only
            comm.allreduce(a, b, op=op)
            if kind == "bf16":
                want = bf16(sum(values("float32", q, count) for q in range(n)))
            else:
                want = values(kind, 0, count)
                for q in range(1, n):
                    want = f(want, values(kind, q, count)).astype(kind)
            expect(f"allreduce {kind} {opname}", b.get(s), want)
            expect(f"allreduce {kind} {opname}: sendbuf untouched", a.get(s), values(kind, r, count))
            if cls is DLArray:
                assert a.dlpack_streams[-1] == 1, f"DLPack exporter told stream {a.dlpack_streams[-1]}, want 1 (legacy)"

    # On a stream: inputs written by copies queued on s (delayed by the
    # fake), results read back on s. Arrays name s as their producer's
    # stream (CAI) or are told it (DLPack).
    for cls in (CaiArray, DLArray):
        tag = cls.__name__
        for st in (s, TorchLikeStream(s)):
            keep = hold(s, 0.3)  # the input below is written late
            a = cls(count, "float32", stream=s).put(values("float32", r, count), s)
            comm.allreduce(a, op=nexar.Op.SUM, stream=st)  # in place
            expect(f"{tag} allreduce stream", a.get(s), sum(values("float32", q, count) for q in range(n)))
            del keep
            if cls is DLArray:
                assert a.dlpack_streams == [s], f"DLPack exporter told {a.dlpack_streams}, want [{s:#x}]"

        root = n - 1
        b = cls(count, "int64", stream=s).put(values("int64", r, count), s)
        comm.broadcast(b, root=root, stream=s)
        expect(f"{tag} broadcast stream", b.get(s), values("int64", root, count))

        a = cls(count, "int32", stream=s).put(values("int32", r, count), s)
        g = cls(count * n, "int32", stream=s)
        comm.allgather(a, g, stream=s)
        expect(f"{tag} allgather stream", g.get(s), np.concatenate([values("int32", q, count) for q in range(n)]))

        rs = cls(count * n, "float64", stream=s).put(values("float64", r, count * n), s)
        rr = cls(count, "float64", stream=s)
        comm.reduce_scatter(rs, rr, op=nexar.Op.SUM, stream=s)
        full = sum(values("float64", q, count * n) for q in range(n))
        expect(f"{tag} reduce_scatter stream", rr.get(s), full[r * count:(r + 1) * count])

        nxt, prv = (r + 1) % n, (r + n - 1) % n
        out = cls(count, "uint8", stream=s).put(values("uint8", r, count), s)
        inn = cls(count, "uint8", stream=s)
        for step in ((lambda: comm.send(out, nxt, tag=3, stream=s)),
                     (lambda: comm.recv(inn, prv, tag=3, stream=s)))[::1 if r % 2 == 0 else -1]:
            assert step() is None
        expect(f"{tag} send/recv stream", inn.get(s), values("uint8", prv, count))

    # Blocking calls without a _stream form take CUDA arrays too (staged).
    ck(lib.cudaStreamSynchronize(vp(s)), "sync")
    a = CaiArray(count, "int64").put(values("int64", r, count), s)
    red = CaiArray(count, "int64")
    ck(lib.cudaStreamSynchronize(vp(s)), "sync")
    comm.reduce(a, red if r == 0 else None, op=nexar.Op.SUM, root=0)
    if r == 0:
        expect("reduce", red.get(s), sum(values("int64", q, count) for q in range(n)))
    at = DLArray(count * n, "int64").put(values("int64", r, count * n), s)
    ar = DLArray(count * n, "int64")
    ck(lib.cudaStreamSynchronize(vp(s)), "sync")
    comm.alltoall(at, ar)
    expect("alltoall", ar.get(s), np.concatenate([values("int64", q, count * n)[r * count:(r + 1) * count]
                                                  for q in range(n)]))
    # A DLPack byte_offset is honoured.
    off = DLArray(count, "int32", byte_offset=64).put(values("int32", r, count), s)
    ck(lib.cudaStreamSynchronize(vp(s)), "sync")
    comm.allreduce(off, op=nexar.Op.MAX)
    expect("allreduce at a byte_offset", off.get(s), np.maximum.reduce([values("int32", q, count) for q in range(n)]))

    # Refusals, before anything is sent.
    a = CaiArray(count, "float32", stream=s)
    try:
        comm.allreduce(a)
        raise AssertionError("a blocking call took an array produced on another stream")
    except ValueError as e:
        assert "pass stream=" in str(e), e
    nc = CaiArray(count, "float32")
    nc.strides = (8,)
    try:
        comm.allreduce(nc, stream=s)
        raise AssertionError("a non-contiguous CUDA array was taken")
    except ValueError as e:
        assert "non-contiguous" in str(e), e
    try:
        comm.allreduce(DLArray(4, "float32"), stream="s")
        raise AssertionError("a str was taken as a stream")
    except TypeError as e:
        assert "cudaStream_t" in str(e), e
    # Non-blocking calls refuse device memory (libnexar says why).
    try:
        comm.iallreduce(DLArray(count, "float32")).wait()
        raise AssertionError("iallreduce took device memory")
    except nexar.Error as e:
        assert "device memory" in str(e), e

    comm.barrier()
    print(f"rank {r}: device buffers ok", flush=True)
    comm.close()


if __name__ == "__main__":
    sys.exit(main())
