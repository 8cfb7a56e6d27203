"""ProcessGroupNexar: a Python torch.distributed ProcessGroup over libnexar.

Design (see reference/torch-backend.md):

- Rendezvous goes through the Store torch hands the creator: rank 0 draws a
  random token and a seed address (its own host, a free port) and publishes
  both; the other ranks read them and join. A process that cannot read the
  job's Store cannot join.
- Collectives run in issue order on one worker thread per group, calling the
  blocking C ABI with the GIL released, so every rank issues them in the same
  order and the caller overlaps compute with communication (DDP).
- Point-to-point operations are posted at once in the caller's thread with the
  non-blocking C ABI (so (source, tag) order is the program's order) and are
  waited for on a helper thread each.
- Work objects are a Work subclass: wait() raises the operation's error (the
  future-wrapping Work of torch swallows it), get_future() carries the result,
  or the error as a failed Future that DDP and other C++ readers see failed.
"""

from __future__ import annotations

import os
import queue
import secrets
import socket
import threading
import time
import warnings
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

from .. import _errors
from .._types import AVG, BAND, BOR, BXOR, MAX, MIN, PROD, SUM, Datatype, from_torch_dtype

__all__ = ["ProcessGroupNexar", "NexarWork"]

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
_U8 = int(Datatype.UINT8)


def _lib():
    from .. import _comm

    return _comm._lib


# ---------------------------------------------------------------------------
# Work


class NexarWork(dist.Work):
    """Completion of one nexar operation.

    wait() blocks (without the GIL) until the operation is done and raises its
    error; get_future() returns a torch Future completed with the output
    tensors or with the exception. Safe to use from any thread.
    """

    def __init__(self, result, op_name: str = ""):
        super().__init__()
        self._result = result
        self._op_name = op_name
        # Future.set_exception marks only the Python wrapper failed: C++
        # readers (DDP's reducer, a Work made from the Future) see a success
        # whose value is the exception object, and DDP crashes indexing the
        # tensors it expects. A then() callback that raises marks the C++
        # future failed, so the outcome reaches _fut through one (_outcome).
        self._src = torch.futures.Future()
        self._fut = self._src.then(_outcome)
        self._event = threading.Event()
        self._exc: Optional[BaseException] = None
        self._source = -1

    def _complete(self, exc: Optional[BaseException] = None):
        self._exc = exc
        try:
            self._src.set_result((exc, self._result))
        except Exception as e:  # a raising .then() callback must not kill the worker
            warnings.warn(f"nexar: a callback of {self._op_name} raised: {e!r}", RuntimeWarning)
        finally:
            self._event.set()

    def wait(self, timeout=None):
        secs = None
        if timeout is not None:
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
            if secs <= 0:  # c10d's kNoTimeout
                secs = None
        if not self._event.wait(secs):
            raise RuntimeError(f"nexar: {self._op_name} did not complete within {timeout}")
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        return self._event.is_set()

    def is_success(self):
        return self._event.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def get_future(self):
        return self._fut

    def result(self):
        self.wait()
        return self._result if isinstance(self._result, list) else [self._result]

    def _source_rank(self):
        self.wait()
        return self._source

    source_rank = _source_rank

    def synchronize(self):
        self.wait()


def _outcome(src):
    """then() callback of NexarWork: the operation's result, or its error
    raised so that torch marks the Future failed (wait() and value() then
    raise a RuntimeError carrying the error's type and message)."""
    exc, result = src.value()
    if exc is not None:
        raise exc
    return result


def _done_work(result, op_name=""):
    w = NexarWork(result, op_name)
    w._complete()
    return w


# ---------------------------------------------------------------------------
# Tensor staging


