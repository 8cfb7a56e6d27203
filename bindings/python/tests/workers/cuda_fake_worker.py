"""The torch backend's CUDA code path against the fake CUDA runtime
(tests/fakes/cudart, named by NEXAR_CUDART): objects standing in for CUDA
tensors (a torch.device("cuda", 0), a data_ptr() into fake device memory
that the host cannot read) and a CudaOps stand-in whose streams and events
are the fake's. Checks every collective element by element for several
dtypes and ops, that an asynchronous collective returns at once and waits
on the device for the work already on the caller's stream, the Work's CUDA
semantics, the errors, and, on the fake's timeline, that DDP's bucket
all_reduces and FSDP2's prefetched all_gathers overlap compute
(CUDA_FAKE_PART=overlap runs only those, reporting instead of failing,
against whatever backend is imported). What this does not prove: that torch's own
CUDA tensors, streams and events behave as these stand-ins (that needs a
GPU: scripts/gpu_check.sh). Run as 2+ ranks with torchrun's variables; with
NEXAR_NCCL naming the fake NCCL and HIER_HOSTS the ranks' hosts, the same
checks run through NCCL within a host and nexar between hosts."""

import ctypes
import faulthandler
import os
import threading
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

import nexar.torch  # noqa: F401
from nexar.torch._cuda import CudaWork

lib = ctypes.CDLL(os.environ["NEXAR_CUDART"])
vp = ctypes.c_void_p
H2D, D2H = 1, 2
lib.cuStreamWaitValue32.argtypes = [vp, ctypes.c_ulonglong, ctypes.c_uint32, ctypes.c_uint]
lib.nexarFakeCudaTimeline.restype = ctypes.c_size_t
lib.nexarFakeCudaTimeline.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def ck(rc, what):
    assert rc == 0, f"{what}: cudaError {rc}"


class FakeOps:
    """CudaOps (nexar/torch/_cuda.py) over the fake runtime; cur is the
    "current stream"."""

    def __init__(self):
        self.cur = self.new_stream(None)
        self.recorded = 0

    def stream(self, device):
        return self.cur

    def new_stream(self, device):
        s = vp()
        ck(lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "cudaStreamCreateWithFlags")
        return s.value

    def record(self, stream, device):
        ev = vp()
        ck(lib.cudaEventCreateWithFlags(ctypes.byref(ev), 2), "cudaEventCreateWithFlags")
        ck(lib.cudaEventRecord(ev, vp(stream)), "cudaEventRecord")
        self.recorded += 1
        return ev

    def wait(self, event, device):
        ck(lib.cudaStreamWaitEvent(vp(self.cur), event, 0), "cudaStreamWaitEvent")

    def stream_wait(self, stream, event, device):
        ck(lib.cudaStreamWaitEvent(vp(stream), event, 0), "cudaStreamWaitEvent")

    def query(self, event):
        return lib.cudaEventQuery(event) == 0

    def synchronize(self, event):
        ck(lib.cudaEventSynchronize(event), "cudaEventSynchronize")

    def host_like(self, t):
        return torch.empty(t.shape, dtype=t.dtype)

    def d2h(self, host, t, stream):
        assert t.is_contiguous(), "the stand-in copies contiguous tensors only"
        ck(lib.cudaMemcpyAsync(vp(host.data_ptr()), vp(t.ptr), t.nbytes, D2H, vp(stream)), "cudaMemcpyAsync D2H")

    def h2d(self, t, host, stream):
        ck(lib.cudaMemcpyAsync(vp(t.ptr), vp(host.data_ptr()), t.nbytes, H2D, vp(stream)), "cudaMemcpyAsync H2D")

    def word(self, device):
        h = vp()
        ck(lib.cudaMallocHost(ctypes.byref(h), 4), "cudaMallocHost")
        ctypes.c_uint32.from_address(h.value).value = 0
        return h.value

    def wait_word(self, stream, addr, value):
        return lib.cuStreamWaitValue32(vp(stream), addr, value & 0xFFFFFFFF, 0) == 0

    def set_word(self, addr, value):
        ctypes.c_uint32.from_address(addr).value = value & 0xFFFFFFFF

    def future(self, result, device, stream):
        return None  # no CUDA futures without a GPU: the Work's host-completion future


