"""The torch backend's CUDA code path against the fake CUDA runtime
(tests/fakes/cudart, named by NEXAR_CUDART): objects standing in for CUDA
tensors (a torch.device("cuda", 0), a data_ptr() into fake device memory
that the host cannot read) and a CudaOps stand-in whose streams and events
are the fake's. Checks results read back in stream order, that a
collective waits for the work already on the caller's stream, the Work's
CUDA semantics, and the errors. What this does not prove: that torch's own
CUDA tensors, streams and events behave as these stand-ins (that needs a
GPU: scripts/gpu_check.sh). Run as 2+ ranks with torchrun's variables; with
NEXAR_NCCL naming the fake NCCL and HIER_HOSTS the ranks' hosts, the same
checks run through NCCL within a host and nexar between hosts."""

import ctypes
import os
import threading
import time

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401
from nexar.torch._cuda import CudaWork

lib = ctypes.CDLL(os.environ["NEXAR_CUDART"])
vp = ctypes.c_void_p
H2D, D2H = 1, 2


def ck(rc, what):
    assert rc == 0, f"{what}: cudaError {rc}"


class FakeOps:
    """CudaOps over the fake runtime; cur is the "current stream"."""

    def __init__(self):
        s = vp()
        ck(lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "cudaStreamCreateWithFlags")
        self.cur = s.value
        self.recorded = 0

    def stream(self, device):
        return self.cur

    def record(self, stream, device):
        ev = vp()
        ck(lib.cudaEventCreateWithFlags(ctypes.byref(ev), 2), "cudaEventCreateWithFlags")
        ck(lib.cudaEventRecord(ev, vp(stream)), "cudaEventRecord")
        self.recorded += 1
        return ev

    def wait(self, event, device):
        ck(lib.cudaStreamWaitEvent(vp(self.cur), event, 0), "cudaStreamWaitEvent")

    def query(self, event):
        return lib.cudaEventQuery(event) == 0


class FakeCudaTensor:
    """What the backend reads of a CUDA tensor, over fake device memory."""

    is_cuda = True

    def __init__(self, n, dtype=torch.float32, contiguous=True):
        self.device = torch.device("cuda", 0)
        self.dtype = dtype
        self._n = n
        self._es = torch.empty(0, dtype=dtype).element_size()
        self._contig = contiguous
        p = vp()
        ck(lib.cudaMalloc(ctypes.byref(p), n * self._es), "cudaMalloc")
        self.ptr = p.value

    def numel(self):
        return self._n

    def element_size(self):
        return self._es

    def data_ptr(self):
        return self.ptr

    def is_contiguous(self):
        return self._contig


def upload(ops, t, values: torch.Tensor):
    """Write values into t by a delayed copy on the current stream (from
    pinned memory, kept alive on the tensor)."""
    nb = values.numel() * values.element_size()
    h = vp()
    ck(lib.cudaMallocHost(ctypes.byref(h), nb), "cudaMallocHost")
    ctypes.memmove(h.value, values.data_ptr(), nb)
    ck(lib.cudaMemcpyAsync(vp(t.ptr), h, nb, H2D, vp(ops.cur)), "cudaMemcpyAsync H2D")
    t._keep = h


def download(ops, t) -> torch.Tensor:
    """t's contents after the work on the current stream (then a sync)."""
    out = torch.empty(t.numel(), dtype=t.dtype)
    nb = t.numel() * t.element_size()
    h = vp()
    ck(lib.cudaMallocHost(ctypes.byref(h), nb), "cudaMallocHost")
    ck(lib.cudaMemcpyAsync(h, vp(t.ptr), nb, D2H, vp(ops.cur)), "cudaMemcpyAsync D2H")
    ck(lib.cudaStreamSynchronize(vp(ops.cur)), "cudaStreamSynchronize")
    ctypes.memmove(out.data_ptr(), h.value, nb)
    lib.cudaFreeHost(h)
    return out


HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def gate(ops):
    """Hold the current stream until the returned Event is set."""
    opened = threading.Event()
    fn = HOSTFN(lambda _: opened.wait(60))
    ck(lib.cudaLaunchHostFunc(vp(ops.cur), fn, None), "cudaLaunchHostFunc")
    opened._fn = fn  # keep the callback alive
    return opened


def main():
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

    # The collective waits for the work already on the caller's stream:
    # the input's copy is held behind a gate; reading early would see the
    # fake's 0xDE garbage.
    t2 = FakeCudaTensor(count)
    g = gate(ops)
    upload(ops, t2, torch.full((count,), float(r + 1)))
    res = {}
    th = threading.Thread(target=lambda: res.setdefault("w", be.allreduce([t2], opts)))
    th.start()
    th.join(0.2)
    assert th.is_alive(), "all_reduce ran before the work queued ahead of it on the stream"
    g.set()
    th.join(60)
    res["w"].wait()
    got = download(ops, t2)
    assert torch.equal(got, torch.full((count,), float(n * (n + 1) / 2))), got[:4]

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

    # Errors name the call and what is wrong; CPU tensors still work.
    for bad, what in [(FakeCudaTensor(4, contiguous=False), "contiguous"),
                      (FakeCudaTensor(4, torch.complex64), "dtype")]:
        try:
            be.allreduce([bad], opts)
        except ValueError as e:
            assert "allreduce" in str(e) and what in str(e), e
        else:
            raise AssertionError(f"allreduce accepted a CUDA tensor with a bad {what}")
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