class _Staged:
    """A contiguous (optionally converted or copied) stand-in for a CPU tensor.

    w has t's shape; back() copies w into t when they are not the same memory.
    """

    __slots__ = ("t", "w", "copy")

    def __init__(self, t: torch.Tensor, dtype: Optional[torch.dtype] = None, force_copy: bool = False):
        if t.device.type != "cpu":
            raise ValueError(f"nexar: only CPU tensors are supported, got one on {t.device}")
        self.t = t
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
        self.w = w
        self.copy = w.data_ptr() != t.data_ptr() or w.dtype != t.dtype or not t.is_contiguous()

    @property
    def addr(self) -> int:
        return self.w.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    def back(self):
        if self.copy:
            with torch.no_grad():
                self.t.copy_(self.w)


def _op_of(opts) -> tuple:
    """(nexar op, premul factor or None) for opts.reduceOp."""
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


_SMALL_INTS = (torch.int16,) + tuple(getattr(torch, n) for n in ("uint16",) if hasattr(torch, n))


class _Red:
    """A tensor prepared for a reduction: staged copy, the buffer to pass
    (address, count), nexar dtype and op.

    bool reduces as uint8 with logical ops, int16/uint16 through int32,
    complex as pairs of reals (SUM/AVG only); PREMUL_SUM scales a copy.
    """

    __slots__ = ("s", "buf", "dt", "op", "count")

    def __init__(self, t: torch.Tensor, op, factor=None, need_copy: bool = False):
        dt = t.dtype
        s = _Staged(t, torch.int32 if dt in _SMALL_INTS else None,
                    force_copy=need_copy or factor is not None)
        if factor is not None:
            with torch.no_grad():
                s.w.mul_(factor)
        buf = s.w
        if dt == torch.bool:
            if op == AVG:
                raise ValueError("nexar: ReduceOp.AVG is not defined for bool tensors")
            op = {SUM: BOR, MAX: BOR, BOR: BOR, PROD: BAND, MIN: BAND, BAND: BAND, BXOR: BXOR}[op]
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
        self.buf = buf
        self.dt = int(ndt)
        self.op = int(op)
        self.count = buf.numel()

    @property
    def addr(self) -> int:
        return self.buf.data_ptr()