class FakeCudaTensor:
    """What the backend reads of a CUDA tensor, over fake device memory."""

    is_cuda = True

    def __init__(self, shape, dtype=torch.float32, contiguous=True):
        self.shape = torch.Size((shape,) if isinstance(shape, int) else shape)
        self.device = torch.device("cuda", 0)
        self.dtype = dtype
        self._n = self.shape.numel()
        self._es = torch.empty(0, dtype=dtype).element_size()
        self._contig = contiguous
        p = vp()
        ck(lib.cudaMalloc(ctypes.byref(p), max(1, self._n * self._es)), "cudaMalloc")
        self.ptr = p.value

    @property
    def nbytes(self):
        return self._n * self._es

    def numel(self):
        return self._n

    def dim(self):
        return len(self.shape)

    def element_size(self):
        return self._es

    def data_ptr(self):
        return self.ptr

    def is_contiguous(self):
        return self._contig


def upload(ops, t, values: torch.Tensor):
    """Write values into t by a delayed copy on the current stream (from
    pinned memory, kept alive on the tensor)."""
    values = values.contiguous()
    nb = values.numel() * values.element_size()
    assert nb == t.nbytes, (nb, t.nbytes)
    if nb == 0:
        return
    h = vp()
    ck(lib.cudaMallocHost(ctypes.byref(h), nb), "cudaMallocHost")
    ctypes.memmove(h.value, values.data_ptr(), nb)
    ck(lib.cudaMemcpyAsync(vp(t.ptr), h, nb, H2D, vp(ops.cur)), "cudaMemcpyAsync H2D")
    t._keep = h


def download(ops, t) -> torch.Tensor:
    """t's contents after the work on the current stream (then a sync)."""
    out = torch.empty(t.shape, dtype=t.dtype)
    nb = t.nbytes
    ck(lib.cudaStreamSynchronize(vp(ops.cur)), "cudaStreamSynchronize")
    if nb == 0:
        return out
    h = vp()
    ck(lib.cudaMallocHost(ctypes.byref(h), nb), "cudaMallocHost")
    ck(lib.cudaMemcpyAsync(h, vp(t.ptr), nb, D2H, vp(ops.cur)), "cudaMemcpyAsync D2H")
    ck(lib.cudaStreamSynchronize(vp(ops.cur)), "cudaStreamSynchronize")
    ctypes.memmove(out.data_ptr(), h.value, nb)
    lib.cudaFreeHost(h)
    return out


def dev(ops, values: torch.Tensor) -> FakeCudaTensor:
    t = FakeCudaTensor(tuple(values.shape), values.dtype)
    upload(ops, t, values)
    return t


HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def gate(ops, timeout=60):
    """Hold the current stream until the returned Event is set (at most
    timeout seconds); its passed attribute says whether the stream went on."""
    opened = threading.Event()
    opened.passed = False

    def hold(_):
        opened.wait(timeout)
        opened.passed = True
    fn = HOSTFN(hold)
    ck(lib.cudaLaunchHostFunc(vp(ops.cur), fn, None), "cudaLaunchHostFunc")
    opened._fn = fn  # keep the callback alive
    return opened


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


lib.cudaLaunchKernel.argtypes = [vp, dim3, dim3, ctypes.POINTER(vp), ctypes.c_size_t, vp]


def kernel(ops, us: int, label: str):
    """Compute on the current stream: the fake's kernel, us microseconds."""
    d = ctypes.c_longlong(us)
    lab = ctypes.c_char_p(label.encode())
    args = (vp * 2)(ctypes.cast(ctypes.byref(d), vp), ctypes.cast(ctypes.byref(lab), vp))
    ck(lib.cudaLaunchKernel(ctypes.cast(lib.nexarFakeCudaKernel, vp), dim3(1, 1, 1), dim3(1, 1, 1), args, 0,
                            vp(ops.cur)), "cudaLaunchKernel")


def mark(label: str):
    lib.nexarFakeCudaTimelineMark(label.encode())


