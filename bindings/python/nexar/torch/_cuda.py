"""CUDA tensors in the "nexar" backend.

A CUDA tensor's memory goes through libnexar's stream-ordered entry points
(nexar_allreduce_stream and the like, docs/device-memory.md): the call is
ordered after the work on torch's current stream, libnexar stages the
device memory through pinned host buffers, runs the operation on the host
and queues the copies back on its own stream, which the current stream is
made to wait for. The calling thread is busy for the host part of the
operation; the copies back complete in stream order. A Work then holds an
event recorded on that stream: wait() makes the waiting thread's current
stream wait for it (no host block), is_completed() queries it.

What of CUDA the backend uses is this module's CudaOps, one per group
(ProcessGroupNexar._cuda): tests on machines without a GPU replace it with
a stand-in over the fake CUDA runtime (tests/fakes/cudart), and drive the
backend's CUDA code path with objects standing in for CUDA tensors. That
proves the backend's calls, ordering and Work semantics against the fake;
it does not prove torch's own CUDA objects behave as the stand-in does
(docs/device-memory.md says what ran where).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._work import NexarWork

__all__ = ["CudaOps", "CudaWork", "CudaP2PWork", "is_cuda", "check_cuda"]


class CudaOps:
    """The CUDA operations the backend needs, through torch.cuda.

    stream(device) -> int: the current stream's cudaStream_t.
    record(stream, device) -> event: an event recorded on that stream.
    wait(event, device): the calling thread's current stream waits for it.
    query(event) -> bool: whether the event has completed.
    """

    def stream(self, device) -> int:
        return int(torch.cuda.current_stream(device).cuda_stream)

    def record(self, stream: int, device):
        ev = torch.cuda.Event()
        ev.record(torch.cuda.ExternalStream(stream, device=device))
        return ev

    def wait(self, event, device) -> None:
        torch.cuda.current_stream(device).wait_event(event)

    def query(self, event) -> bool:
        return bool(event.query())


def is_cuda(tensors) -> bool:
    """Whether the call's tensors are CUDA tensors (all of them must be).
    One attribute read for the common single CPU tensor: this is on the
    8-byte all_reduce fast path."""
    if len(tensors) == 1:
        if not tensors[0].is_cuda:
            return False
    elif not any(t.is_cuda for t in tensors):
        return False
    kinds = {t.device.type for t in tensors}
    if kinds != {"cuda"} or len({t.device for t in tensors}) != 1:
        raise ValueError(f"nexar: a call's tensors must all be on one CUDA device, got {sorted(str(t.device) for t in tensors)}")
    return True


def check_cuda(name: str, t, fast_dt) -> int:
    """The nexar dtype of a CUDA tensor the staged path takes as it is, or a
    ValueError naming the call and what is wrong (no staging of CUDA tensors
    through host copies in Python: that would read device memory)."""
    dt = fast_dt.get(t.dtype)
    if dt is None:
        raise ValueError(f"nexar: {name}: CUDA tensors of dtype {t.dtype} are not supported "
                         f"(supported: {', '.join(str(d) for d in fast_dt)})")
    if not t.is_contiguous():
        raise ValueError(f"nexar: {name}: CUDA tensors must be contiguous")
    return dt


class CudaWork(dist.Work):
    """Completion of a CUDA operation: the event recorded after it on the
    caller's stream. wait() makes the current stream wait (no host block;
    with a timeout... as NCCL's, the timeout is not applied to the stream);
    is_completed() queries the event. An operation that failed raises its
    error from wait(). Safe from any thread."""

    def __init__(self, result, op_name, ops: CudaOps, event, device, exc=None):
        super().__init__()
        self._result = result
        self._op_name = op_name
        self._ops = ops
        self._ev = event
        self._device = device
        self._exc = exc
        self._fut = torch.futures.Future()
        if exc is None:
            self._fut.set_result(result)
        else:
            self._fut.set_exception(exc)

    def wait(self, timeout=None):
        if self._exc is not None:
            raise self._exc
        self._ops.wait(self._ev, self._device)
        return True

    def is_completed(self):
        return self._exc is not None or self._ops.query(self._ev)

    def is_success(self):
        return self._exc is None and self._ops.query(self._ev)

    def exception(self):
        return self._exc

    def get_future(self):
        return self._fut

    def synchronize(self):
        self.wait()


class CudaP2PWork(NexarWork):
    """A send or receive of a CUDA tensor, run on a helper thread: wait()
    waits for its host part (the message sent or received), then makes the
    current stream wait for the event recorded after the call."""

    def __init__(self, result, op_name, ops: CudaOps, device):
        super().__init__(result, op_name)
        self._ops = ops
        self._device = device
        self._ev = None

    def wait(self, timeout=None):
        super().wait(timeout)
        self._ops.wait(self._ev, self._device)
        return True

    def is_completed(self):
        return super().is_completed() and (self._exc is not None or self._ops.query(self._ev))