def _flat_cat(tensors: List[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tag(tag) -> int:
    return int(tag) & 0xFFFFFFFFFFFFFFFF


# ---------------------------------------------------------------------------
# Rendezvous helpers


def _advertise_host() -> str:
    h = os.environ.get("NEXAR_ADVERTISE_HOST")
    if h:
        return h
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    return "127.0.0.1"


def _free_port(host: str) -> int:
    """A port free for both TCP and UDP on host (the seed may use either)."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            t.bind((host, 0))
            port = t.getsockname()[1]
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                    u.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError("nexar: no free port for the seed")


def _rendezvous(store, rank: int, size: int):
    """Agree on (seed address, token) through the torch Store.

    Every rank adds one to a join counter; the counter tells which incarnation
    of this group (prefix) we belong to, so a group re-created under the same
    prefix (destroy_process_group, then init again on a FileStore) never reads
    the previous incarnation's seed.
    """
    n = store.add("nexar/joins", 1)
    epoch = (n - 1) // size
    key = f"nexar/{epoch}/"
    if rank == 0:
        host = _advertise_host()
        seed = f"{host}:{_free_port(host)}"
        token = secrets.token_bytes(32)
        store.set(key + "token", token.hex())
        store.set(key + "seed", seed)
    else:
        seed = store.get(key + "seed").decode()
        token = bytes.fromhex(store.get(key + "token").decode())
    return seed, token


# ---------------------------------------------------------------------------
# The process group


class ProcessGroupNexar(dist.ProcessGroup):
    """torch.distributed backend "nexar" (CPU tensors).

    Created by torch through the registered creator; one libnexar
    communicator per group. Methods are called by torch from any thread;
    collectives are queued to one worker thread in call order.
    """

    supports_coalescing = False

    def __init__(self, store, rank: int, size: int, timeout: timedelta = timedelta(minutes=30),
                 group_id: str = ""):
        super().__init__(rank, size)
        from .. import _comm

        self._rank_ = rank
        self._size_ = size
        self._group_id = group_id
        seed, token = _rendezvous(store, rank, size)
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        self._comm = _comm.Comm(rank=rank, world_size=size, seed=seed, token=token,
                                timeout=secs, connect_timeout=secs)
        self._h = self._comm.handle
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._closed = False
        self._coalescing: Optional[list] = None
        self._worker = threading.Thread(target=_worker_loop, args=(self._q,),
                                        name=f"nexar-pg-{group_id or 'x'}-r{rank}", daemon=True)
        self._worker.start()

    # ---- identity -------------------------------------------------------
    # torch keeps a group's name and description in its backends; a Python
    # ProcessGroup registers none, so _set_group_name would store nothing
    # and group_name (which destroy_process_group reads) would raise
    # "ProcessGroup name not set". Keep them here.
    _nexar_group_name = ""
    _nexar_group_desc = ""

    def _set_group_name(self, name):
        self._nexar_group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self):
        if not self._nexar_group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._nexar_group_name

    def _set_group_desc(self, desc):
        self._nexar_group_desc = desc
        super()._set_group_desc(desc)

    @property
    def group_desc(self):
        return self._nexar_group_desc or "undefined"

    def getBackendName(self):
        return "nexar"

    def _get_backend_name(self):
        return "nexar"

    def _get_backend(self, device=None):
        # batch_isend_irecv asks the backend of the device whether it
        # coalesces; a Python group is its own backend.
        return self

    @property
    def comm(self):
        """The underlying nexar.Comm (do not issue collectives on it concurrently)."""
        return self._comm

    def __repr__(self):
        return f"<ProcessGroupNexar rank={self._rank_} size={self._size_} group={self._group_id!r}>"

    # ---- lifecycle --------------------------------------------------------
    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._worker.join(timeout=60)
        try:
            self._comm.close()
        except _errors.Error:
            pass

    def abort(self):
        if not self._closed:
            try:
                self._comm.abort()
            except _errors.Error:
                pass
        self.shutdown()

    def __del__(self):
        try:
            if not self._closed and os.getpid() == self._comm._pid:
                self._closed = True
                self._q.put(None)
        except Exception:
            pass

    # ---- plumbing ------------------------------------------------------------
    def _enqueue(self, name: str, result, fn) -> NexarWork:
        if self._closed:
            raise _errors.ClosedError(7, f"nexar: {name} on a process group that was shut down")
        self._comm._check()
        w = NexarWork(result, name)
        self._q.put((fn, w))
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    # ---- allreduce -------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op, factor = _op_of(opts)
        h = self._h
        lib = _lib()

        def fn():
            for t in tensors:
                if t.is_sparse:
                    self._sparse_allreduce(t, op, lib, h)
                    continue
                r = _Red(t, op, factor)
                lib.allreduce(r.addr, r.addr, r.count, r.dt, r.op, h)
                r.s.back()
        return self._enqueue("allreduce", tensors, fn)

    def _sparse_allreduce(self, t: torch.Tensor, op, lib, h):
        """Sum of sparse COO tensors, as gloo does it: every rank gathers
        every rank's indices and values, concatenates and coalesces, so all
        ranks compute the same result. t is replaced in place."""
        if op != SUM:
            raise ValueError("nexar: sparse tensors are reduced with SUM only")
        c = t.coalesce()
        idx, val = c.indices().contiguous(), c.values().contiguous()
        nnz = torch.tensor([idx.shape[1]], dtype=torch.int64)
        counts = torch.empty(self._size_, dtype=torch.int64)
        lib.allgather(nnz.data_ptr(), counts.data_ptr(), 1, int(Datatype.INT64), h)
        nnzs = counts.tolist()

        def gather(part: torch.Tensor, per_nnz: int, dims) -> torch.Tensor:
            # part: this rank's nnz entries, per_nnz bytes each; the result
            # is every rank's, in rank order, laid out the same way.
            es = part.element_size()
            sizes = [k * per_nnz for k in nnzs]
            displs, off = [], 0
            for x in sizes:
                displs.append(off)
                off += x
            out = torch.empty(off // es, dtype=part.dtype)
            lib.allgatherv(part.data_ptr() if part.numel() else 0, part.numel() * es,
                           out.data_ptr() if off else 0, sizes, displs, _U8, h)
            return out.view(-1, *dims) if dims else out
        # indices are (sparse_dim, nnz): gather them transposed so that each
        # entry's coordinates are contiguous.
        sd = idx.shape[0]
        all_idx = gather(idx.t().contiguous(), sd * 8, (sd,)).t()
        vdims = tuple(val.shape[1:])
        per = val.element_size() * (int(torch.tensor(vdims).prod()) if vdims else 1)
        all_val = gather(val, per, vdims)
        res = torch.sparse_coo_tensor(all_idx, all_val, t.shape, dtype=t.dtype).coalesce()
        with torch.no_grad():
            t.copy_(res)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    # ---- broadcast / reduce ---------------------------------------------------
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        h = self._h
        lib = _lib()

        def fn():
            for t in tensors:
                s = _Staged(t)
                lib.broadcast(s.addr, s.nbytes, _U8, root, h)
                if self._rank_ != root:
                    s.back()
        return self._enqueue("broadcast", tensors, fn)

    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        op, factor = _op_of(opts)
        h = self._h
        lib = _lib()
        me = self._rank_

        def fn():
            for t in tensors:
                r = _Red(t, op, factor)
                lib.reduce(r.addr, r.addr, r.count, r.dt, r.op, root, h)
                if me == root:
                    r.s.back()
        return self._enqueue("reduce", tensors, fn)

    # ---- allgather -------------------------------------------------------------
    def _allgather_into_list(self, outs: List[torch.Tensor], inp: torch.Tensor, lib, h):
        n = self._size_
        if len(outs) != n:
            raise ValueError(f"nexar: allgather needs {n} output tensors, got {len(outs)}")
        s = _Staged(inp)
        sizes = [_nbytes(o) for o in outs]
        if sizes[self._rank_] != s.nbytes:
            raise ValueError("nexar: allgather: output tensor for this rank does not match the input size")
        tmp = torch.empty(sum(sizes), dtype=torch.uint8)
        if all(x == sizes[0] for x in sizes):
            lib.allgather(s.addr, tmp.data_ptr(), s.nbytes, _U8, h)
        else:
            displs, off = [], 0
            for x in sizes:
                displs.append(off)
                off += x
            lib.allgatherv(s.addr, s.nbytes, tmp.data_ptr(), sizes, displs, _U8, h)
        off = 0
        with torch.no_grad():
            for o, x in zip(outs, sizes):
                o.copy_(tmp[off:off + x].view(o.dtype).view(o.shape) if x else o)
                off += x

    def allgather(self, output_tensors, input_tensors, opts=None):
        h = self._h
        lib = _lib()

        def fn():
            for outs, inp in zip(output_tensors, input_tensors):
                self._allgather_into_list(outs, inp, lib, h)
        return self._enqueue("allgather", output_tensors, fn)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        h = self._h
        lib = _lib()

        def fn():
            for i, inp in enumerate(input_list):
                self._allgather_into_list([output_lists[r][i] for r in range(self._size_)], inp, lib, h)
        return self._enqueue("allgather_coalesced", output_lists, fn)

    def _allgather_base(self, output, input, opts=None):
        h = self._h
        lib = _lib()
        n = self._size_

        def fn():
            s = _Staged(input)
            o = _Staged(output)
            if o.nbytes != n * s.nbytes:
                raise ValueError(f"nexar: all_gather_into_tensor: output has {o.nbytes} bytes, "
                                 f"expected {n} x {s.nbytes}")
            lib.allgather(s.addr, o.addr, s.nbytes, _U8, h)
            o.back()
        return self._enqueue("_allgather_base", [output], fn)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        h = self._h
        lib = _lib()
        n = self._size_

        def fn():
            for output, input in zip(outputs, inputs):
                s, o = _Staged(input), _Staged(output)
                if o.nbytes != n * s.nbytes:
                    raise ValueError("nexar: allgather_into_tensor_coalesced: output size mismatch")
                lib.allgather(s.addr, o.addr, s.nbytes, _U8, h)
                o.back()
        return self._enqueue("allgather_into_tensor_coalesced", outputs, fn)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # ---- reduce-scatter -----------------------------------------------------
    def _reduce_scatter_one(self, out: torch.Tensor, inp: torch.Tensor, op, factor, lib, h):
        n = self._size_
        if inp.numel() != n * out.numel():
            raise ValueError(f"nexar: reduce_scatter: input has {inp.numel()} elements, "
                             f"expected {n} x {out.numel()}")
        ri = _Red(inp, op, factor)
        ro = _Red(out, op)
        lib.reduce_scatter(ri.addr, ro.addr, ro.count, ro.dt, ro.op, h)
        ro.s.back()

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op, factor = _op_of(opts)
        h = self._h
        lib = _lib()

        def fn():
            for out, ins in zip(output_tensors, input_lists):
                if len(ins) != self._size_:
                    raise ValueError(f"nexar: reduce_scatter needs {self._size_} input tensors")
                self._reduce_scatter_one(out, _flat_cat(ins), op, factor, lib, h)
        return self._enqueue("reduce_scatter", output_tensors, fn)

    def _reduce_scatter_base(self, output, input, opts=None):
        op, factor = _op_of(opts)
        h = self._h
        lib = _lib()

        def fn():
            self._reduce_scatter_one(output, input, op, factor, lib, h)
        return self._enqueue("_reduce_scatter_base", [output], fn)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op, factor = _op_of(opts)
        h = self._h
        lib = _lib()

        def fn():
            for out, inp in zip(outputs, inputs):
                self._reduce_scatter_one(out, inp, op, factor, lib, h)
        return self._enqueue("reduce_scatter_tensor_coalesced", outputs, fn)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # ---- all-to-all -----------------------------------------------------------
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        h = self._h
        lib = _lib()
        n = self._size_

        def fn():
            s, o = _Staged(input), _Staged(output)
            if not output_split_sizes and not input_split_sizes:
                if s.nbytes != o.nbytes or s.nbytes % n:
                    raise ValueError("nexar: all_to_all_single: input and output must have the same size, "
                                     f"a multiple of {n}")
                lib.alltoall(s.addr, o.addr, s.nbytes // n, _U8, h)
            else:
                def counts(t, splits):
                    rows = t.shape[0] if t.dim() > 0 else 1
                    row = (_nbytes(t) // rows) if rows else 0
                    if not splits:
                        if rows % n:
                            raise ValueError("nexar: all_to_all_single: dim 0 is not divisible by the world size")
                        splits = [rows // n] * n
                    if len(splits) != n or sum(splits) != rows:
                        raise ValueError("nexar: all_to_all_single: split sizes do not match the tensor")
                    c = [int(x) * row for x in splits]
                    d, off = [], 0
                    for x in c:
                        d.append(off)
                        off += x
                    return c, d
                sc, sd = counts(input, input_split_sizes)
                rc, rd = counts(output, output_split_sizes)
                lib.alltoallv(s.addr, sc, sd, o.addr, rc, rd, _U8, h)
            o.back()
        return self._enqueue("alltoall_base", [output], fn)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        h = self._h
        lib = _lib()
        n = self._size_

        def fn():
            if len(output_tensors) != n or len(input_tensors) != n:
                raise ValueError(f"nexar: all_to_all needs {n} input and {n} output tensors")
            sin = torch.cat([t.detach().reshape(-1).view(torch.uint8) if t.numel() else
                             torch.empty(0, dtype=torch.uint8) for t in
                             [x.contiguous() for x in input_tensors]])
            sc = [_nbytes(t) for t in input_tensors]
            rc = [_nbytes(t) for t in output_tensors]
            sd, rd, a, b = [], [], 0, 0
            for x, y in zip(sc, rc):
                sd.append(a)
                rd.append(b)
                a += x
                b += y
            tmp = torch.empty(sum(rc), dtype=torch.uint8)
            lib.alltoallv(sin.data_ptr(), sc, sd, tmp.data_ptr(), rc, rd, _U8, h)
            with torch.no_grad():
                for o, off, x in zip(output_tensors, rd, rc):
                    if x:
                        o.copy_(tmp[off:off + x].view(o.dtype).view(o.shape))
        return self._enqueue("alltoall", output_tensors, fn)

    # ---- gather / scatter -----------------------------------------------------
    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        h = self._h
        lib = _lib()
        n = self._size_
        me = self._rank_

        def fn():
            s = _Staged(input_tensors[0])
            if me == root:
                outs = output_tensors[0]
                if len(outs) != n:
                    raise ValueError(f"nexar: gather needs {n} output tensors on the root")
                sizes = [_nbytes(o) for o in outs]
                tmp = torch.empty(sum(sizes), dtype=torch.uint8)
                displs, off = [], 0
                for x in sizes:
                    displs.append(off)
                    off += x
                lib.gatherv(s.addr, s.nbytes, tmp.data_ptr(), sizes, displs, _U8, root, h)
                with torch.no_grad():
                    for o, d, x in zip(outs, displs, sizes):
                        if x:
                            o.copy_(tmp[d:d + x].view(o.dtype).view(o.shape))
            else:
                lib.gatherv(s.addr, s.nbytes, 0, [], [], _U8, root, h)
        return self._enqueue("gather", output_tensors, fn)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        h = self._h
        lib = _lib()
        n = self._size_
        me = self._rank_

        def fn():
            o = _Staged(output_tensors[0])
            if me == root:
                ins = input_tensors[0]
                if len(ins) != n:
                    raise ValueError(f"nexar: scatter needs {n} input tensors on the root")
                sizes = [_nbytes(t) for t in ins]
                cat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in ins])
                displs, off = [], 0
                for x in sizes:
                    displs.append(off)
                    off += x
                lib.scatterv(cat.data_ptr(), sizes, displs, o.addr, o.nbytes, _U8, root, h)
            else:
                lib.scatterv(0, [], [], o.addr, o.nbytes, _U8, root, h)
            o.back()
        return self._enqueue("scatter", output_tensors, fn)

    # ---- barrier ------------------------------------------------------------------
    def barrier(self, opts=None):
        h = self._h
        lib = _lib()

        def fn():
            lib.barrier(h)
        return self._enqueue("barrier", [], fn)

    # ---- monitored barrier ------------------------------------------------------
    # torch.distributed.monitored_barrier runs on a group's CPU backend: say
    # we are one (a Python ProcessGroup registers no backend to tell).
    @property
    def _device_types(self):
        return [torch.device("cpu")]

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Like gloo's: rank 0 waits up to timeout for every other rank to
        check in and names those that did not (all of them with
        wait_all_ranks); the others wait for rank 0's answer. Blocking, on
        point-to-point messages with tags of their own (0xFFFFFFFF00000000
        plus a call counter)."""
        self._comm._check()
        lib, h = _lib(), self._h
        if timeout is None:
            secs = 1800.0
        elif isinstance(timeout, timedelta):
            secs = timeout.total_seconds()
        else:
            secs = float(timeout)
        seq = self._mb_seq = getattr(self, "_mb_seq", -1) + 1
        tag = 0xFFFFFFFF00000000 | (seq & 0xFFFFFFFF)
        deadline = time.monotonic() + secs
        ms = int(secs * 1000)
        one = torch.ones(1, dtype=torch.uint8)
        if self._rank_ == 0:
            failed = []
            for r in range(1, self._size_):
                if time.monotonic() >= deadline and not failed:
                    # Out of time before waiting on anyone: gloo blames
                    # rank 0 itself.
                    raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms")
                if not self._mb_recv(lib, h, r, tag, deadline):
                    failed.append(r)
                    if not wait_all_ranks:
                        break
            if failed:
                who = f"Rank {failed[0]}" if len(failed) == 1 else "Ranks " + ", ".join(map(str, failed))
                raise RuntimeError(f"{who} failed to pass monitoredBarrier in {ms} ms")
            for r in range(1, self._size_):
                lib.send(one.data_ptr(), 1, _U8, r, tag, h)
            return
        lib.send(one.data_ptr(), 1, _U8, 0, tag, h)
        if not self._mb_recv(lib, h, 0, tag, deadline):
            raise RuntimeError(
                f"Rank {self._rank_} successfully reached monitoredBarrier, but received errors while "
                f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.")

    def _mb_recv(self, lib, h, peer, tag, deadline) -> bool:
        """Receive monitored_barrier's byte from peer by deadline. A receive
        given up stays posted (the C ABI cannot withdraw it), so its buffer
        is kept alive with the group."""
        buf = torch.zeros(1, dtype=torch.uint8)
        q = lib.irecv(buf.data_ptr(), 1, _U8, int(peer), tag, h)
        while not lib.test(q):
            if time.monotonic() >= deadline:
                self.__dict__.setdefault("_mb_orphans", []).append(buf)
                lib.request_free(q)
                return False
            time.sleep(0.0005)
        lib.request_free(q)
        return True

    # ---- point-to-point ---------------------------------------------------------
    def _p2p(self, name, tensors, peer, tag, recv):
        if len(tensors) != 1:
            raise ValueError(f"nexar: {name} takes exactly one tensor")
        self._comm._check()
        lib = _lib()
        s = _Staged(tensors[0])
        fn = lib.irecv if recv else lib.isend
        q = fn(s.addr, s.nbytes, _U8, int(peer), _tag(tag), self._h)
        w = NexarWork(tensors, name)

        def waiter():
            err = None
            try:
                lib.wait(q)
                if recv:
                    w._source = lib.request_status(q)[0]
                    s.back()
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
                err = e
            finally:
                try:
                    lib.request_free(q)
                except Exception:
                    pass
            w._complete(err)
        threading.Thread(target=waiter, name=f"nexar-{name}", daemon=True).start()
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    def send(self, tensors, dstRank, tag=0):
        return self._p2p("send", tensors, dstRank, tag, False)

    def recv(self, tensors, srcRank, tag=0):
        return self._p2p("recv", tensors, srcRank, tag, True)

    def recv_anysource(self, tensors, tag=0):
        return self._p2p("recv_anysource", tensors, -1, tag, True)

    # ---- coalescing (batch_isend_irecv, _coalescing_manager) ------------------------
    def _start_coalescing(self, device=None):
        self._coalescing = []

    def _end_coalescing(self, device=None):
        works, self._coalescing = self._coalescing or [], None
        agg = NexarWork([], "coalesced")

        def waiter():
            err = None
            for w in works:
                try:
                    w.wait()
                except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
                    err = err or e
            agg._complete(err)
        # Waiting on a thread of its own keeps queued collectives moving.
        threading.Thread(target=waiter, name="nexar-coalesced", daemon=True).start()
        return agg

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing


def _worker_loop(q: "queue.SimpleQueue"):
    """Run queued collectives in order; deliver each result or error to its Work."""
    while True:
        item = q.get()
        if item is None:
            return
        fn, work = item
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
            work._complete(e)
        else:
            work._complete()