def timeline():
    """The fake's timeline: dicts of kind, stream, dst, src, n, enq, ret,
    start, end (ns), label."""
    n = lib.nexarFakeCudaTimeline(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.nexarFakeCudaTimeline(buf, n + 1)
    out = []
    for line in buf.value.decode().splitlines():
        f = line.split()
        assert f[0] != "dropped", "the timeline is full: raise NEXAR_FAKE_CUDA_TIMELINE"
        out.append(dict(kind=f[0], stream=int(f[1], 16), dst=int(f[2], 16), src=int(f[3], 16), n=int(f[4]),
                        enq=int(f[5]), ret=int(f[6]), start=int(f[7]), end=int(f[8]), label=f[9]))
    return out


RO = dist.ReduceOp


def val(r, shape, dtype, salt=0, top=5):
    """Rank r's input: small values (1..top) that every dtype holds exactly."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    x = (torch.arange(torch.Size(shape).numel(), dtype=torch.int64).reshape(shape) * 7 + r * 3 + salt) % top + 1
    if dtype == torch.bool:
        return x % 2 == 0
    if dtype.is_complex:
        return torch.complex(x.double(), (x % 3).double()).to(dtype)
    return x.to(dtype)


def reduced(xs, op, factor=None):
    """What a reduction of the tensors xs (one per rank) under op gives."""
    dt = xs[0].dtype
    if dt == torch.bool:
        ys = [x.to(torch.uint8) for x in xs]
        kind = {RO.SUM: "or", RO.MAX: "or", RO.BOR: "or", RO.MIN: "and", RO.PRODUCT: "and", RO.BAND: "and",
                RO.BXOR: "xor"}[op]
        acc = ys[0]
        for y in ys[1:]:
            acc = acc | y if kind == "or" else acc & y if kind == "and" else acc ^ y
        return acc.bool()
    if factor is not None:
        return sum(x.double() * factor if not dt.is_complex else x * factor for x in xs).to(dt)
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in (RO.SUM, RO.AVG):
            acc = acc + x
        elif op == RO.PRODUCT:
            acc = acc * x
        elif op == RO.MIN:
            acc = torch.minimum(acc, x)
        elif op == RO.MAX:
            acc = torch.maximum(acc, x)
        elif op == RO.BAND:
            acc = acc & x
        elif op == RO.BOR:
            acc = acc | x
        elif op == RO.BXOR:
            acc = acc ^ x
    if op == RO.AVG:
        acc = (acc.to(torch.complex128 if dt.is_complex else torch.float64) / len(xs)).to(dt)
    return acc


def same(got, want, what):
    """Element by element; half-precision averages within a rounding."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    if want.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(got, want)
    if not ok:
        bad = (got != want).reshape(-1).nonzero().reshape(-1)[:4].tolist()
        raise AssertionError(f"{what}: elements {bad} differ: got {got.reshape(-1)[bad].tolist()}, "
                             f"want {want.reshape(-1)[bad].tolist()}")


def red_opts(cls, op, root=None):
    o = cls()
    o.reduceOp = op
    if root is not None:
        o.rootRank = root
    return o


FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def op_cases():
    """(dtype, op, factor) for every dtype and op the CPU path takes."""
    for dt in FLOATS:
        for op in (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.AVG):
            yield dt, op, None
        yield dt, dist._make_nccl_premul_sum(2.0), 2.0
    for dt in INTS:
        for op in (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR):
            yield dt, op, None
    for op in (RO.SUM, RO.MIN, RO.MAX, RO.BXOR):
        yield torch.bool, op, None
    for op in (RO.SUM, RO.AVG):
        yield torch.complex64, op, None


def check_every_collective(be, ops, r, n):
    """Every collective torch calls, on CUDA tensors, against results
    computed here, element by element."""
    cnt = 7
    # all_reduce and all_reduce_coalesced: every dtype and op (libnexar's
    # stream-ordered call or staged here, PREMUL_SUM included).
    for i, (dt, op, factor) in enumerate(op_cases()):
        top = 3 if op == RO.PRODUCT else 5
        what = f"all_reduce {dt} {op}"
        t = dev(ops, val(r, cnt, dt, i, top))
        be.allreduce([t], red_opts(dist.AllreduceOptions, op)).wait()
        want = reduced([val(q, cnt, dt, i, top) for q in range(n)], op if factor is None else RO.SUM, factor)
        same(download(ops, t), want, what)
    for dts, op, factor in [((torch.float32, torch.float32), RO.SUM, None), ((torch.int64, torch.bool), RO.MAX, None),
                            ((torch.bfloat16, torch.float64), dist._make_nccl_premul_sum(2.0), 2.0)]:
        ts = [dev(ops, val(r, (3, cnt), d, j)) for j, d in enumerate(dts)]
        be.allreduce_coalesced(ts, red_opts(dist.AllreduceCoalescedOptions, op)).wait()
        for j, (t, d) in enumerate(zip(ts, dts)):
            same(download(ops, t), reduced([val(q, (3, cnt), d, j) for q in range(n)],
                                           op if factor is None else RO.SUM, factor),
                 f"allreduce_coalesced {dts} {op} #{j}")

    # reduce to root 1: the others' tensors are left as they were.
    for dt, op in [(torch.float32, RO.SUM), (torch.int32, RO.MAX), (torch.bfloat16, RO.PRODUCT), (torch.bool, RO.MIN),
                   (torch.complex64, RO.SUM)]:
        t = dev(ops, val(r, cnt, dt, 1, 3))
        be.reduce([t], red_opts(dist.ReduceOptions, op, root=1)).wait()
        want = reduced([val(q, cnt, dt, 1, 3) for q in range(n)], op) if r == 1 else val(r, cnt, dt, 1, 3)
        same(download(ops, t), want, f"reduce {dt} {op}")

    # all_gather (list): equal and uneven sizes; all_gather_coalesced.
    for dt, sizes in [(torch.float32, [cnt] * n), (torch.int64, [q + 1 for q in range(n)]), (torch.bool, [cnt] * n),
                      (torch.bfloat16, [2 * q + 1 for q in range(n)])]:
        inp = dev(ops, val(r, sizes[r], dt, 2))
        outs = [FakeCudaTensor(sizes[q], dt) for q in range(n)]
        be.allgather([outs], [inp], c10d.AllgatherOptions()).wait()
        for q in range(n):
            same(download(ops, outs[q]), val(q, sizes[q], dt, 2), f"allgather {dt} {sizes} from {q}")
    ins = [dev(ops, val(r, 3 + j, d, j)) for j, d in enumerate((torch.float16, torch.int8))]
    outs = [[FakeCudaTensor(3 + j, d) for j, d in enumerate((torch.float16, torch.int8))] for _ in range(n)]
    be.allgather_coalesced(outs, ins, c10d.AllgatherOptions()).wait()
    for q in range(n):
        for j, d in enumerate((torch.float16, torch.int8)):
            same(download(ops, outs[q][j]), val(q, 3 + j, d, j), f"allgather_coalesced {d} from {q}")

    # all_gather_into_tensor, coalesced (stream-ordered, bytes).
    ins = [dev(ops, val(r, 5, torch.float32, 3)), dev(ops, val(r, (2, 3), torch.int8, 4))]
    outs = [FakeCudaTensor(5 * n, torch.float32), FakeCudaTensor((2 * n, 3), torch.int8)]
    be.allgather_into_tensor_coalesced(outs, ins, c10d.AllgatherOptions()).wait()
    same(download(ops, outs[0]), torch.cat([val(q, 5, torch.float32, 3) for q in range(n)]), "allgather_into_tensor_coalesced 0")
    same(download(ops, outs[1]), torch.cat([val(q, (2, 3), torch.int8, 4) for q in range(n)]), "allgather_into_tensor_coalesced 1")

    # reduce_scatter (list), reduce_scatter_tensor, coalesced; PREMUL_SUM.
    for dt, op, factor in [(torch.float32, RO.SUM, None), (torch.int64, RO.MIN, None), (torch.bool, RO.MAX, None),
                           (torch.bfloat16, dist._make_nccl_premul_sum(2.0), 2.0), (torch.complex64, RO.AVG, None)]:
        ins = [dev(ops, val(r, cnt, dt, 10 + q)) for q in range(n)]
        out = FakeCudaTensor(cnt, dt)
        be.reduce_scatter([out], [ins], red_opts(dist.ReduceScatterOptions, op)).wait()
        want = reduced([val(q, cnt, dt, 10 + r) for q in range(n)], op if factor is None else RO.SUM, factor)
        same(download(ops, out), want, f"reduce_scatter {dt} {op}")
    for dt, op, factor in [(torch.int32, RO.MAX, None), (torch.bfloat16, RO.AVG, None), (torch.int16, RO.SUM, None),
                           (torch.float32, dist._make_nccl_premul_sum(2.0), 2.0)]:
        inp = dev(ops, val(r, n * cnt, dt, 5))
        out = FakeCudaTensor(cnt, dt)
        be._reduce_scatter_base(out, inp, red_opts(dist.ReduceScatterOptions, op)).wait()
        want = reduced([val(q, n * cnt, dt, 5)[r * cnt:(r + 1) * cnt] for q in range(n)], op if factor is None else RO.SUM,
                       factor)
        same(download(ops, out), want, f"reduce_scatter_tensor {dt} {op}")
    for op, factor in [(RO.SUM, None), (dist._make_nccl_premul_sum(2.0), 2.0)]:
        dts = (torch.float32, torch.float64)
        ins = [dev(ops, val(r, n * (cnt + j), d, 6 + j)) for j, d in enumerate(dts)]
        outs = [FakeCudaTensor(cnt + j, d) for j, d in enumerate(dts)]
        be.reduce_scatter_tensor_coalesced(outs, ins, red_opts(dist.ReduceScatterOptions, op)).wait()
        for j, d in enumerate(dts):
            c = cnt + j
            want = reduced([val(q, n * c, d, 6 + j)[r * c:(r + 1) * c] for q in range(n)],
                           op if factor is None else RO.SUM, factor)
            same(download(ops, outs[j]), want, f"reduce_scatter_tensor_coalesced {op} #{j}")

    # all_to_all_single: equal splits and uneven ones (rows of 2, some empty);
    # all_to_all (list).
    for dt in (torch.float32, torch.int64, torch.bfloat16):
        inp = dev(ops, val(r, (2 * n, 2), dt, 7))
        out = FakeCudaTensor((2 * n, 2), dt)
        be.alltoall_base(out, inp, [], [], c10d.AllToAllOptions()).wait()
        want = torch.cat([val(q, (2 * n, 2), dt, 7)[2 * r:2 * r + 2] for q in range(n)])
        same(download(ops, out), want, f"all_to_all_single {dt}")

    def rows(src, dst):
        return (src + 2 * dst) % 3  # 0, 1 or 2 rows from src to dst
    for dt in (torch.float16, torch.int32, torch.uint8):
        isz = [rows(r, q) for q in range(n)]
        osz = [rows(q, r) for q in range(n)]
        inp = dev(ops, val(r, (sum(isz), 2), dt, 8))
        out = FakeCudaTensor((sum(osz), 2), dt)
        be.alltoall_base(out, inp, osz, isz, c10d.AllToAllOptions()).wait()
        parts = []
        for q in range(n):
            qs = [rows(q, x) for x in range(n)]
            off = sum(qs[:r])
            parts.append(val(q, (sum(qs), 2), dt, 8)[off:off + qs[r]])
        same(download(ops, out), torch.cat(parts), f"all_to_all_single uneven {dt} {isz}->{osz}")
    ins = [dev(ops, val(r, 1 + rows(r, q), torch.int64, 9 + q)) for q in range(n)]
    outs = [FakeCudaTensor(1 + rows(q, r), torch.int64) for q in range(n)]
    be.alltoall(outs, ins, c10d.AllToAllOptions()).wait()
    for q in range(n):
        same(download(ops, outs[q]), val(q, 1 + rows(q, r), torch.int64, 9 + r), f"all_to_all from {q}")

    # gather to the last rank, scatter from rank 0.
    root = n - 1
    for dt in (torch.float64, torch.int8):
        inp = dev(ops, val(r, cnt, dt, 11))
        outs = [[FakeCudaTensor(cnt, dt) for _ in range(n)]] if r == root else []
        go = dist.GatherOptions()
        go.rootRank = root
        be.gather(outs, [inp], go).wait()
        if r == root:
            for q in range(n):
                same(download(ops, outs[0][q]), val(q, cnt, dt, 11), f"gather {dt} from {q}")
        so = dist.ScatterOptions()
        so.rootRank = 0
        out = FakeCudaTensor(cnt, dt)
        ins = [[dev(ops, val(q, cnt, dt, 12)) for q in range(n)]] if r == 0 else []
        be.scatter([out], ins, so).wait()
        same(download(ops, out), val(r, cnt, dt, 12), f"scatter {dt}")


KERNEL_US = 120000  # a layer's compute: long against a staged copy (NEXAR_FAKE_CUDA_DELAY_US, 2 ms)


def overlap(a, b) -> int:
    return max(0, min(a["end"], b["end"]) - max(a["start"], b["start"]))


def overlap_failures(what, tl, ops, t0, prefix, staged):
    """For each (name, device tensor) of staged, the library's copy of it
    to the host (a D2H copy off the current stream, reading the tensor)
    must run, at least in part, while a compute kernel (label prefix*)
    runs: it did not wait for the compute queued after its collective (a
    synchronous collective's copy runs between kernels: the next kernel is
    queued once the host part is over). The failures, each naming when the
    copy and the kernels ran (ms from t0), and the kernels."""
    kernels = [e for e in tl if e["kind"] == "kernel" and e["label"].startswith(prefix) and e["enq"] >= t0]
    ms = lambda x: f"{(x - t0) / 1e6:.1f}"  # noqa: E731
    ks = ", ".join(f"{k['label']} {ms(k['start'])}-{ms(k['end'])}" for k in kernels)
    out = []
    cs = []
    for name, t in staged:
        copies = [e for e in tl if e["kind"] == "copy_d2h" and e["src"] == t.ptr and e["stream"] != ops.cur
                  and e["enq"] >= t0]
        if not copies:
            out.append(f"{what}: {name}: no staging copy of it on the timeline")
            continue
        c = copies[0]
        cs.append(f"{name} {ms(c['start'])}-{ms(c['end'])}")
        if not any(overlap(c, k) for k in kernels):
            out.append(f"{what}: {name}'s staging copy ran at {ms(c['start'])}-{ms(c['end'])} ms, within no "
                       f"compute kernel (kernels ran at {ks} ms)")
    return out, f"kernels {ks} ms; staging copies {', '.join(cs)} ms"


def ddp_overlap(be, ops, r, n):
    """DDP's backward as its reducer drives it, on the stand-ins: per layer,
    from the last, the gradient kernel, then that bucket's all_reduce,
    async; at the end, wait() on each (DDP's finalize). The bucket
    all_reduces must run during the remaining backward compute, the host
    must have queued the whole backward while the first kernel ran, and
    the waits must not block it."""
    layers, cnt = 4, 1000
    buckets = [FakeCudaTensor(cnt) for _ in range(layers)]
    opts = dist.AllreduceOptions()
    opts.asyncOp = True
    download(ops, buckets[0])  # the stream idle before
    dist.barrier()
    t0 = time.monotonic_ns()
    # The stream is held while the host queues the backward and waits: an
    # all_reduce or a wait() that held the host for its stream work would
    # hold it until the gate gives up (10 s).
    g = gate(ops, 10)
    works = []
    for j in reversed(range(layers)):
        kernel(ops, KERNEL_US, f"bwd{j}")
        upload(ops, buckets[j], val(r, cnt, torch.float32, j))  # the kernel's gradients, in stream order
        works.append((j, be.allreduce([buckets[j]], opts)))
    issued = g.passed
    for _, w in works:
        w.wait()
    waited = g.passed
    g.set()
    for j in range(layers):
        same(download(ops, buckets[j]), reduced([val(q, cnt, torch.float32, j) for q in range(n)], RO.SUM),
             f"ddp bucket {j}")
    tl = timeline()
    fails, ks = overlap_failures("ddp", tl, ops, t0, "bwd", [(f"bucket {j}", buckets[j]) for j, _ in works[:-1]])
    if issued:
        fails.append("ddp: the all_reduces held the host until its stream went on")
    elif waited:
        fails.append("ddp: wait() held the host until its stream went on")
    if r == 0:
        print(f"ddp timeline: {ks}")
    assert not fails, "\n".join(fails)


def fsdp2_overlap(be, ops, r, n):
    """FSDP2's forward with prefetch (unshard(async_op=True): copy-in and
    all_gather_into_tensor on the current stream), on the stand-ins: for
    each layer, wait for its all_gather, issue the next layer's, then the
    layer's compute. Each prefetched all_gather must run during the
    compute of the layer before it."""
    layers, cnt = 4, 1000
    shards = [FakeCudaTensor(cnt) for _ in range(layers)]
    full = [FakeCudaTensor(cnt * n) for _ in range(layers)]
    opts = c10d.AllgatherOptions()
    opts.asyncOp = True
    download(ops, shards[0])
    dist.barrier()
    t0 = time.monotonic_ns()

    def unshard(i):
        upload(ops, shards[i], val(r, cnt, torch.float32, 20 + i))  # FSDP2's copy-in
        return be._allgather_base(full[i], shards[i], opts)
    works = {0: unshard(0)}
    for i in range(layers):
        works[i].wait()
        if i + 1 < layers:
            works[i + 1] = unshard(i + 1)
        kernel(ops, KERNEL_US, f"fwd{i}")
    for i in range(layers):
        same(download(ops, full[i]), torch.cat([val(q, cnt, torch.float32, 20 + i) for q in range(n)]),
             f"fsdp2 layer {i}")
    fails, ks = overlap_failures("fsdp2", timeline(), ops, t0, "fwd",
                                 [(f"layer {i}'s all_gather", shards[i]) for i in range(1, layers)])
    if r == 0:
        print(f"fsdp2 timeline: {ks}")
    assert not fails, "\n".join(fails)


def main():
    # A hang shows where each thread was, before the test's deadline kills it.
    faulthandler.dump_traceback_later(float(os.environ.get("CUDA_FAKE_DUMP_AFTER", "240")), exit=True)
    # With NEXAR_NCCL (the fake NCCL), two hosts are simulated: HIER_HOSTS
    # names each rank's host, which libnexar reads from NEXAR_HIER_HOST_ID.
    hosts = os.environ.get("HIER_HOSTS")
    if hosts:
        os.environ["NEXAR_HIER_HOST_ID"] = hosts.split(",")[int(os.environ["RANK"])]
    dist.init_process_group("nexar")
    r, n = dist.get_rank(), dist.get_world_size()
    be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    ops = FakeOps()
    be._cuda = ops
    count = 1000
    if os.environ.get("CUDA_FAKE_PART") == "overlap":
        # Only the overlap checks: what they report against another
        # version of the backend.
        for check in (ddp_overlap, fsdp2_overlap):
            try:
                check(be, ops, r, n)
            except AssertionError as e:
                print(f"rank {r}: {check.__name__} failed:\n{e}")
        dist.destroy_process_group()
        print(f"rank {r}: cuda fake overlap run")
        return

    # all_reduce, asynchronous: a CudaWork; wait() makes the current stream
    # wait; the result read back on the stream.
    t = FakeCudaTensor(count)
    upload(ops, t, torch.arange(count, dtype=torch.float32) + r)
    opts = dist.AllreduceOptions()
    opts.asyncOp = True
    w = be.allreduce([t], opts)
    assert isinstance(w, CudaWork), type(w)
    w.wait()
    want = n * torch.arange(count, dtype=torch.float32) + n * (n - 1) / 2
    got = download(ops, t)
    assert torch.equal(got, want), (got[:4], want[:4])
    deadline = time.monotonic() + 30
    while not w.is_completed():
        assert time.monotonic() < deadline, "the Work's event never completed"
        time.sleep(0.001)
    assert w.get_future().wait() == [t]

    # An async collective returns at once, and waits on the device for the
    # work already on the caller's stream: the input's copy is held behind
    # a gate (reading early would see the fake's 0xDE garbage); wait()
    # does not block the host either.
    t2 = FakeCudaTensor(count)
    g = gate(ops)
    upload(ops, t2, torch.full((count,), float(r + 1)))
    w2 = be.allreduce([t2], opts)
    w2.wait()
    assert not g.passed, "all_reduce and wait() held the caller until the stream went on"
    time.sleep(0.2)
    assert not w2.is_completed(), "all_reduce completed before the work queued ahead of it on the stream"
    g.set()
    got = download(ops, t2)
    assert torch.equal(got, torch.full((count,), float(n * (n + 1) / 2))), got[:4]
    assert w2.is_completed()

    # broadcast from rank 1 (int64), all_gather_into_tensor, reduce_scatter_tensor.
    b = FakeCudaTensor(count, torch.int64)
    if r == 1:
        upload(ops, b, torch.arange(count, dtype=torch.int64) * 3)
    bo = dist.BroadcastOptions()
    bo.rootRank = 1
    be.broadcast([b], bo).wait()
    assert torch.equal(download(ops, b), torch.arange(count, dtype=torch.int64) * 3)

    gi = FakeCudaTensor(count)
    upload(ops, gi, torch.full((count,), float(r)))
    go = FakeCudaTensor(count * n)
    be._allgather_base(go, gi).wait()
    assert torch.equal(download(ops, go), torch.arange(n, dtype=torch.float32).repeat_interleave(count))

    rs_in = FakeCudaTensor(count * n)
    upload(ops, rs_in, torch.arange(count * n, dtype=torch.float32))
    rs_out = FakeCudaTensor(count)
    be._reduce_scatter_base(rs_out, rs_in, dist.ReduceScatterOptions()).wait()
    assert torch.equal(download(ops, rs_out), n * torch.arange(r * count, (r + 1) * count, dtype=torch.float32))

    # send / recv around a ring; the receive is posted first (it must not
    # block the caller, who sends next).
    src = FakeCudaTensor(count)
    upload(ops, src, torch.full((count,), float(100 + r)))
    dst = FakeCudaTensor(count)
    rw = be.recv([dst], (r - 1) % n, 9)
    sw = be.send([src], (r + 1) % n, 9)
    sw.wait()
    rw.wait()
    assert torch.equal(download(ops, dst), torch.full((count,), float(100 + (r - 1) % n)))
    # A receive's wait() does not block the host either: every rank waits
    # on its receive before any rank sends (a host block would hang here).
    # The sends go on another stream, as pipeline stages do: on the same
    # one they would be ordered after the receives (a cycle, as on NCCL).
    dst2 = FakeCudaTensor(count)
    rw = be.recv([dst2], (r - 1) % n, 10)
    rw.wait()
    dist.barrier()
    compute = ops.cur
    ops.cur = ops.new_stream(None)
    be.send([src], (r + 1) % n, 10).wait()
    ops.cur = compute
    assert torch.equal(download(ops, dst2), torch.full((count,), float(100 + (r - 1) % n)))

    check_every_collective(be, ops, r, n)

    # Errors name the call and what is wrong, at issue; CPU tensors still work.
    for dt, op, what in [(torch.complex64, RO.MAX, "complex"), (torch.int32, RO.AVG, "floating-point"),
                         (torch.float32, RO.BAND, "integer")]:
        try:
            be.allreduce([FakeCudaTensor(4, dt)], red_opts(dist.AllreduceOptions, op))
        except ValueError as e:
            assert "allreduce" in str(e) and what in str(e), e
        else:
            raise AssertionError(f"allreduce accepted {dt} with {op}")
    try:
        be.alltoall_base(FakeCudaTensor(6), FakeCudaTensor(6), [1] * n, [2] * n, c10d.AllToAllOptions())
    except ValueError as e:
        assert "all_to_all_single" in str(e) and "split" in str(e), e
    else:
        raise AssertionError("all_to_all_single accepted splits that do not match the tensor")
    try:
        be.allreduce([FakeCudaTensor(4), torch.ones(4)], opts)
    except ValueError as e:
        assert "one CUDA device" in str(e), e
    else:
        raise AssertionError("allreduce accepted CPU and CUDA tensors together")
    c = torch.ones(8)
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((8,), float(n))), c
    assert ops.recorded >= 7, ops.recorded

    if not os.environ.get("NEXAR_NCCL"):
        ddp_overlap(be, ops, r, n)
        fsdp2_overlap(be, ops, r, n)

    if os.environ.get("NEXAR_NCCL"):
        # The collectives of CUDA tensors went through the (fake) NCCL.
        launched = ctypes.CDLL(os.environ["NEXAR_NCCL"]).nexarFakeNcclLaunched
        launched.restype = ctypes.c_long
        assert launched() > 0, "no collective went through NCCL"
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: cuda fake ok")


if __name__ == "__main__":
    main()
