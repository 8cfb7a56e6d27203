"""CUDA tensors in the "nexar" backend (docs/device-memory.md, "torch").

Every collective takes CUDA tensors, asynchronously, the way
ProcessGroupNCCL orders its work:

- at issue, in the caller's thread: an event recorded on torch's current
  stream, which the group's side stream for the device waits for (the
  operation is ordered after the work queued so far, not after what the
  caller queues next); the Work is returned at once;
- on the group's worker thread, in issue order with its other
  collectives: the operation on the side stream, through libnexar's
  stream-ordered entry point where there is one (allreduce, broadcast,
  allgather, reduce-scatter; libnexar stages or uses NCCL), else staged
  here: copies to pinned host tensors on the side stream, the CPU
  implementation on them, copies back. The worker then waits for the side
  stream and writes the operation's number into a pinned word;
- Work.wait() makes the current stream wait for an event recorded at issue
  on the group's completion stream behind a stream memory wait on that word
  (cuStreamWaitValue32): no host block, as NCCL's. Where the driver has no
  stream memory operations, wait() waits on the host for the worker, then
  makes the stream wait.

Send and receive run on a helper thread each (a posted receive must not
hold back the worker), on a side stream of their own, with a word of their
own and a completion stream shared by the group's sends and receives
(ordered among themselves in issue order, as NCCL's are, but not with the
collectives).

What of CUDA the backend uses is a CudaOps, one per group
(ProcessGroupNexar._cuda): tests on machines without a GPU replace it with
a stand-in over the fake CUDA runtime (tests/fakes/cudart), and drive the
backend's CUDA code path with objects standing in for CUDA tensors. That
proves the backend's calls, ordering and Work semantics against the fake;
it does not prove torch's own CUDA objects behave as the stand-in does.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

import torch

from ._work import NexarWork

__all__ = ["CudaOps", "CudaWork", "CudaBatchWork", "Side", "is_cuda", "stream_dtype"]


class CudaOps:
    """The CUDA operations the backend needs, through torch.cuda (and, for
    the stream memory wait, the driver's cuStreamWaitValue32). Streams are
    cudaStream_t as int; events are opaque.

    stream(device): the current stream. new_stream(device): a stream of
    the group's own (kept alive here). record(stream, device) -> event.
    wait(event, device): the current stream waits. stream_wait(stream,
    event, device). query(event) -> bool. synchronize(event): the host
    waits (GIL released). host_like(t): a pinned CPU tensor of t's shape
    and dtype. d2h(host, t, stream), h2d(t, host, stream): asynchronous
    copies. word(device) -> address of a pinned, zeroed 32-bit word;
    wait_word(stream, addr, value) -> bool: stream waits until the word
    reaches value (cyclic), False where the driver cannot;
    set_word(addr, value). future(result, device, stream): a Future
    completed now whose CUDA events are on stream, or None (the Work's
    host-completion future).
    """

    def __init__(self):
        self._keep = []  # streams and words made for the group: live as long as it
        self._mu = threading.Lock()
        self._cu = None  # the driver's cuStreamWaitValue32, once looked up; False: none

    def stream(self, device) -> int:
        return int(torch.cuda.current_stream(device).cuda_stream)

    def new_stream(self, device) -> int:
        s = torch.cuda.Stream(device=device)
        with self._mu:
            self._keep.append(s)
        return int(s.cuda_stream)

    def _ext(self, stream, device):
        return torch.cuda.ExternalStream(stream, device=device)

    def record(self, stream: int, device):
        ev = torch.cuda.Event()
        ev.record(self._ext(stream, device))
        return ev

    def wait(self, event, device) -> None:
        torch.cuda.current_stream(device).wait_event(event)

    def stream_wait(self, stream: int, event, device) -> None:
        self._ext(stream, device).wait_event(event)

    def query(self, event) -> bool:
        return bool(event.query())

    def synchronize(self, event) -> None:
        event.synchronize()

    def host_like(self, t):
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)

    def d2h(self, host, t, stream: int) -> None:
        with torch.cuda.stream(self._ext(stream, t.device)):
            host.copy_(t, non_blocking=True)

    def h2d(self, t, host, stream: int) -> None:
        with torch.cuda.stream(self._ext(stream, t.device)):
            t.copy_(host, non_blocking=True)

    def word(self, device) -> int:
        # Pinned memory is mapped at the same address for the device under
        # unified addressing, which cuStreamWaitValue32 reads.
        w = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        with self._mu:
            self._keep.append(w)
        return w.data_ptr()

    def _wait_value(self):
        if self._cu is None:
            fn = False
            try:
                cu = ctypes.CDLL("libcuda.so.1")
                fn = getattr(cu, "cuStreamWaitValue32_v2", None) or cu.cuStreamWaitValue32
                fn.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint32, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = False
            self._cu = fn
        return self._cu

    def wait_word(self, stream: int, addr: int, value: int) -> bool:
        fn = self._wait_value()
        return bool(fn) and fn(stream, addr, value & 0xFFFFFFFF, 0) == 0  # CU_STREAM_WAIT_VALUE_GEQ

    def set_word(self, addr: int, value: int) -> None:
        ctypes.c_uint32.from_address(addr).value = value & 0xFFFFFFFF

    def future(self, result, device, stream: int):
        fut = torch.futures.Future(devices=[device])
        with torch.cuda.stream(self._ext(stream, device)):
            fut.set_result(result)
        return fut


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


def stream_dtype(t, fast_dt) -> Optional[int]:
    """The nexar dtype with which libnexar's stream-ordered calls take the
    CUDA tensor t as it is, or None (staged here instead)."""
    dt = fast_dt.get(t.dtype)
    if dt is None or not t.is_contiguous():
        return None
    return dt


class Side:
    """A group's streams for one CUDA device: stream, where its collectives
    run; done, where each one's completion event is recorded behind a wait
    on word reaching its number; seq, the last number given (under lock,
    with the submission, so numbers follow issue order); gated: False once
    the driver refused a stream memory wait. Sends and receives: p2p_done,
    their completion stream, and pools of idle side streams (p2p) and of
    words with the last value each was given (words)."""

    __slots__ = ("stream", "done", "word", "seq", "gated", "lock", "p2p", "p2p_done", "words")

    def __init__(self, ops, device):
        self.stream = ops.new_stream(device)
        self.done = ops.new_stream(device)
        self.word = ops.word(device)
        self.seq = 0
        self.gated = True
        self.lock = threading.Lock()
        self.p2p = []
        self.p2p_done = ops.new_stream(device)
        self.words = []


class CudaWork(NexarWork):
    """An operation on CUDA tensors. The host part completes the NexarWork
    (on the group's worker); done, when not None, is an event recorded at
    issue that completes once the results are on the device. wait() makes
    the current stream wait for it (no host block), raising the host part's
    error if it is known by then; without done, wait() waits for the host
    part first, then makes the stream wait for after (recorded by the
    worker). Safe from any thread."""

    def __init__(self, result, op_name, ops, device, done, done_stream):
        # Made right after done is recorded (under the side's lock), so
        # that the CUDA future's events follow the same gate.
        super().__init__(result, op_name)
        self._ops = ops
        self._device = device
        self._done = done
        self._after = None  # event recorded on the side stream after the operation
        self._cuda_fut = ops.future(result, device, done_stream) if done is not None else None

    def wait(self, timeout=None):
        if self._done is None:
            super().wait(timeout)
            self._ops.wait(self._after, self._device)
            return True
        if self._exc is not None:
            raise self._exc
        self._ops.wait(self._done, self._device)
        return True

    def is_completed(self):
        if self._done is None:
            return self._event.is_set() and (self._exc is not None or self._ops.query(self._after))
        return self._exc is not None or self._ops.query(self._done)

    def is_success(self):
        return self.is_completed() and self._exc is None

    def get_future(self):
        # A CUDA future completed at issue, whose wait() makes the current
        # stream wait (as NCCL's); the host-completion future without one.
        return self._cuda_fut if self._cuda_fut is not None else super().get_future()


class CudaBatchWork(NexarWork):
    """The Work of a coalesced batch (_end_coalescing) that holds CUDA
    operations: wait() calls each one's wait() in the waiting thread, so
    that its current stream is the one made to wait. The host-completion
    future completes once every host part has, with the first error."""

    def __init__(self, works):
        super().__init__([], "coalesced")
        self._works = works

        def host_parts():
            err = None
            for w in works:
                w._event.wait()
                err = err or w._exc
            self._complete(err)
        threading.Thread(target=host_parts, name="nexar-coalesced-cuda", daemon=True).start()

    def wait(self, timeout=None):
        for w in self._works:
            w.wait(timeout)
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def is_success(self):
        return all(w.is_success() for w in self._works)
