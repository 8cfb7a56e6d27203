"""Comm and Request: the Pythonic API over the _nexar extension."""

from __future__ import annotations

import os
import threading
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from . import _errors, _knobs, _launcher, _nexar as _lib
from ._buffers import Buffer, as_buffer, stream_handle
from ._types import Datatype, Op

__all__ = ["Comm", "Request", "Status", "init", "version", "ANY_SOURCE", "UNDEFINED"]

ANY_SOURCE = _lib.ANY_SOURCE
UNDEFINED = _lib.UNDEFINED

_lib._set_error_factory(_errors.error_for)

_FORKED = False


def _mark_forked():
    global _FORKED
    _FORKED = True


_AT_FORK = hasattr(os, "register_at_fork")
if _AT_FORK:
    os.register_at_fork(after_in_child=_mark_forked)


def version():
    """Version of the loaded libnexar as (major, minor, patch)."""
    return tuple(_lib.version())


class Status(NamedTuple):
    """What a completed receive got: source rank, tag, element count, bytes."""

    source: int
    tag: int
    count: int
    nbytes: int


def _ms(seconds) -> int:
    if seconds is None:
        return 0
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    return max(1, int(seconds * 1000))


class Request:
    """A non-blocking operation in flight.

    It keeps its buffers alive until it completes; wait() returns the Status
    of a receive (None for other operations) or raises the operation's
    nexar.Error. Safe to wait on from one thread at a time.
    """

    def __init__(self, comm: "Comm", handle: int, bufs: Sequence[Buffer], recv_buf: Optional[Buffer] = None):
        self._comm = comm
        self._h = handle
        self._bufs = list(bufs)
        self._recv = recv_buf
        self._status: Optional[Status] = None
        self._error: Optional[BaseException] = None
        self._done = False
        self._lock = threading.Lock()
        comm._pending.add(self)

    def _finish(self, err: Optional[BaseException]):
        # Called with self._lock held, once.
        if err is None and self._recv is not None:
            src, tag, count, nbytes = _lib.request_status(self._h)
            self._status = Status(src, tag, nbytes // self._recv.itemsize, nbytes)
        try:
            _lib.request_free(self._h)
        except _errors.Error:
            pass
        if err is None:
            for b in self._bufs:
                b.finish()
        self._error = err
        self._done = True
        self._bufs = []
        self._comm._pending.discard(self)

    def wait(self) -> Optional[Status]:
        with self._lock:
            if not self._done:
                self._comm._check()
                err = None
                try:
                    _lib.wait(self._h)
                except _errors.Error as e:
                    err = e
                self._finish(err)
        if self._error is not None:
            raise self._error
        return self._status

    def test(self) -> bool:
        """True once the operation has completed (raises its error then)."""
        with self._lock:
            if not self._done:
                self._comm._check()
                err = None
                try:
                    done = _lib.test(self._h)
                except _errors.Error as e:
                    done, err = True, e
                if not done:
                    return False
                self._finish(err)
        if self._error is not None:
            raise self._error
        return True

    @property
    def done(self) -> bool:
        return self._done

    @property
    def status(self) -> Optional[Status]:
        return self._status

    @staticmethod
    def waitall(requests: Sequence["Request"]) -> List[Optional[Status]]:
        """Wait for every request (also after one failed), then raise the
        first error; else the Statuses, in order."""
        out: List[Optional[Status]] = []
        first = None
        for r in requests:
            try:
                out.append(r.wait())
            except _errors.Error as e:
                out.append(None)
                first = first or e
        if first is not None:
            raise first
        return out

    @staticmethod
    def testany(requests: Sequence["Request"]) -> Optional[int]:
        """The index of a request that has completed (raising its error),
        or None when none has yet. Completed requests are skipped only if
        they were completed before (their handle is released)."""
        for i, r in enumerate(requests):
            if r.done:
                return i
        live = [r for r in requests if not r.done]
        if not live:
            return None
        with_h = [r._h for r in live]
        done, idx = _lib.testany(with_h)
        if not done or idx >= len(live):
            return None
        q = live[idx]
        q.test()  # completes it (frees the handle, writes back) and raises its error
        return requests.index(q)


class RPCFuture(Request):
    """An RPC call in flight (Comm.icall), a future of its reply.

    result() waits and returns the reply (bytes) or raises the call's
    nexar.Error (the handler's, InvalidArgumentError for an unknown
    function, PeerDownError, TimeoutError at the call's deadline); test()
    and done tell without waiting; it also works with Request.waitall and
    Request.testany. Safe to use from one thread at a time.
    """

    def __init__(self, comm: "Comm", handle: int, owner):
        super().__init__(comm, handle, [])
        self._owner = owner
        self._reply: Optional[bytes] = None

    def _finish(self, err: Optional[BaseException]):
        if err is None and self._owner is not None:
            self._reply = _lib.rpc_reply(self._owner)
        super()._finish(err)
        self._owner = None

    def result(self) -> bytes:
        """Wait for the reply and return it; raises the call's error."""
        self.wait()
        return self._reply if self._reply is not None else b""


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 0
    t = float(timeout)
    if not t > 0:
        raise ValueError(f"nexar: timeout must be positive seconds or None, not {timeout!r}")
    return max(1, int(round(t * 1000)))


_POLICIES = ("abort", "manual", "shrink")  # nexar_failure_policy_t order


class Comm:
    """A nexar communicator: ranks 0..size-1.

    Comm() (or nexar.init()) joins the world described by the launcher's
    environment (`nexar run`, torchrun, Slurm, Open MPI, PMIx: the order is
    nexar._launcher's, docs/guides/launchers.md); Comm(rank=...,
    world_size=..., seed="host:port", token=b"...") joins an explicit one,
    and any of rank, world_size and seed left out of it comes from the
    launcher's variables. Across processes the token is the job's secret,
    which no launcher gives: NEXAR_TOKEN or NEXAR_TOKEN_FILE (or token=).
    The other keyword arguments are knobs (docs/reference/env.md): each
    one given beats its NEXAR_* variable, and an unset one (None) takes the
    variable's value, else the default. topology ("full", "kregular:K",
    "hypercube", "ondemand:M"), schedules ("fit", "rank", a topology), bulk
    ("auto", "tcp", "shm", "rdma", "off"), bulk_plaintext (True: the network
    is trusted), bulk_conns, spin_wait (seconds; negative: never spin),
    memory_profile, min_world_size, max_world_size, join_addr, cuda_runtime,
    nccl_library, ibverbs_library and rdma_device take the forms of their
    variables; a bad one raises InvalidArgumentError naming it.
    Collectives of one Comm must be issued in the same order on every rank
    (call them from one thread, or order them yourself); point-to-point calls
    and requests may be used from several threads. Every blocking call
    releases the GIL. A Comm cannot be used in a child made by fork().
    """

    def __init__(self, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                 seed: Optional[str] = None, token=None, bind_addr: Optional[str] = None,
                 advertise_addr: Optional[str] = None, timeout=None, connect_timeout=None,
                 heartbeat_interval=None, heartbeat_timeout=None,
                 max_buffered_bytes: Optional[int] = None, failure_policy: Optional[str] = None,
                 topology: Optional[str] = None, schedules: Optional[str] = None,
                 bulk: Optional[str] = None, bulk_plaintext: Optional[bool] = None,
                 bulk_conns: Optional[int] = None, spin_wait=None, memory_profile: Optional[str] = None,
                 min_world_size: Optional[int] = None, max_world_size: Optional[int] = None,
                 join_addr: Optional[str] = None, cuda_runtime: Optional[str] = None,
                 nccl_library: Optional[str] = None, ibverbs_library: Optional[str] = None,
                 rdma_device: Optional[str] = None, _handle: Optional[int] = None):
        self._pid = os.getpid()
        self._pending = set()
        self._handlers = []  # capsules owning failure handlers, kept until destroyed
        self._h = 0
        self._elastic = False
        if _FORKED:
            raise _errors.ForkedProcessError("nexar: cannot create a communicator in a child made by fork() "
                                             "without exec(); use the 'spawn' start method")
        knobs = {k: v for k, v in (
            ("topology", topology), ("schedules", schedules), ("bulk", bulk), ("memory_profile", memory_profile),
            ("join_addr", join_addr), ("cuda_runtime", cuda_runtime), ("nccl_library", nccl_library),
            ("ibverbs_library", ibverbs_library), ("rdma_device", rdma_device),
            ("bulk_conns", bulk_conns), ("min_world_size", min_world_size), ("max_world_size", max_world_size),
        ) if v is not None}
        if bulk_plaintext:
            knobs["bulk_plaintext"] = 1
        if spin_wait is not None and float(spin_wait) != 0:  # 0: unset
            us = int(round(float(spin_wait) * 1e6))
            knobs["spin_wait_us"] = us or (1 if spin_wait > 0 else -1)
        if _handle is not None:
            h = _handle
        elif world_size is None and rank is None and seed is None and token is None:
            if knobs:
                raise ValueError("nexar.Comm: %s need an explicit configuration (rank, world_size, seed, token); "
                                 "from the environment, set their NEXAR_* variables instead (docs/reference/env.md)"
                                 % ", ".join(sorted(knobs)))
            # Slurm's, Open MPI's and PMIx's variables as torchrun's, where
            # unset (nexar._launcher: the seed from the node list and a
            # port from the job's id); libnexar reads them.
            _launcher.export(_launcher.detect())
            h = _lib.comm_init_from_env()
        else:
            if world_size is None:
                # Without world_size, the launcher's variables give what the
                # arguments leave out (rank None with world_size given stays
                # "the seed assigns ranks").
                info = _launcher.detect(rank=rank, world_size=world_size, seed=seed)
                world_size = info.world_size if world_size is None else world_size
                rank = info.rank if rank is None else rank
                seed = info.seed if seed is None else seed
            if world_size is None:
                raise ValueError("nexar.Comm: world_size is required with an explicit configuration")
            if isinstance(token, str):
                token = token.encode()
            h = _lib.comm_init(
                -1 if rank is None else int(rank), int(world_size), seed or "", bytes(token or b""),
                bind_addr or "", advertise_addr or "", _ms(timeout), _ms(connect_timeout),
                _ms(heartbeat_interval), _ms(heartbeat_timeout), int(max_buffered_bytes or 0),
                {k: (v if isinstance(v, str) else int(v)) for k, v in knobs.items()})
        self._h = h
        self._rank = _lib.comm_rank(h)
        self._size = _lib.comm_size(h)
        if _handle is None:
            self._apply_policy(failure_policy)
        self._elastic = _lib.comm_get_failure_policy(h) == _POLICIES.index("shrink")

    def _apply_policy(self, failure_policy):
        # The argument beats NEXAR_ON_FAILURE, which libnexar applied when
        # it made the communicator (its knob table).
        policy = failure_policy.strip().lower() if failure_policy else None
        if policy is not None:
            if policy not in _POLICIES:
                self.close()
                raise ValueError("nexar: failure policy %r: want one of %s" % (policy, ", ".join(_POLICIES)))
            _lib.comm_set_failure_policy(self._h, _POLICIES.index(policy))

    @classmethod
    def join(cls, addrs=None, *, token=None, timeout=None, failure_policy: Optional[str] = None) -> "Comm":
        """Join a running job: wait in a member's lobby until the members
        call grow(), and return this process's communicator in the grown
        world. addrs: the seed's or any member's lobby address (a
        comma-separated string or a list, tried in turn; default
        NEXAR_SEED); token: the job's (default NEXAR_TOKEN); timeout:
        seconds to wait (default: the library's, 5 minutes). A process
        started with NEXAR_JOIN=1 joins the same way from nexar.Comm()."""
        if addrs is None:
            addrs = _knobs.env("NEXAR_SEED") or ""
        if not isinstance(addrs, str):
            addrs = ",".join(addrs)
        if token is None:
            token = _knobs.env("NEXAR_TOKEN") or ""
        if isinstance(token, str):
            token = token.encode()
        if _FORKED:
            raise _errors.ForkedProcessError("nexar: cannot join in a child made by fork() without exec()")
        c = cls(_handle=_lib.comm_join(addrs, bytes(token), _ms(timeout)))
        c._apply_policy(failure_policy)
        c._elastic = _lib.comm_get_failure_policy(c._h) == _POLICIES.index("shrink")
        return c

    # ---- lifecycle ------------------------------------------------------
    def _check(self):
        # register_at_fork sets _FORKED in a forked child; getpid (a system
        # call per operation) only where that hook does not exist.
        if _FORKED or (not _AT_FORK and os.getpid() != self._pid):
            raise _errors.ForkedProcessError(
                "nexar: this communicator was created in process %d and cannot be used in the forked child %d; "
                "start workers with the 'spawn' start method or subprocess" % (self._pid, os.getpid()))
        if not self._h:
            raise _errors.ClosedError(_errors.ClosedError.code, "nexar: the communicator is closed")
        if self._elastic:
            # Under the shrink policy the handle may stand for the survivors'
            # communicator by now: its rank and size are re-read.
            self._rank = _lib.comm_rank(self._h)
            self._size = _lib.comm_size(self._h)
        return self._h

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def handle(self) -> int:
        """The nexar_comm_t value (for other bindings of the same library)."""
        return self._h

    @property
    def closed(self) -> bool:
        return not self._h

    def check(self) -> None:
        """Raise nexar.ForkedProcessError in a child made by fork() and
        nexar.ClosedError once closed; return None while usable. For layers
        that queue work for later (nexar.torch) and want to fail at once."""
        self._check()

    @property
    def raw(self) -> "RawComm":
        """The raw-pointer entry points of this communicator (see RawComm)."""
        return RawComm(self)

    def split(self, color: int, key: int = 0) -> Optional["Comm"]:
        """Collective: ranks with the same color form a new Comm ordered by key.
        A negative color (nexar.UNDEFINED) joins none and returns None."""
        h = _lib.comm_split(self._check(), int(color), int(key))
        if not h:
            return None
        return Comm(_handle=h)

    def abort(self):
        """Fail every pending and later operation here and, soon, on the other ranks."""
        _lib.comm_abort(self._check())

    # ---- recovery without restart (docs/fault-tolerance.md) ---------------
    @property
    def failure_policy(self) -> str:
        """What a member's failure does: "abort" (the default: the
        communicator fails for good), "manual" (calls fail; recover with
        revoke, agree and shrink) or "shrink" (the library agrees and
        shrinks by itself: the call that met the failure raises, and this
        Comm then stands for the survivors' communicator, its rank and
        size renumbered). Read from NEXAR_ON_FAILURE at creation."""
        return _POLICIES[_lib.comm_get_failure_policy(self._check())]

    @failure_policy.setter
    def failure_policy(self, policy: str) -> None:
        if policy not in _POLICIES:
            raise ValueError("nexar: failure_policy %r: want one of %s" % (policy, ", ".join(_POLICIES)))
        _lib.comm_set_failure_policy(self._check(), _POLICIES.index(policy))
        self._elastic = policy == "shrink"

    def revoke(self) -> None:
        """Fail every pending and later operation on this communicator, here
        and on every member (RevokedError); agree and shrink still work."""
        _lib.comm_revoke(self._check())

    @property
    def revoked(self) -> bool:
        """Whether this communicator was revoked, here or by a member."""
        return _lib.comm_is_revoked(self._check())

    def agree(self, flag: int = (1 << 64) - 1) -> Tuple[int, List[int]]:
        """Fault-tolerant agreement among the live members (every member
        calls it): returns (the AND of the members' 64-bit flags, the ranks
        left out, ascending), the same on every member that returns, even
        when members fail meanwhile. Raises NoQuorumError on a side of a
        partition without a quorum, PeerDownError on a member the others
        left out, UnavailableError under the "abort" policy."""
        f, failed = _lib.comm_agree(self._check(), int(flag) & ((1 << 64) - 1))
        return f, list(failed)

    def shrink(self) -> "Comm":
        """The survivors' communicator (every live member calls it): this
        one is revoked, the live members agree on who failed, and the
        others form a new Comm in this one's rank order. Close this one too."""
        return Comm(_handle=_lib.comm_shrink(self._check()))

    def grow(self) -> "Comm":
        """Admit the processes waiting to join (Comm.join) and return the
        grown communicator: this one's live members in order, then the
        joiners, at most NEXAR_MAX_WORLD_SIZE (default: the first world's
        size). Every live member calls it at the same point; with nobody
        waiting it is the live members' communicator. If a member or joiner
        fails meanwhile, every member gets the error and keeps this one.
        Close this one too."""
        return Comm(_handle=_lib.comm_grow(self._check()))

    @property
    def join_addrs(self) -> List[str]:
        """The live members' lobby addresses, where a process started later
        joins (Comm.join, or NEXAR_JOIN=1 with NEXAR_SEED set to them)."""
        s = _lib.comm_join_addrs(self._check())
        return [a for a in s.split(",") if a]

    @property
    def failed(self) -> List[int]:
        """The ranks of the members found failed so far (dead or unreachable,
        found here or reported by another member), in the order learned;
        recorded also after the communicator itself failed."""
        return list(_lib.comm_get_failed(self._check()))

    def on_failure(self, fn: Optional[Callable[[int, "_errors.Error"], None]]) -> None:
        """Call fn(rank, error) for each member found failed, once per
        member, starting with those found before this call (unless an
        earlier handler was told). It runs on a library thread, holding the
        GIL, one call at a time; what it raises goes to
        sys.unraisablehook. None removes the handler. After close() it is
        never called again."""
        h = self._check()
        if fn is None:
            _lib.comm_set_failure_handler(h, None)
            return

        def call(rank, code, msg, fn=fn):
            fn(rank, _errors.error_for(code, msg))

        self._handlers.append(_lib.comm_set_failure_handler(h, call))

    def register(self, fn_id: int, handler: Optional[Callable[[int, bytes], Optional[bytes]]]) -> None:
        """Serve RPC function fn_id with handler(caller_rank, request) ->
        reply (bytes-like or None); None removes it. It runs on a library
        thread, holding the GIL; an exception it raises reaches the caller
        as a nexar error carrying its type name and message (and its code,
        for a nexar.Error). Handlers stay alive until close()."""
        self._handlers.append(_lib.rpc_register(self._check(), int(fn_id), handler))

    def call(self, peer: int, fn_id: int, request=b"", timeout: Optional[float] = None, out=None):
        """Call RPC function fn_id on rank peer (this rank too) with request
        (a C-contiguous bytes-like object, read in place: it must not
        change until call returns) and return the reply as bytes, or, with
        out (a writable C-contiguous buffer: bytearray, memoryview, numpy
        array), write the reply to out's first bytes and return its length
        (nexar.TruncatedError when out is too small; the call has then run
        and its reply is lost). timeout (seconds) is the call's own
        deadline, bounded by the communicator's timeout; None leaves the
        communicator's. Raises the handler's error,
        nexar.InvalidArgumentError when peer has no handler for fn_id,
        nexar.PeerDownError, nexar.TimeoutError at the deadline."""
        return _lib.rpc_call(self._check(), int(peer), int(fn_id), request, _timeout_ms(timeout), out)

    def icall(self, peer: int, fn_id: int, request=b"", timeout: Optional[float] = None) -> RPCFuture:
        """Start calling RPC function fn_id on rank peer and return an
        RPCFuture at once; its result() is the reply, and raises what
        call() would. The request is copied. timeout as for call(): the
        call ends at it even when nobody waits."""
        h, owner = _lib.rpc_icall(self._check(), int(peer), int(fn_id), bytes(request), _timeout_ms(timeout))
        return RPCFuture(self, h, owner)

    @property
    def error(self) -> Optional[_errors.Error]:
        """The communicator's sticky failure, or None while healthy."""
        code = _lib.comm_get_error(self._check())
        if code == 0:
            return None
        return _errors.error_for(code, "nexar: communicator failed: " + _lib.result_string(code))

    def close(self):
        """Release the communicator (local, idempotent). Pending requests fail."""
        if not self._h or os.getpid() != self._pid or _FORKED:
            self._h = 0
            return
        h, self._h = self._h, 0
        _lib.comm_destroy(h)
        self._handlers.clear()  # no failure handler runs after destroy
        for r in list(self._pending):
            with r._lock:
                if not r._done:
                    r._finish(_errors.ClosedError(_errors.ClosedError.code, "nexar: the communicator was closed"))

    destroy = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._h and not self._pending:
                self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if not self._h else f"rank={self._rank} size={self._size}"
        return f"<nexar.Comm {state}>"

    # ---- helpers ----------------------------------------------------------
    def _in(self, obj, stream=None) -> Buffer:
        return as_buffer(obj, False, _lib, stream)

    def _out(self, obj, stream=None) -> Buffer:
        return as_buffer(obj, True, _lib, stream)

    @staticmethod
    def _same(what, a: Buffer, b: Buffer, factor: int = 1, exact: bool = True):
        if a.dtype != b.dtype or a.itemsize != b.itemsize:
            raise TypeError(f"nexar: {what}: send and receive buffers have different element types")
        if exact and a.count * factor != b.count:
            raise ValueError(f"nexar: {what}: receive buffer holds {b.count} elements, expected {a.count * factor}")

    @staticmethod
    def _op(op) -> int:
        if type(op) is Op:
            return op.value
        return int(Op(op))

    def _reduce_start(self, name, fn, sendbuf, recvbuf, op, *extra, stream=None):
        """fn (a reduction, blocking or not) on sendbuf into recvbuf (in place
        when None): (what fn returned, the buffers, the result object).
        stream: the cudaStream_t fn is ordered on, None for none."""
        h = self._check()
        s = self._in(sendbuf, stream) if recvbuf is not None else self._out(sendbuf, stream)
        r = self._out(recvbuf, stream) if recvbuf is not None else s
        n, dt = s.typed(name)
        if r is not s:
            self._same(name, s, r)
        q = fn(s.addr, r.addr, n, int(dt), self._op(op), *extra, h)
        return q, ([s, r] if r is not s else [s]), r.obj

    def _reduction(self, name, fn, sendbuf, recvbuf, op, *extra, stream=None):
        return _finish(*self._reduce_start(name, fn, sendbuf, recvbuf, op, *extra, stream=stream)[1:])

    # ---- point-to-point -----------------------------------------------------
    def send(self, buf, dest: int, tag: int = 0, *, stream=None):
        """Send buf to rank dest; returns when buf may be reused. stream (a
        cudaStream_t or a torch/CuPy stream): nexar_send_stream, buf as the
        stream has it once the work enqueued there before the call is done."""
        h = self._check()
        st = None if stream is None else stream_handle(stream)
        b = self._in(buf, st)
        n, dt = b.raw()
        if st is None:
            _lib.send(b.addr, n, int(dt), int(dest), int(tag), h)
        else:
            _lib.send_stream(b.addr, n, int(dt), int(dest), int(tag), h, st)

    def recv(self, buf, source: int = ANY_SOURCE, tag: int = 0, *, stream=None) -> Optional[Status]:
        """Receive into buf from source (or any rank) with tag; returns the Status.
        stream: nexar_recv_stream, the result reaching buf in stream order;
        returns None then (that call reports no status)."""
        h = self._check()
        st = None if stream is None else stream_handle(stream)
        b = self._out(buf, st)
        n, dt = b.raw()
        if st is not None:
            _lib.recv_stream(b.addr, n, int(dt), int(source), int(tag), h, st)
            return None
        src, tg, _, nbytes = _lib.recv(b.addr, n, int(dt), int(source), int(tag), h)
        b.finish()
        return Status(src, tg, nbytes // b.itemsize, nbytes)

    def isend(self, buf, dest: int, tag: int = 0) -> Request:
        h = self._check()
        b = self._in(buf)
        n, dt = b.raw()
        return Request(self, _lib.isend(b.addr, n, int(dt), int(dest), int(tag), h), [b])

    def irecv(self, buf, source: int = ANY_SOURCE, tag: int = 0) -> Request:
        h = self._check()
        b = self._out(buf)
        n, dt = b.raw()
        return Request(self, _lib.irecv(b.addr, n, int(dt), int(source), int(tag), h), [b], recv_buf=b)

    # ---- collectives --------------------------------------------------------
    def barrier(self):
        _lib.barrier(self._check())

    def ibarrier(self) -> Request:
        return Request(self, _lib.ibarrier(self._check()), [])

    def allreduce(self, sendbuf, recvbuf=None, op=Op.SUM, *, stream=None):
        """recvbuf = op over ranks of sendbuf (in place when recvbuf is None). Returns the result buffer.

        Buffers may be CUDA arrays (torch, CuPy, JAX: DLPack or
        __cuda_array_interface__). stream (a cudaStream_t or a torch/CuPy
        stream) orders the call on it (nexar_allreduce_stream): it returns
        once its host part is done and device results reach recvbuf in
        stream order. Without stream the call is blocking. The same holds
        for broadcast, allgather, reduce_scatter, send and recv; the other
        blocking calls take CUDA arrays without stream."""
        h = self._check()
        if stream is None:
            if _lib.allreduce_fast(sendbuf, recvbuf, self._op(op), h):
                return sendbuf if recvbuf is None else recvbuf
            return self._reduction("allreduce", _lib.allreduce, sendbuf, recvbuf, op)
        st = stream_handle(stream)
        return self._reduction("allreduce", lambda s, r, n, dt, o, c: _lib.allreduce_stream(s, r, n, dt, o, c, st),
                               sendbuf, recvbuf, op, stream=st)

    def iallreduce(self, sendbuf, recvbuf=None, op=Op.SUM) -> Request:
        h = self._check()
        s = self._in(sendbuf) if recvbuf is not None else self._out(sendbuf)
        r = self._out(recvbuf) if recvbuf is not None else s
        n, dt = s.typed("iallreduce")
        if r is not s:
            self._same("iallreduce", s, r)
        q = _lib.iallreduce(s.addr, r.addr, n, int(dt), self._op(op), h)
        return Request(self, q, [s, r] if r is not s else [s])

    def broadcast(self, buf, root: int = 0, *, stream=None):
        """Copy root's buf to every rank's buf. Returns buf. stream: as allreduce."""
        h = self._check()
        st = None if stream is None else stream_handle(stream)
        if st is None and _lib.broadcast_fast(buf, int(root), self._rank == root, h):
            return buf
        b = self._out(buf, st) if self._rank != root else self._in(buf, st)
        n, dt = b.raw()
        if st is None:
            _lib.broadcast(b.addr, n, int(dt), int(root), h)
        else:
            _lib.broadcast_stream(b.addr, n, int(dt), int(root), h, st)
        b.finish()
        return b.obj

    bcast = broadcast

    def ibroadcast(self, buf, root: int = 0) -> Request:
        h = self._check()
        b = self._out(buf) if self._rank != root else self._in(buf)
        n, dt = b.raw()
        return Request(self, _lib.ibroadcast(b.addr, n, int(dt), int(root), h), [b])

    def reduce(self, sendbuf, recvbuf=None, op=Op.SUM, root: int = 0):
        """Like allreduce, but only root gets the result (in place on root when recvbuf is None)."""
        h = self._check()
        if self._rank == root:
            return self._reduction("reduce", _lib.reduce, sendbuf, recvbuf, op, int(root))
        s = self._in(sendbuf)
        n, dt = s.typed("reduce")
        r = self._out(recvbuf) if recvbuf is not None else None
        _lib.reduce(s.addr, r.addr if r else s.addr, n, int(dt), self._op(op), int(root), h)
        return recvbuf

    def ireduce(self, sendbuf, recvbuf=None, op=Op.SUM, root: int = 0) -> Request:
        h = self._check()
        on_root = self._rank == root
        s = self._in(sendbuf) if (recvbuf is not None or not on_root) else self._out(sendbuf)
        r = self._out(recvbuf) if recvbuf is not None else s
        n, dt = s.typed("ireduce")
        if r is not s and on_root:
            self._same("ireduce", s, r)
        q = _lib.ireduce(s.addr, r.addr, n, int(dt), self._op(op), int(root), h)
        return Request(self, q, [s, r] if r is not s else [s])

    def allgather(self, sendbuf, recvbuf, *, stream=None):
        """recvbuf (size x sendbuf) gets every rank's sendbuf in rank order.
        sendbuf None: in place, this rank's block already in recvbuf. stream: as allreduce."""
        h = self._check()
        st = None if stream is None else stream_handle(stream)
        if st is None and sendbuf is not None and _lib.allgather_fast(sendbuf, recvbuf, self._size, h):
            return recvbuf
        if st is None:
            call = _lib.allgather
        else:
            def call(s, r, n, dt, c):
                _lib.allgather_stream(s, r, n, dt, c, st)
        r = self._out(recvbuf, st)
        if sendbuf is None:
            n, dt = r.raw()
            if n % self._size:
                raise ValueError("nexar: allgather: receive buffer size is not a multiple of the world size")
            call(r.addr, r.addr, n // self._size, int(dt), h)
        else:
            s = self._in(sendbuf, st)
            self._same("allgather", s, r, self._size)
            n, dt = s.raw()
            call(s.addr, r.addr, n, int(dt), h)
        r.finish()
        return r.obj

    def iallgather(self, sendbuf, recvbuf) -> Request:
        h = self._check()
        r = self._out(recvbuf)
        if sendbuf is None:
            n, dt = r.raw()
            q = _lib.iallgather(r.addr, r.addr, n // self._size, int(dt), h)
            return Request(self, q, [r])
        s = self._in(sendbuf)
        self._same("iallgather", s, r, self._size)
        n, dt = s.raw()
        return Request(self, _lib.iallgather(s.addr, r.addr, n, int(dt), h), [s, r])

    def allgatherv(self, sendbuf, recvbuf, counts: Sequence[int], displs: Optional[Sequence[int]] = None):
        """recvbuf gets counts[r] elements from rank r at element offset displs[r]
        (packed when displs is None). sendbuf None: in place."""
        return _finish(*self._allgatherv(_lib.allgatherv, sendbuf, recvbuf, counts, displs)[1:])

    def reduce_scatter(self, sendbuf, recvbuf=None, op=Op.SUM, *, stream=None):
        """sendbuf holds size blocks; block r reduced over ranks goes to rank r's recvbuf.
        recvbuf None: in place, the result is left in the first block of sendbuf. stream: as allreduce."""
        h = self._check()
        st = None if stream is None else stream_handle(stream)
        if st is None:
            call = _lib.reduce_scatter
        else:
            def call(s, r, n, dt, o, c):
                _lib.reduce_scatter_stream(s, r, n, dt, o, c, st)
        if recvbuf is None:
            s = self._out(sendbuf, st)
            n, dt = s.typed("reduce_scatter")
            if n % self._size:
                raise ValueError("nexar: reduce_scatter: buffer size is not a multiple of the world size")
            call(s.addr, s.addr, n // self._size, int(dt), self._op(op), h)
            s.finish()
            return s.obj
        if st is None and _lib.reduce_scatter_fast(sendbuf, recvbuf, self._op(op), self._size, h):
            return recvbuf
        s, r = self._in(sendbuf, st), self._out(recvbuf, st)
        n, dt = r.typed("reduce_scatter")
        self._same("reduce_scatter", r, s, self._size)
        call(s.addr, r.addr, n, int(dt), self._op(op), h)
        r.finish()
        return r.obj

    def ireduce_scatter(self, sendbuf, recvbuf, op=Op.SUM) -> Request:
        h = self._check()
        s, r = self._in(sendbuf), self._out(recvbuf)
        n, dt = r.typed("ireduce_scatter")
        self._same("ireduce_scatter", r, s, self._size)
        return Request(self, _lib.ireduce_scatter(s.addr, r.addr, n, int(dt), self._op(op), h), [s, r])

    def alltoall(self, sendbuf, recvbuf=None):
        """Block j of sendbuf goes to rank j; block i of recvbuf comes from rank i.
        recvbuf None: in place."""
        h = self._check()
        if recvbuf is not None and _lib.alltoall_fast(sendbuf, recvbuf, self._size, h):
            return recvbuf
        s = self._in(sendbuf) if recvbuf is not None else self._out(sendbuf)
        r = self._out(recvbuf) if recvbuf is not None else s
        if r is not s:
            self._same("alltoall", s, r)
        n, dt = s.raw()
        if n % self._size:
            raise ValueError("nexar: alltoall: buffer size is not a multiple of the world size")
        _lib.alltoall(s.addr, r.addr, n // self._size, int(dt), h)
        r.finish()
        return r.obj

    def ialltoall(self, sendbuf, recvbuf) -> Request:
        h = self._check()
        s, r = self._in(sendbuf), self._out(recvbuf)
        self._same("ialltoall", s, r)
        n, dt = s.raw()
        return Request(self, _lib.ialltoall(s.addr, r.addr, n // self._size, int(dt), h), [s, r])

    def alltoallv(self, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls):
        """sendcounts[j] elements at sdispls[j] go to rank j; recvcounts[i] elements
        from rank i land at rdispls[i]. displs None: packed."""
        return _finish(*self._alltoallv(_lib.alltoallv, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                        rdispls)[1:])

    def gather(self, sendbuf, recvbuf=None, root: int = 0):
        """root's recvbuf (size x sendbuf) gets every rank's sendbuf.
        On root, sendbuf None: in place (root's block already in recvbuf)."""
        return _finish(*self._gather(_lib.gather, sendbuf, recvbuf, root)[1:])

    def gatherv(self, sendbuf, recvbuf=None, counts=None, displs=None, root: int = 0):
        """root's recvbuf gets counts[r] elements from rank r at displs[r] (packed when None)."""
        return _finish(*self._gatherv(_lib.gatherv, sendbuf, recvbuf, counts, displs, root)[1:])

    def scatter(self, sendbuf, recvbuf, root: int = 0):
        """Block r of root's sendbuf (size x recvbuf) goes to rank r's recvbuf.
        On root, recvbuf None: in place (root's block stays in sendbuf)."""
        return _finish(*self._scatter(_lib.scatter, sendbuf, recvbuf, root)[1:])

    def scatterv(self, sendbuf, counts, displs, recvbuf, root: int = 0):
        """counts[r] elements at displs[r] of root's sendbuf go to rank r's recvbuf."""
        return _finish(*self._scatterv(_lib.scatterv, sendbuf, counts, displs, recvbuf, root)[1:])

    def scan(self, sendbuf, recvbuf=None, op=Op.SUM):
        """Inclusive prefix reduction over ranks 0..rank (in place when recvbuf is None)."""
        return self._reduction("scan", _lib.scan, sendbuf, recvbuf, op)

    def exscan(self, sendbuf, recvbuf=None, op=Op.SUM):
        """Exclusive prefix reduction over ranks 0..rank-1; rank 0's recvbuf is left unchanged."""
        return self._reduction("exscan", _lib.exscan, sendbuf, recvbuf, op)

    # ---- non-blocking forms of the rest ---------------------------------------
    # Same arguments as the blocking calls; each returns a Request that keeps
    # the buffers until it completes and writes the results back on success.

    def iscan(self, sendbuf, recvbuf=None, op=Op.SUM) -> Request:
        return Request(self, *self._reduce_start("iscan", _lib.iscan, sendbuf, recvbuf, op)[:2])

    def iexscan(self, sendbuf, recvbuf=None, op=Op.SUM) -> Request:
        return Request(self, *self._reduce_start("iexscan", _lib.iexscan, sendbuf, recvbuf, op)[:2])

    def igather(self, sendbuf, recvbuf=None, root: int = 0) -> Request:
        return Request(self, *self._gather(_lib.igather, sendbuf, recvbuf, root)[:2])

    def iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return Request(self, *self._scatter(_lib.iscatter, sendbuf, recvbuf, root)[:2])

    def iallgatherv(self, sendbuf, recvbuf, counts: Sequence[int], displs: Optional[Sequence[int]] = None) -> Request:
        return Request(self, *self._allgatherv(_lib.iallgatherv, sendbuf, recvbuf, counts, displs)[:2])

    def igatherv(self, sendbuf, recvbuf=None, counts=None, displs=None, root: int = 0) -> Request:
        return Request(self, *self._gatherv(_lib.igatherv, sendbuf, recvbuf, counts, displs, root)[:2])

    def iscatterv(self, sendbuf, counts, displs, recvbuf, root: int = 0) -> Request:
        return Request(self, *self._scatterv(_lib.iscatterv, sendbuf, counts, displs, recvbuf, root)[:2])

    def ialltoallv(self, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls) -> Request:
        return Request(self, *self._alltoallv(_lib.ialltoallv, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                              rdispls)[:2])

    # ---- bucketed allreduce -------------------------------------------------
    def allreduce_multi(self, bufs, op=Op.SUM, bucket_bytes: int = 0):
        """Allreduce each buffer of bufs in place, packed into buckets of at
        most bucket_bytes (0: 25 MiB) reduced one after the other, packing
        and unpacking overlapping the reduction. Buffers of different
        element types go in one call per type, in order of first
        appearance. Every rank must pass the same shapes in the same order.
        Returns bufs."""
        h = self._check()
        bs = [self._out(b) for b in bufs]
        groups = {}
        for b in bs:
            n, dt = b.typed("allreduce_multi")
            g = groups.setdefault(int(dt), ([], []))
            g[0].append(b.addr)
            g[1].append(n)
        o = self._op(op)
        for dt, (addrs, counts) in groups.items():
            _lib.allreduce_multi(addrs, counts, dt, o, int(bucket_bytes), h)
        _finish(bs, None)
        return bufs

    def iallreduce_multi(self, bufs, op=Op.SUM, bucket_bytes: int = 0) -> Request:
        """Non-blocking allreduce_multi; the buffers must share one element type."""
        h = self._check()
        bs = [self._out(b) for b in bufs]
        typed = [b.typed("iallreduce_multi") for b in bs]
        dts = {int(dt) for _, dt in typed}
        if len(dts) > 1:
            raise TypeError("nexar: iallreduce_multi: buffers have different element types "
                            "(use allreduce_multi, or one call per type)")
        dt = dts.pop() if dts else int(Datatype.FLOAT32)
        q = _lib.iallreduce_multi([b.addr for b in bs], [n for n, _ in typed], dt, self._op(op),
                                  int(bucket_bytes), h)
        return Request(self, q, bs)

    def allreduce_compressed(self, buf, state, key=0, average: bool = False):
        """Sum a sparsified float32 buf over the ranks, in place: each rank
        sends state.ratio of its elements (state.method), with error
        feedback in state's residual for key when state.error_feedback.
        The result is the same on every rank; average divides it by the
        size. Every rank must make the same calls in the same order (the
        RandomK seed comes from state's call count). Returns buf."""
        h = self._check()
        b = self._out(buf)
        n, dt = b.typed("allreduce_compressed")
        res = 0
        keep = None
        if state.error_feedback:
            keep = self._out(state.residual(key, buf))
            res = keep.addr
        _lib.allreduce_compressed(b.addr, res, n, int(dt), state.method, state.ratio, state.next_seed(), h)
        _finish([b], None)
        del keep
        if average and self._size > 1:
            if hasattr(buf, "numel"):  # a torch tensor
                import torch
                with torch.no_grad():
                    buf.div_(self._size)
            else:
                buf /= self._size
        return buf

    # Each _X prepares collective X and calls fn, the blocking libnexar call
    # or its non-blocking form (the two take the same arguments), and returns
    # (what fn returned, the buffers the call uses, the object the blocking
    # call returns). The blocking call then finishes the buffers (_finish);
    # the non-blocking one hands them to its Request.

    def _gather(self, fn, sendbuf, recvbuf, root):
        h = self._check()
        if self._rank == root:
            r = self._out(recvbuf)
            if sendbuf is None:
                n, dt = r.raw()
                return fn(r.addr, r.addr, n // self._size, int(dt), int(root), h), [r], r.obj
            s = self._in(sendbuf)
            self._same("gather", s, r, self._size)
            n, dt = s.raw()
            return fn(s.addr, r.addr, n, int(dt), int(root), h), [s, r], r.obj
        s = self._in(sendbuf)
        n, dt = s.raw()
        return fn(s.addr, 0, n, int(dt), int(root), h), [s], None

    def _scatter(self, fn, sendbuf, recvbuf, root):
        h = self._check()
        if self._rank == root:
            if recvbuf is None:
                s = self._out(sendbuf)
                n, dt = s.raw()
                return fn(s.addr, s.addr, n // self._size, int(dt), int(root), h), [s], s.obj
            s, r = self._in(sendbuf), self._out(recvbuf)
            self._same("scatter", r, s, self._size)
            n, dt = r.raw()
            return fn(s.addr, r.addr, n, int(dt), int(root), h), [s, r], r.obj
        r = self._out(recvbuf)
        n, dt = r.raw()
        return fn(0, r.addr, n, int(dt), int(root), h), [r], r.obj

    def _allgatherv(self, fn, sendbuf, recvbuf, counts, displs):
        h = self._check()
        r = self._out(recvbuf)
        counts, displs = _counts_displs(counts, displs, self._size, "allgatherv")
        if sendbuf is None:
            s, scount = r, counts[self._rank]
        else:
            s = self._in(sendbuf)
            self._same("allgatherv", s, r, exact=False)
            scount = s.count
        dt = _dt(s, r)
        f = r.itemsize if r.dtype is None else 1
        q = fn(s.addr, scount * f, r.addr, [c * f for c in counts], [d * f for d in displs], int(dt), h)
        return q, ([s, r] if s is not r else [r]), r.obj

    def _gatherv(self, fn, sendbuf, recvbuf, counts, displs, root):
        h = self._check()
        s = self._in(sendbuf)
        f = s.itemsize if s.dtype is None else 1
        n, dt = s.raw()
        if self._rank == root:
            r = self._out(recvbuf)
            self._same("gatherv", s, r, exact=False)
            c, d = _counts_displs(counts, displs, self._size, "gatherv")
            q = fn(s.addr, n, r.addr, [x * f for x in c], [x * f for x in d], int(dt), int(root), h)
            return q, [s, r], r.obj
        return fn(s.addr, n, 0, [], [], int(dt), int(root), h), [s], None

    def _scatterv(self, fn, sendbuf, counts, displs, recvbuf, root):
        h = self._check()
        r = self._out(recvbuf)
        n, dt = r.raw()
        f = r.itemsize if r.dtype is None else 1
        if self._rank == root:
            s = self._in(sendbuf)
            self._same("scatterv", r, s, exact=False)
            c, d = _counts_displs(counts, displs, self._size, "scatterv")
            q = fn(s.addr, [x * f for x in c], [x * f for x in d], r.addr, n, int(dt), int(root), h)
            return q, [s, r], r.obj
        return fn(0, [], [], r.addr, n, int(dt), int(root), h), [r], r.obj

    def _alltoallv(self, fn, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls):
        h = self._check()
        s, r = self._in(sendbuf), self._out(recvbuf)
        self._same("alltoallv", s, r, exact=False)
        sc, sd = _counts_displs(sendcounts, sdispls, self._size, "alltoallv")
        rc, rd = _counts_displs(recvcounts, rdispls, self._size, "alltoallv")
        dt = _dt(s, r)
        f = s.itemsize if s.dtype is None else 1
        q = fn(s.addr, [c * f for c in sc], [d * f for d in sd], r.addr, [c * f for c in rc], [d * f for d in rd],
               int(dt), h)
        return q, [s, r], r.obj

    # ---- diagnostics (docs/diagnostics.md) -----------------------------
    def dump_flight_record(self, path) -> None:
        """Write this communicator's flight record (its last operations:
        kind, sequence number, dtype, bytes, root or peer, state,
        timestamps) as JSON to path. `nexar diagnose DIR` reads the records
        of every rank (named nexar-flight-*.json in DIR) and says who waits
        for whom. Safe while other threads are blocked in calls on it."""
        path = os.fspath(path)
        if not path:
            raise ValueError("nexar: dump_flight_record: empty path")
        _lib.comm_dump_flight_record(self._check(), path)

    def flight_record(self) -> dict:
        """This communicator's flight record, as the dict dump_flight_record
        writes (keys: comm, rank, size, next_seq, entries, ...)."""
        import json
        import tempfile

        fd, path = tempfile.mkstemp(prefix="nexar-flight-", suffix=".json")
        os.close(fd)
        try:
            self.dump_flight_record(path)
            with open(path) as f:
                return json.load(f)
        finally:
            os.unlink(path)

    def path(self, peer: int) -> str:
        """The path that carries this rank's data to peer, as `nexar bench`
        prints it ("shm 8 MiB ring", "tcp x2 tls", "tcp x2 plaintext",
        "relay via 3", "quic", "loopback" for this rank); a pair's path is
        chosen at its first message."""
        return _lib.comm_get_path(self._check(), int(peer))

    def paths(self) -> dict:
        """path(peer) for every rank, by rank."""
        return {r: self.path(r) for r in range(self.size)}

    def stats(self) -> dict:
        """This communicator's memory and traffic (nexar_comm_get_stats), a
        dict of ints: bytes_buffered (per process: early messages held),
        scratch_bytes (per communicator: collective scratch in use and kept
        idle), ring_bytes (per process: shared-memory rings created),
        relayed_bytes (per process; always 0: no relaying yet),
        messages_sent, bytes_sent and bytes_received (per communicator:
        collective and point-to-point data). Safe from any thread; memory
        budgets: NEXAR_MEMORY_PROFILE (docs/memory.md)."""
        return _lib.comm_get_stats(self._check())


class RawComm:
    """Raw-pointer entry points of a Comm, for bindings that prepare their
    own memory (nexar.torch stages tensors itself).

    Each method is one libnexar call: addresses are integers (0 for "none"),
    counts are elements of dtype (a Datatype or its integer code), and the
    memory must stay valid and unaliased as libnexar requires until the call
    returns (or, for isend/irecv, until the Request completes). libnexar
    checks the arguments; nothing else does. Each call first raises what
    Comm.check() raises. Blocking calls release the GIL. Concurrency is that
    of the Comm: collectives in the same order on every rank.
    """

    __slots__ = ("_comm",)

    def __init__(self, comm: Comm):
        self._comm = comm

    def allreduce(self, send: int, recv: int, count: int, dtype, op):
        _lib.allreduce(send, recv, count, int(dtype), int(op), self._comm._check())

    # The _stream variants (nexar.h): ordered on a CUDA stream (a
    # cudaStream_t as an integer, 0 for the legacy default stream); device
    # pointers' results reach them in stream order.
    def allreduce_stream(self, send: int, recv: int, count: int, dtype, op, stream: int):
        _lib.allreduce_stream(send, recv, count, int(dtype), int(op), self._comm._check(), stream)

    def broadcast_stream(self, buf: int, count: int, dtype, root: int, stream: int):
        _lib.broadcast_stream(buf, count, int(dtype), root, self._comm._check(), stream)

    def allgather_stream(self, send: int, recv: int, count: int, dtype, stream: int):
        _lib.allgather_stream(send, recv, count, int(dtype), self._comm._check(), stream)

    def reduce_scatter_stream(self, send: int, recv: int, recvcount: int, dtype, op, stream: int):
        _lib.reduce_scatter_stream(send, recv, recvcount, int(dtype), int(op), self._comm._check(), stream)

    def send_stream(self, buf: int, count: int, dtype, peer: int, tag: int, stream: int):
        _lib.send_stream(buf, count, int(dtype), peer, tag, self._comm._check(), stream)

    def recv_stream(self, buf: int, count: int, dtype, peer: int, tag: int, stream: int):
        _lib.recv_stream(buf, count, int(dtype), peer, tag, self._comm._check(), stream)

    def reduce(self, send: int, recv: int, count: int, dtype, op, root: int):
        _lib.reduce(send, recv, count, int(dtype), int(op), root, self._comm._check())

    def broadcast(self, buf: int, count: int, dtype, root: int):
        _lib.broadcast(buf, count, int(dtype), root, self._comm._check())

    def allgather(self, send: int, recv: int, count: int, dtype):
        _lib.allgather(send, recv, count, int(dtype), self._comm._check())

    def allgatherv(self, send: int, sendcount: int, recv: int, counts: Sequence[int],
                   displs: Sequence[int], dtype):
        _lib.allgatherv(send, sendcount, recv, counts, displs, int(dtype), self._comm._check())

    def reduce_scatter(self, send: int, recv: int, recvcount: int, dtype, op):
        _lib.reduce_scatter(send, recv, recvcount, int(dtype), int(op), self._comm._check())

    def alltoall(self, send: int, recv: int, count_per_peer: int, dtype):
        _lib.alltoall(send, recv, count_per_peer, int(dtype), self._comm._check())

    def alltoallv(self, send: int, sendcounts: Sequence[int], sdispls: Sequence[int], recv: int,
                  recvcounts: Sequence[int], rdispls: Sequence[int], dtype):
        _lib.alltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls, int(dtype), self._comm._check())

    def gatherv(self, send: int, sendcount: int, recv: int, counts: Sequence[int],
                displs: Sequence[int], dtype, root: int):
        """counts/displs matter on root only (pass [] elsewhere)."""
        _lib.gatherv(send, sendcount, recv, counts, displs, int(dtype), root, self._comm._check())

    def scatterv(self, send: int, counts: Sequence[int], displs: Sequence[int], recv: int,
                 recvcount: int, dtype, root: int):
        """counts/displs matter on root only (pass [] elsewhere)."""
        _lib.scatterv(send, counts, displs, recv, recvcount, int(dtype), root, self._comm._check())

    def barrier(self):
        _lib.barrier(self._comm._check())

    def send(self, buf: int, count: int, dtype, dest: int, tag: int):
        _lib.send(buf, count, int(dtype), dest, tag, self._comm._check())

    def isend(self, buf: int, count: int, dtype, dest: int, tag: int, keep: Buffer) -> Request:
        """Post a send; the Request holds keep until it completes."""
        q = _lib.isend(buf, count, int(dtype), dest, tag, self._comm._check())
        return Request(self._comm, q, [keep])

    def irecv(self, buf: int, count: int, dtype, source: int, tag: int, keep: Buffer) -> Request:
        """Post a receive; on success the Request calls keep.finish() (its
        write-back) and its Status counts elements of keep.itemsize."""
        q = _lib.irecv(buf, count, int(dtype), source, tag, self._comm._check())
        return Request(self._comm, q, [keep], recv_buf=keep)

    def allreduce_multi(self, addrs: Sequence[int], counts: Sequence[int], dtype, op, bucket_bytes: int = 0):
        """In place over each (addrs[i], counts[i]), all of dtype: nexar_allreduce_multi."""
        _lib.allreduce_multi(addrs, counts, int(dtype), int(op), bucket_bytes, self._comm._check())

    def allreduce_compressed(self, buf: int, residual: int, count: int, dtype, method: int, ratio: float,
                             seed: int):
        """In place on (buf, count) float32; residual 0 for none: nexar_allreduce_compressed."""
        _lib.allreduce_compressed(buf, residual, count, int(dtype), method, ratio, seed, self._comm._check())

    # Collectives started in the library, returning the raw request handle (also
    # tensor_method's started calls):
    # the caller keeps the memory valid until the request completes, then
    # frees the handle (wait_raw/test_raw, free_raw). For callers that
    # manage their own completion objects (the torch backend's Work).

    def iallreduce_multi_raw(self, addrs: Sequence[int], counts: Sequence[int], dtype: int, op: int,
                             bucket_bytes: int = 0) -> int:
        return _lib.iallreduce_multi(addrs, counts, dtype, op, bucket_bytes, self._comm._check())

    def tensor_method(self, kind: str, group, gate: "TensorGate", slow: str):
        """A torch ProcessGroup's collective method in C, to set as an
        attribute of group (torch's trampoline finds it before the class's
        method): called as method(tensors, opts=None). One plain torch
        tensor (dense, contiguous, on the CPU; for "allreduce" of a dtype
        and op set_tensor_kinds lists) while gate.blocked is 0 is reduced
        ("allreduce") or broadcast ("broadcast") in place on this Comm in
        one C call, reading torch's options object: done synchronously
        (opts.asyncOp false), it returns None; started, it returns
        group._started_work(kind, tensors, raw request); failed,
        group._failed(kind, tensors, error). Everything else goes to
        getattr(group, slow)(tensors, opts). group is held weakly. For
        nexar.torch."""
        return _lib.torch_method(kind, self._comm._check(), gate, group, slow)

    @staticmethod
    def wait_raw(h: int) -> None:
        """Wait (GIL released, the communicator's timeout applies) for a raw
        request; raises its nexar.Error."""
        _lib.wait(h)

    @staticmethod
    def wait_free_raw(h: int) -> None:
        """wait_raw, then free_raw (also when the wait raises)."""
        _lib.wait_free(h)

    @staticmethod
    def test_raw(h: int) -> bool:
        """True once the raw request completed (raises its error then)."""
        return _lib.test(h)

    @staticmethod
    def free_raw(h: int) -> None:
        _lib.request_free(h)


# TensorGate: blocked > 0 sends a group's RawComm.tensor_method calls to
# its general method (the group counts what forbids the fast path).
TensorGate = _lib.TorchGate


def set_tensor_kinds(dtypes: dict, ops: dict, strided, sum_op, hugepage_min: int = 4 << 20) -> None:
    """What RawComm.tensor_method's calls take as they are:
    dtypes {torch.dtype: Datatype}, ops {torch ReduceOp.RedOpType: Op} (an
    op not listed is staged by the caller; sum_op is the one for Op.SUM),
    and torch.strided. A tensor of hugepage_min bytes or more that those
    calls see a second time is moved onto transparent huge pages, once
    (0: never; docs/torch-compat.md). Call once, before them (nexar.torch
    does, on import)."""
    _lib.torch_kinds_set({k: int(v) for k, v in dtypes.items()}, {int(k): int(v) for k, v in ops.items()}, strided,
                         sum_op, int(hugepage_min))


def _finish(bufs: Sequence[Buffer], out):
    """Write back what a blocking call produced; return its result object."""
    for b in bufs:
        b.finish()
    return out


def _dt(s: Buffer, r: Buffer):
    return s.raw()[1] if s.dtype is not None else Datatype.UINT8


def _counts_displs(counts, displs, size, what):
    if counts is None or len(counts) != size:
        raise ValueError(f"nexar: {what}: counts must have {size} entries")
    counts = [int(c) for c in counts]
    if displs is None:
        displs, off = [], 0
        for c in counts:
            displs.append(off)
            off += c
    elif len(displs) != size:
        raise ValueError(f"nexar: {what}: displacements must have {size} entries")
    return counts, [int(d) for d in displs]


class Seed:
    """A rendezvous seed started by this process (start_seed). addr is the
    "host:port" it listens on; pass it as every rank's seed. close() stops
    it (idempotent); keep it open while the communicator formed through it
    is in use, as rank 0's embedded seed is."""

    def __init__(self, handle: int, addr: str):
        self._h = handle
        self.addr = addr

    def close(self):
        h, self._h = self._h, 0
        if h:
            _lib.seed_close(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def start_seed(bind_addr: str, world_size: int, token) -> Optional[Seed]:
    """Start a seed for world_size ranks holding token on bind_addr
    ("host:0" picks a free port, with no window in which another process
    can take it). Returns None when the loaded libnexar has no such call
    (then the caller must pick the port itself)."""
    start = getattr(_lib, "seed_start", None)
    if start is None:
        return None
    if isinstance(token, str):
        token = token.encode()
    h, addr = start(bind_addr, int(world_size), bytes(token))
    return Seed(h, addr)


def init(**config) -> Comm:
    """Create the world communicator from the launcher's environment
    (or from explicit keyword arguments, see Comm)."""
    return Comm(**config)
