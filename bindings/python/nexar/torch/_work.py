"""Work objects of the "nexar" backend and the threads that complete them.

NexarWork is what every ProcessGroupNexar method returns. DoneWork is a
synchronous collective already run in the caller's thread (torch waits on
it at once). StartedWork is an asynchronous one started in the library
from the caller's thread (no thread hop; wait() waits in C); a group's
Completer completes the futures of those whose get_future() was asked
for, one thread for all.
WorkQueue runs a group's other collectives in issue order on one thread;
complete_in_thread completes a Work from a helper thread of its own
(point-to-point, coalesced batches).
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .. import _errors

__all__ = ["NexarWork", "DoneWork", "StartedWork", "Completer", "WorkQueue", "complete_in_thread", "run_now"]


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
        secs = _seconds(timeout)
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


def _seconds(timeout) -> Optional[float]:
    """A Work.wait timeout (timedelta or seconds) in seconds; None for none
    (also c10d's kNoTimeout, which is zero)."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return secs if secs > 0 else None


def _outcome(src):
    """then() callback of NexarWork: the operation's result, or its error
    raised so that torch marks the Future failed (wait() and value() then
    raise a RuntimeError carrying the error's type and message)."""
    exc, result = src.value()
    if exc is not None:
        raise exc
    return result


def run_now(fn: Callable[[], None], work: NexarWork) -> NexarWork:
    """fn() in this thread, then work completed with its outcome; work."""
    _run(fn, work)
    return work


def _run(fn: Callable[[], None], work: NexarWork):
    """fn(), then work completed with its error, if any."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
        work._complete(e)
    else:
        work._complete()


class StartedWork(NexarWork):
    """A collective started in the library (a raw request handle) from the
    caller's thread. wait() waits in C with the GIL released (and, when
    nothing ran the operation yet, runs it there: libnexar defers a
    started collective to its first waiter for a short while); keep holds
    the memory the operation uses until it completes, also when the Work
    is dropped first (its __del__ hands both to the Completer); on success finish()
    runs (a write-back), then the Work completes. The torch Future is made
    only when get_future() asks for it, and completed by the group's
    Completer if the operation is still running. Safe from any thread.
    """

    # Defaults of what most works never change (fewer stores per call).
    _h = 0
    _keep = None
    _source = -1
    _exc: Optional[BaseException] = None
    _done = False  # settled: _exc is the outcome
    _src = None
    _fut = None
    _finish: Optional[Callable[[], None]] = None

    def __init__(self, result, op_name: str, raw, handle: int, keep, completer: "Completer",
                 finish: Optional[Callable[[], None]] = None):
        dist.Work.__init__(self)
        self._result = result
        self._op_name = op_name
        self._raw = raw
        if completer._thread is None:
            completer.start()  # here, not in __del__, which must not block
        self._completer = completer  # before _h: __del__ reads it once _h is set
        self._keep = keep
        if finish is not None:
            self._finish = finish
        self._h = handle
        # One thread in C (wait or test) on the request at a time; it
        # settles the work before it lets go, so whoever takes it next
        # finds the outcome.
        self._wlock = threading.Lock()
        self._lock = threading.Lock()  # _done and the future

    def __del__(self):
        # torch drops a Work nobody waits for at once (DDP's join hook
        # fires all_reduces and forgets them): an operation still running
        # then goes to the Completer, which keeps its memory until it ends
        # and frees its request. Without this, keep (the tensor) is freed
        # while libnexar still writes it (issue 32: heap corruption).
        if self._h and not self._done:
            try:
                self._completer.orphan(self._raw, self._h, self._keep, self._finish)
            except Exception:  # noqa: BLE001 - interpreter teardown: the communicator is closed by then
                return
            self._h = 0

    def _settle(self, exc: Optional[BaseException], freed: bool = False):
        # Once, with self._wlock held (the request is no one else's now):
        # free the request (unless the wait did), write back, then complete
        # under self._lock.
        h, self._h = self._h, 0
        if not freed:
            try:
                self._raw.free_raw(h)
            except Exception:  # noqa: BLE001 - a freed or forked handle: nothing to release
                pass
        if exc is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as e:  # noqa: BLE001 - reported as the outcome
                exc = e
        self._keep = self._finish = None
        with self._lock:
            self._exc = exc
            self._done = True
            src = self._src
        if src is not None:
            self._resolve(src)

    def _resolve(self, src):
        try:
            src.set_result((self._exc, self._result))
        except Exception as e:  # a raising then() callback must not kill the waiter
            warnings.warn(f"nexar: a callback of {self._op_name} raised: {e!r}", RuntimeWarning)

    def _wait_c(self):
        """Wait in C until the operation completes (the communicator's
        timeout bounds it), then settle; if another thread is waiting,
        wait for it to settle."""
        with self._wlock:
            if self._done:
                return
            try:
                self._raw.wait_free_raw(self._h)
            except _errors.Error as e:  # the request is freed
                self._settle(e, freed=True)
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
                self._settle(e)
            else:
                self._settle(None, freed=True)

    def _poll(self) -> bool:
        """Complete the work if the operation has; True once it has."""
        if self._done:
            return True
        if not self._wlock.acquire(blocking=False):
            return False  # another thread is waiting on it in C
        try:
            if self._done:
                return True
            try:
                done = self._raw.test_raw(self._h)
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
                self._settle(e)
                return True
            if done:
                self._settle(None)
            return done
        finally:
            self._wlock.release()

    def wait(self, timeout=None):
        if not self._done:
            secs = None if timeout is None else _seconds(timeout)
            if secs is None:
                self._wait_c()
            else:
                deadline = time.monotonic() + secs
                pause = 20e-6
                while not self._poll():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError(f"nexar: {self._op_name} did not complete within {timeout}")
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, 5e-3)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        return self._poll()

    def is_success(self):
        return self._poll() and self._exc is None

    def get_future(self):
        # Made under the lock that completion takes, so the outcome reaches
        # the future exactly once whichever comes first.
        with self._lock:
            if self._fut is None:
                self._src = torch.futures.Future()
                self._fut = self._src.then(_outcome)
                fresh = True
            else:
                fresh = False
            done, fut, src = self._done, self._fut, self._src
        if fresh and done:
            self._resolve(src)
        elif fresh:
            self._completer.add(self)
        return fut


class DoneWork(NexarWork):
    """A Work whose operation already ran, in the caller's thread (a
    synchronous call: torch waits on it at once): exc is its error, or
    None. The future is made only if asked for. Safe from any thread."""

    _source = -1
    _fut = None

    def __init__(self, result, op_name: str, exc: Optional[BaseException]):
        dist.Work.__init__(self)
        self._result = result
        self._op_name = op_name
        self._exc = exc

    def wait(self, timeout=None):
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return self._exc is None

    def get_future(self):
        if self._fut is None:
            src = torch.futures.Future()
            fut = src.then(_outcome)
            src.set_result((self._exc, self._result))
            self._fut = fut
        return self._fut


class _Orphan:
    """A started operation whose Work was dropped before it completed:
    what the library still uses (keep) and its request, until it ends."""

    __slots__ = ("raw", "h", "keep", "finish")

    def __init__(self, raw, h: int, keep, finish):
        self.raw, self.h, self.keep, self.finish = raw, h, keep, finish

    def _wait_c(self):
        # Nobody is told the outcome: the Work is gone (a failed
        # communicator fails the next call anyway). The write-back still
        # runs, as the operation promised it.
        try:
            self.raw.wait_free_raw(self.h)
        except BaseException:  # noqa: BLE001 - no one to report to; the request is freed
            pass
        else:
            if self.finish is not None:
                try:
                    self.finish()
                except BaseException:  # noqa: BLE001 - as above
                    pass
        self.keep = self.finish = None


class Completer:
    """One thread per group that waits, in issue order, for the started
    works whose futures were asked for, and completes them (collectives
    complete in issue order, so waiting in that order loses nothing), and
    for the operations of works dropped before they completed (orphan),
    holding their memory until then. Started by the first StartedWork.
    add(), orphan() and close() are safe from any thread; orphan() also
    from a __del__ (it only puts on a SimpleQueue, which is reentrant)."""

    def __init__(self, name: str):
        self._name = name
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._mu = threading.Lock()
        self._closed = False

    def start(self):
        """Start the thread (once; not after close())."""
        with self._mu:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def add(self, work: StartedWork):
        self.start()
        if self._closed:
            work._wait_c()  # the communicator is closed: it ends at once
            return
        self._q.put(work)

    def orphan(self, raw, h: int, keep, finish):
        """Wait for the operation of request h (raw: its RawComm) on the
        thread, then free h and let go of keep; finish() runs on success.
        After close() it stays queued, keep held."""
        self._q.put(_Orphan(raw, h, keep, finish))

    def close(self, timeout: float = 60):
        """End the thread after what is queued; the communicator is closed
        first, so that every wait ends at once. What is queued later, or
        was queued with no thread, is waited for here."""
        with self._mu:
            self._closed = True
            t = self._thread
        if t is not None:
            self._q.put(None)
            t.join(timeout=timeout)
            if t.is_alive():
                return  # still waiting: what it holds stays held
        while True:
            try:
                w = self._q.get_nowait()
            except queue.Empty:
                return
            if w is not None:
                w._wait_c()

    def _loop(self):
        while True:
            w = self._q.get()
            if w is None:
                return
            w._wait_c()


class WorkQueue:
    """One thread running submitted (fn, work) pairs in submission order;
    each work is completed with fn's outcome. submit() and close() are safe
    from any thread; idle() says whether nothing submitted is still to
    run, and so does gate.blocked (counted in it, under the queue's lock)
    when a gate (a nexar TensorGate) is given."""

    def __init__(self, name: str, gate=None):
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._pending = 0
        self._gate = gate  # its blocked count holds what is submitted and not yet run
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None], work: NexarWork):
        with self._mu:
            self._pending += 1
            if self._gate is not None:
                self._gate.blocked += 1
        self._q.put((fn, work))

    def on_worker(self) -> bool:
        """Whether the calling thread is this queue's worker."""
        return threading.current_thread() is self._thread

    def idle(self) -> bool:
        """True when every submitted fn has returned: an operation started
        now elsewhere is issued after all of them."""
        return self._pending == 0

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
            try:
                _run(*item)
            finally:
                with self._mu:
                    self._pending -= 1
                    if self._gate is not None:
                        self._gate.blocked -= 1


def complete_in_thread(name: str, fn: Callable[[], None], work: NexarWork):
    """Run fn on a new daemon thread and complete work with its outcome."""
    threading.Thread(target=_run, args=(fn, work), name=name, daemon=True).start()
