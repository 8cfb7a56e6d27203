"""Work objects of the "nexar" backend and the threads that complete them.

NexarWork is what every ProcessGroupNexar method returns. WorkQueue runs a
group's collectives in issue order on one thread; complete_in_thread
completes a Work from a helper thread of its own (point-to-point, coalesced
batches).
"""

from __future__ import annotations

import queue
import threading
import warnings
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist

__all__ = ["NexarWork", "WorkQueue", "complete_in_thread"]


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


def _run(fn: Callable[[], None], work: NexarWork):
    """fn(), then work completed with its error, if any."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
        work._complete(e)
    else:
        work._complete()


class WorkQueue:
    """One thread running submitted (fn, work) pairs in submission order;
    each work is completed with fn's outcome. submit() and close() are safe
    from any thread."""

    def __init__(self, name: str):
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None], work: NexarWork):
        self._q.put((fn, work))

    def stop(self):
        """Let the thread end after what was submitted; do not wait for it."""
        self._q.put(None)

    def close(self, timeout: float = 60):
        """stop(), then wait up to timeout seconds for the thread to end."""
        self.stop()
        self._thread.join(timeout=timeout)

    def _loop(self):
        q = self._q
        while True:
            item = q.get()
            if item is None:
                return
            _run(*item)


def complete_in_thread(name: str, fn: Callable[[], None], work: NexarWork):
    """Run fn on a new daemon thread and complete work with its outcome."""
    threading.Thread(target=_run, args=(fn, work), name=name, daemon=True).start()
