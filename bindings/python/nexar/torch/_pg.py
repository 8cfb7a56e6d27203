"""ProcessGroupNexar: a Python torch.distributed ProcessGroup over nexar.Comm.

Design (see reference/torch-backend.md):

- Rendezvous (_rendezvous.py) goes through the Store torch hands the
  creator; each group is one nexar.Comm, called through its raw-pointer
  entry points (Comm.raw) with tensors staged by _staging.py.
- The common case (one contiguous CPU tensor of a dtype and op libnexar
  takes as it is: all_reduce, broadcast) starts in the library from the
  caller's thread with the non-blocking C ABI (the Go runtime is the
  worker) and returns a StartedWork: wait() waits in C with the GIL
  released, and no Python thread is involved unless get_future() is asked
  for (one Completer thread per group completes those futures).
- Every other collective runs in issue order on one worker thread per
  group (_work.py WorkQueue), calling the blocking C ABI with the GIL
  released. A collective takes the fast path only while that queue is
  idle, so every rank issues collectives in the same order.
- Point-to-point operations are posted at once in the caller's thread with
  the non-blocking C ABI (so (source, tag) order is the program's order) and
  are waited for on a helper thread each.
- CUDA tensors (_cuda.py): every collective is ordered at issue on torch's
  current stream, runs on the worker on a side stream of the group's, and
  its Work's wait() makes the current stream wait (no host block).
- Work objects are a Work subclass (NexarWork): wait() raises the
  operation's error (the future-wrapping Work of torch swallows it),
  get_future() carries the result, or the error as a failed Future that DDP
  and other C++ readers see failed.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import sys
import threading
import time
import weakref
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

from .. import _comm, _errors, _knobs
from ._options import Options, comm_kwargs
from .._types import AVG, BAND, BOR, BXOR, SUM, Datatype
from ._rendezvous import advertise_host, rendezvous
from ._staging import (_OPS, BYTE, Reduction, Staged, bytes_cat, copy_blocks, flat_cat, nbytes, offsets,
                       op_of, reduction_error, tag64)
from ._cuda import CudaBatchWork, CudaOps, CudaWork, Side, is_cuda, stream_dtype
from ._work import Completer, DoneWork, NexarWork, StartedWork, WorkQueue, complete_in_thread, run_now


def _close_at_exit(comm, queue, completer, seed):
    """Close what a group left open (weakref.finalize: at exit, or when the
    group is collected undestroyed). The communicator first, so that a
    worker blocked in a call returns (closed), then the workers, briefly."""
    try:
        comm.close()
    except Exception:  # noqa: BLE001 - nothing to report to at exit
        pass
    queue.close(timeout=5)
    completer.close(timeout=5)
    if seed is not None:
        seed.close()


# Tensors libnexar reduces as they are (no staging): dtype -> nexar dtype.
_FAST_DT = {
    torch.float32: int(Datatype.FLOAT32), torch.float64: int(Datatype.FLOAT64),
    torch.float16: int(Datatype.FLOAT16), torch.bfloat16: int(Datatype.BFLOAT16),
    torch.int8: int(Datatype.INT8), torch.uint8: int(Datatype.UINT8),
    torch.int32: int(Datatype.INT32), torch.int64: int(Datatype.INT64),
}
_FLOAT_DT = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def _hugepage_min(v: str) -> int:
    """NEXAR_TORCH_HUGEPAGE_MIN: the smallest tensor (bytes, suffixes K, M,
    G) moved onto huge pages on its second all_reduce or broadcast; 0 turns
    it off; unset: 4 MiB."""
    v = v.strip().upper()
    if not v:
        return 4 << 20
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
    try:
        n = int(v[:-1] if mult > 1 else v) * mult
    except ValueError:
        raise ValueError(f"nexar: NEXAR_TORCH_HUGEPAGE_MIN={v!r}: want a byte count such as 4M, or 0") from None
    if n < 0:
        raise ValueError(f"nexar: NEXAR_TORCH_HUGEPAGE_MIN={v!r}: want a byte count such as 4M, or 0")
    return n


# What RawComm.tensor_method's calls take as they are
# (PREMUL_SUM is not among the ops: it is staged).
_comm.set_tensor_kinds(_FAST_DT, _OPS, torch.strided, dist.ReduceOp.SUM,
                       _hugepage_min(_knobs.env("NEXAR_TORCH_HUGEPAGE_MIN") or ""))


def _plain(t) -> bool:
    """A dense, contiguous CPU tensor that libnexar can use in place."""
    return (t.layout == torch.strided and t.device.type == "cpu" and t.is_contiguous()
            and not t.is_conj() and not t.is_neg())

__all__ = ["ProcessGroupNexar", "NexarWork"]

_INT64 = int(Datatype.INT64)


class _Unconfigured:
    """The communicator of a group made without a store (torchft makes its
    groups before the first quorum), until configure() or reconfigure()
    replaces it: every call fails at once naming what is missing."""

    closed = False
    error = None

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def check(self) -> None:
        raise _errors.UnavailableError(
            _errors.UnavailableError.code,
            "nexar: this process group has no communicator yet: it was made without a store; "
            "call configure(store_addr, ...) or reconfigure(opts) first (torchft's Manager does at its first quorum)")

    @property
    def raw(self) -> "_Unconfigured":
        return self

    def __getattr__(self, name):
        # Any other entry point (of Comm or of its raw calls) is a call.
        if name.startswith("_"):
            raise AttributeError(name)
        self.check()

    def tensor_method(self, kind, group, gate, slow):
        # No C fast path: torch's trampoline gets the general method, whose
        # first step (check) raises.
        ref = weakref.ref(group)
        return lambda tensors, opts=None: getattr(ref(), slow)(tensors, opts)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class ProcessGroupNexar(dist.ProcessGroup):
    """torch.distributed backend "nexar" (CPU tensors, and CUDA tensors for
    every collective, asynchronous on streams: _cuda.py).

    Created by torch through the registered creator; one nexar.Comm per
    group. Methods are called by torch from any thread; collectives are
    queued to one worker thread in call order.
    """

    # torch then brackets coalesced work with _start_coalescing and
    # _end_coalescing (batch_isend_irecv, _coalescing_manager with a device).
    supports_coalescing = True

    def __init__(self, store=None, rank: int = 0, size: int = 1, timeout: timedelta = timedelta(minutes=30),
                 group_id: str = "", _comm_: Optional[_comm.Comm] = None, options: Optional[Options] = None):
        super().__init__(rank, size)
        self._options = options  # pg_options: nexar.torch.Options (knobs), or None
        self._rank_ = rank
        self._size_ = size
        self._group_id = group_id
        self._store = store
        self._timeout = timeout
        self._token: Optional[bytes] = None  # the job's secret, when this group knows it (join_token)
        if _comm_ is not None:
            # from_comm, split_group: the communicator exists already; no
            # rendezvous, no seed of its own
            self._seed = None
            self._comm = _comm_
        elif store is None:
            # torchft's way: made before any quorum exists; configure() or
            # reconfigure() makes the communicator, until then every call
            # fails naming that
            self._seed = None
            self._comm = _Unconfigured(rank, size)
        else:
            rv = rendezvous(store, rank, size)
            self._seed = rv.seed
            self._token = rv.token
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
            try:
                self._comm = _comm.Comm(rank=rank, world_size=size, seed=rv.seed_addr, token=rv.token,
                                        advertise_addr=rv.advertise_host, **comm_kwargs(options, secs))
            except BaseException:
                if self._seed is not None:
                    self._seed.close()
                raise
        self._raw = self._comm.raw
        # What of CUDA the CUDA tensor path uses (_cuda.py); tests without
        # a GPU put a stand-in over the fake CUDA runtime here.
        self._cuda = CudaOps()
        self._sides = {}  # CUDA device -> Side (_cuda.py)
        self._sides_mu = threading.Lock()
        self._closed = False
        self._coalescing: Optional[list] = None
        # Open (0) while a collective may start in the caller's thread: no
        # queued one still to run (issue order), no batch being coalesced,
        # not shut down. The C fast paths read it (_install_fast).
        self._gate = _comm.TensorGate()
        self._queue = WorkQueue(f"nexar-pg-{group_id or 'x'}-r{rank}", self._gate)
        self._completer = Completer(f"nexar-pg-{group_id or 'x'}-r{rank}-futures")
        # A group the program never destroyed is closed at interpreter exit,
        # before torch tears down: its peers see a goodbye at once instead
        # of waiting out the heartbeat, and no worker thread of ours is
        # still inside the library while the interpreter finalizes.
        self._at_exit = weakref.finalize(self, _close_at_exit, self._comm, self._queue, self._completer, self._seed)
        self._install_fast()

    def _install_fast(self):
        """all_reduce and broadcast of one plain CPU tensor, decided and
        made in C (RawComm.tensor_method) as this group's attributes, which
        torch's ProcessGroup trampoline calls instead of the class's
        methods: no Python frame between torch and libnexar, no Work for a
        synchronous call done (docs/performance.md, "The torch path").
        What they do not take goes to _allreduce_general and
        _broadcast_general, the class's methods."""
        self.allreduce = self._raw.tensor_method("allreduce", self, self._gate, "_allreduce_general")
        self.broadcast = self._raw.tensor_method("broadcast", self, self._gate, "_broadcast_general")

    @classmethod
    def from_comm(cls, comm: _comm.Comm, group_id: str = "") -> "ProcessGroupNexar":
        """A group over an existing nexar.Comm, which it then owns (shutdown
        closes it): the survivors' communicator after a shrink, or one made
        by nexar directly. Pass it to DDP as ``process_group=``; it is not
        registered with torch.distributed's group table."""
        return cls(None, comm.rank, comm.size, group_id=group_id, _comm_=comm)

    def shrink(self) -> "ProcessGroupNexar":
        """The survivors' group, after a member failed (every live member
        calls it, typically when a collective raised PeerDownError or
        RevokedError): the live members agree on who failed, and a new group
        of the others is returned, ranked in this group's order, on the
        connections that exist. This group is revoked; shut it down when
        done with it. Needs the failure policy "manual" or "shrink"
        (NEXAR_ON_FAILURE). The way torchft reconfigures its groups: build
        the model's DDP again on the new group."""
        pg = ProcessGroupNexar.from_comm(self._comm.shrink(), group_id=f"{self._group_id}-shrunk")
        pg._token = self._token
        return pg

    def grow(self) -> "ProcessGroupNexar":
        """The grown group: this group's live members, in order, then the
        processes waiting to join (started with ``ProcessGroupNexar.join``,
        e.g. replacements for lost ranks), at most NEXAR_MAX_WORLD_SIZE.
        Every live member calls it at the same step; with nobody waiting it
        is a group of the live members. Build DDP again on it (DDP's
        constructor broadcasts the model from rank 0 to the joiners). Shut
        this group down when done with it."""
        pg = ProcessGroupNexar.from_comm(self._comm.grow(), group_id=f"{self._group_id}-grown")
        pg._token = self._token
        return pg

    @classmethod
    def join(cls, addrs=None, *, token=None, timeout=None, group_id: str = "") -> "ProcessGroupNexar":
        """This process's group in a running job, once its members grow:
        see nexar.Comm.join (addrs default NEXAR_SEED, the members' lobby
        addresses; token default NEXAR_TOKEN)."""
        pg = cls.from_comm(_comm.Comm.join(addrs, token=token, timeout=timeout), group_id=group_id)
        if token is not None:
            pg._token = token.encode() if isinstance(token, str) else bytes(token)
        return pg

    # ---- in-place reconfiguration (torchft's way) -----------------------
    # Made by get_reconfigure_handle (torch 2.15's reconfigure API).
    _rc_store = None
    _rc_host = ""
    _rc_id: Optional[str] = None

    def rank(self) -> int:
        return self._rank_

    def size(self) -> int:
        return self._size_

    def _adopt(self, comm: _comm.Comm, seed=None, token: Optional[bytes] = None) -> None:
        """Make this group stand for comm from now on (in place): the work
        queued on the old communicator runs out first, then the old one is
        closed. rank() and size() follow; C++ code that read them before
        (DDP's reducer) keeps the old values, so build DDP again."""
        deadline = time.monotonic() + 60
        while not self._queue.idle() and time.monotonic() < deadline:
            time.sleep(0.001)
        old, old_seed = self._comm, self._seed
        self._comm, self._raw, self._seed = comm, comm.raw, seed
        self._install_fast()
        self._rank_, self._size_ = comm.rank, comm.size
        if token is not None:
            self._token = token
        self._at_exit.detach()
        self._at_exit = weakref.finalize(self, _close_at_exit, self._comm, self._queue, self._completer, self._seed)
        try:
            old.close()
        except _errors.Error:
            pass
        if old_seed is not None:
            old_seed.close()

    def shrink_(self) -> "ProcessGroupNexar":
        """shrink(), in place: this group becomes the survivors' group
        (every live member calls it). Returns self."""
        self._adopt(self._comm.shrink())
        return self

    def grow_(self) -> "ProcessGroupNexar":
        """grow(), in place: this group becomes the grown group (every live
        member calls it). Returns self."""
        self._adopt(self._comm.grow())
        return self

    def configure(self, store_addr: str, *args, **kwargs) -> None:
        """Rebuild this group in place among the processes a coordinator
        chose, the way torchft reconfigures its process groups each quorum:
        ``configure(store_addr, rank, world_size)`` (or torchft's newer
        ``configure(store_addr, replica_id, rank, world_size, ...)``; the
        other arguments are not used). store_addr is ``host:port`` of a
        torch TCPStore, optionally ``/prefix`` (a new prefix per quorum);
        every process of the new group calls it with its rank. The nexar
        rendezvous runs through that store (its rank 0 starts the seed), the
        old communicator is closed, and the group carries on with the new
        one."""
        if len(args) == 2:
            rank, world_size = args
        elif len(args) >= 3:
            rank, world_size = args[1], args[2]
        else:
            rank, world_size = kwargs.get("rank"), kwargs.get("world_size")
        if rank is None or world_size is None:
            raise TypeError("nexar: configure(store_addr, rank, world_size): rank and world_size are required")
        rank, world_size = int(rank), int(world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"nexar: configure: rank {rank} is out of range for world size {world_size}")
        hostport, _, prefix = store_addr.partition("/")
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"nexar: configure: store address {store_addr!r} is not host:port[/prefix]")
        store = dist.TCPStore(host.strip("[]"), int(port), is_master=False, wait_for_workers=False,
                              timeout=self._timeout)
        if prefix:
            store = dist.PrefixStore(prefix, store)
        self._configure_on(store, rank, world_size, self._timeout)

    def _configure_on(self, store, rank: int, size: int, timeout) -> None:
        """configure() and reconfigure(): the nexar rendezvous through store
        (its rank 0 starts the seed), then this group adopts the new
        communicator. The store is kept (get_group_store, split_group)."""
        rv = rendezvous(store, rank, size)
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        try:
            comm = _comm.Comm(rank=rank, world_size=size, seed=rv.seed_addr, token=rv.token,
                              advertise_addr=rv.advertise_host, **comm_kwargs(self._options, secs))
        except BaseException:
            if rv.seed is not None:
                rv.seed.close()
            raise
        self._store = store
        self._adopt(comm, rv.seed, rv.token)

    # ---- torchft and torch 2.15's reconfigure API ---------------------------
    def errored(self) -> Optional[Exception]:
        """The failure this group's communicator recorded (a member lost,
        an abort, a timeout: the sticky error every later call raises), or
        None while it is healthy, not configured yet, or shut down on
        purpose. torchft asks at every commit and reconfigures the group on
        an error."""
        c = self._comm
        if self._closed or c.closed:
            return None
        try:
            return c.error
        except _errors.Error as e:  # used in a forked child
            return e

    def get_error(self):
        """errored() as a C++ backend's get_error() answers it (torchft's
        development Manager asks a group that is not its own subclass so):
        a torch ErrorType."""
        ErrorType = torch._C._distributed_c10d.ErrorType
        e = self.errored()
        if e is None:
            return ErrorType.SUCCESS
        if isinstance(e, _errors.TimeoutError):
            return ErrorType.TIMEOUT
        if isinstance(e, (_errors.PeerDownError, _errors.RevokedError)):
            return ErrorType.REMOTE_ERROR
        return ErrorType.COMM_ERROR

    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        """torch 2.15's reconfigure handshake: this group's handle, which
        the processes of the next configuration exchange out of band
        (torchft's lighthouse does) and pass to reconfigure() in a list.
        JSON: a random id of this group object and host:port of a TCPStore
        this group serves (started on the first call, on this rank's
        advertised host), where the next rendezvous runs when this handle
        comes first."""
        if self._rc_store is None:
            host = advertise_host()
            store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=self._timeout)
            self._rc_store, self._rc_host, self._rc_id = store, host, secrets.token_hex(16)
        host = f"[{self._rc_host}]" if ":" in self._rc_host else self._rc_host
        return json.dumps({"nexar": 1, "id": self._rc_id, "store": f"{host}:{self._rc_store.port}"})

    def reconfigure(self, opts) -> NexarWork:
        """Rebuild this group in place among the groups whose handles
        (get_reconfigure_handle) opts.handles lists: a list ranks them by
        position, a set in sorted order (the same on every process). The
        nexar rendezvous runs on the first handle's store under a prefix of
        opts.uuid (fresh for each configuration); opts.timeout bounds it
        (default the group's). Returns a completed Work: the group is
        usable when this returns; a failure raises here."""
        handles = opts.handles
        if isinstance(handles, (set, frozenset)):
            handles = sorted(handles)
        handles = list(handles)
        if self._rc_id is None:
            raise ValueError("nexar: reconfigure: this group's handle is not among opts.handles "
                             "(it has not made one: call get_reconfigure_handle() first)")
        try:
            peers = [json.loads(h) for h in handles]
            ids = [p["id"] for p in peers]
            host, _, port = peers[0]["store"].rpartition(":")
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(f"nexar: reconfigure: opts.handles {handles!r} are not nexar reconfigure handles "
                             f"(get_reconfigure_handle): {e}") from None
        if self._rc_id not in ids:
            raise ValueError(f"nexar: reconfigure: this group's handle (id {self._rc_id}) is not among "
                             f"the {len(ids)} of opts.handles")
        timeout = opts.timeout if opts.timeout is not None else self._timeout
        store = dist.TCPStore(host.strip("[]"), int(port), is_master=False, wait_for_workers=False, timeout=timeout)
        self._configure_on(dist.PrefixStore(f"nexar-reconfigure/{int(opts.uuid)}", store), ids.index(self._rc_id),
                           len(ids), timeout)
        return DoneWork(None, "reconfigure", None)

    @property
    def join_token(self) -> Optional[bytes]:
        """The job's secret, which a process started to join needs (its
        NEXAR_TOKEN): the one init_process_group drew, else None (a group
        made from an existing Comm: the job's token is the one it was made
        with). Hand it only to processes of this job."""
        return self._token

    @property
    def join_addrs(self):
        """Where a process started later joins this group's job (its live
        members' lobby addresses)."""
        return self._comm.join_addrs

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

    # ---- torch 2.x: store, split_group -----------------------------------
    # A Python group has no C++ backend registered on it, so the C++ base
    # answers "no store" (and "no devices": _device_types, below, answers
    # [cpu]); torch's split_group reads both, so answer for the group.
    def get_group_store(self):
        return self._store

    @property
    def supports_splitting(self):
        return True

    def comm_split_count(self):
        """Groups split from this one so far (torch names them with it)."""
        return self._splits

    _splits = 0

    def split_group(self, new_ranks, timeout=None, opts=None, group_name=None, group_desc=None,
                    device_types=None):
        """dist.split_group: every rank of this group calls it, with its own
        split's ranks (this group's ranks, in the new group's order); a rank
        in none passes another's and gets None. One nexar Comm.split, run
        after this group's queued collectives."""
        ranks = [int(r) for r in new_ranks]
        if len(set(ranks)) != len(ranks) or any(r < 0 or r >= self._size_ for r in ranks):
            raise ValueError(f"nexar: split_group: ranks {ranks} are not distinct ranks of a group of {self._size_}")
        if self._rank_ in ranks:
            color, key = min(ranks), ranks.index(self._rank_)
        else:
            color, key = _comm.UNDEFINED, 0
        out = []
        self._enqueue("split_group", None, lambda: out.append(self._comm.split(color, key))).wait()
        self._splits += 1
        child = out[0] if out else None
        if child is None:
            return None
        name = group_name or f"{self._nexar_group_name or self._group_id}:split:{self._splits}"
        store = dist.PrefixStore(f"nexar-split/{name}/", self._store) if self._store is not None else None
        pg = ProcessGroupNexar(store, child.rank, child.size, timeout or self._timeout, group_id=name,
                               _comm_=child)
        pg._set_group_name(name)
        if group_desc:
            pg._set_group_desc(group_desc)
        return pg

    def __repr__(self):
        return f"<ProcessGroupNexar rank={self._rank_} size={self._size_} group={self._group_id!r}>"

    # ---- lifecycle --------------------------------------------------------
    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        self._gate.blocked += 1
        self._at_exit.detach()
        self._queue.close(timeout=60)
        try:
            self._comm.close()
        except _errors.Error:
            pass
        self._completer.close(timeout=60)  # its waits ended with the communicator
        if self._seed is not None:
            self._seed.close()

    def abort(self):
        if not self._closed:
            try:
                self._comm.abort()
            except _errors.Error:
                pass
        self.shutdown()

    def __del__(self):
        try:
            if not self._closed:
                self._comm.check()  # not in a forked child
                self._closed = True
                self._queue.stop()
        except Exception:
            pass

    # ---- plumbing ------------------------------------------------------------
    def _enqueue(self, name: str, result, fn) -> NexarWork:
        if self._closed:
            raise _errors.ClosedError(7, f"nexar: {name} on a process group that was shut down")
        self._comm.check()
        w = NexarWork(result, name)
        if self._queue.on_worker():
            # The host part of a CUDA operation staged on the worker: the
            # CPU implementation runs here (queued behind itself, it would
            # never run).
            return run_now(fn, w)
        self._queue.submit(fn, w)
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    def _fast(self) -> bool:
        """Whether a collective may start in the caller's thread now: no
        queued one is still to run (issue order) and no batch is being
        coalesced."""
        return not self._closed and self._coalescing is None and self._queue.idle()

    # A synchronous call (opts.asyncOp false: torch waits at once) runs in
    # the caller's thread, with the GIL released in C: no thread hand-off
    # and no request. Done, it returns no Work at all: torch's collectives
    # (those that pass asyncOp, torch >= 2.7) then skip the wait ("the
    # backend has sync'ed"), which saves making a Work and calling back
    # into Python for its wait(). A failure returns a failed Work, whose
    # wait() raises it.

    def _now(self, name: str, result, call) -> Optional[NexarWork]:
        """Run call() here (a synchronous call): None when it succeeded."""
        self._comm.check()
        try:
            call()
        except _errors.Error as e:
            return DoneWork(result, name, e)
        return None

    def _started_work(self, name: str, tensors, h: int) -> NexarWork:
        """The Work of a C fast path's operation started in the library
        (raw request h) on tensors[0]."""
        return StartedWork(tensors, name, self._raw, h, tensors[0], self._completer)

    def _failed(self, name: str, tensors, e: BaseException) -> NexarWork:
        """The Work of a fast path's call that failed with e; a forked
        child or a closed group raises at once instead, as the other paths
        do."""
        self._comm.check()
        return DoneWork(tensors, name, e)

    def _started(self, name: str, result, start, keep, finish=None) -> NexarWork:
        """A Work for an operation start() begins in the library (it returns
        the raw request handle); an error in starting it is the Work's."""
        self._comm.check()
        try:
            h = start()
        except _errors.Error as e:
            w = NexarWork(result, name)
            w._complete(e)
            return w
        return StartedWork(result, name, self._raw, h, keep, self._completer, finish)

    def _root(self, opts) -> int:
        return opts.rootRank if opts is not None else 0

    @staticmethod
    def _count(name: str, tensors, n: int) -> None:
        """Checked at issue for CUDA tensors (the host part runs later)."""
        if len(tensors) != n:
            raise ValueError(f"nexar: {name} needs {n} tensors in each list, got {len(tensors)}")

    # ---- CUDA tensors (_cuda.py, docs/device-memory.md) --------------------------
    def _side(self, dev) -> Side:
        """This group's streams for CUDA device dev (made at first use)."""
        side = self._sides.get(dev)
        if side is None:
            with self._sides_mu:
                side = self._sides.get(dev)
                if side is None:
                    side = self._sides[dev] = Side(self._cuda, dev)
        return side

    def _on_cuda(self, name: str, result, dev, body) -> CudaWork:
        """Issue a collective on CUDA tensors of device dev and return its
        Work at once. body(stream, hold) runs on the worker, in issue
        order, and queues the operation on the side stream (ordered at
        issue after the current stream's work); what it puts in hold lives
        until the side stream has passed the operation. Then the
        operation's number goes into the side's word, which opens the
        completion event recorded now (_cuda.py)."""
        if self._closed:
            raise _errors.ClosedError(7, f"nexar: {name} on a process group that was shut down")
        self._comm.check()
        ops = self._cuda
        side = self._side(dev)
        issued = ops.record(ops.stream(dev), dev)
        with side.lock:
            side.seq = k = (side.seq + 1) & 0xFFFFFFFF
            done = None
            if side.gated:
                if ops.wait_word(side.done, side.word, k):
                    done = ops.record(side.done, dev)
                else:
                    side.gated = False  # no stream memory operations: wait() waits on the host
            w = CudaWork(result, name, ops, dev, done, side.done)

            def fn():
                hold = []
                try:
                    # Here, not at issue: the side stream must hold all of
                    # the operations before this one first. Waiting at
                    # issue would put this wait ahead of their work, and a
                    # current stream that waited for them before this
                    # issue would never get there (a cycle).
                    ops.stream_wait(side.stream, issued, dev)
                    body(side.stream, hold)
                finally:
                    # Also after a failure: copies queued so far must end
                    # before hold goes, and the word must move on.
                    try:
                        after = ops.record(side.stream, dev)
                        ops.synchronize(after)
                        w._after = after
                    finally:
                        ops.set_word(side.word, k)
            self._queue.submit(fn, w)
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    def _staged_cuda(self, dev, ins, outs, call):
        """The body (_on_cuda) of an operation staged here: ins copied to
        pinned host tensors on the side stream, call(h) runs the CPU
        implementation on the worker (h(t): t's host tensor), outs copied
        back. A tensor may be in both."""
        ops = self._cuda

        def body(stream, hold):
            hosts = {}
            for t in (*ins, *outs):
                if id(t) not in hosts:
                    hosts[id(t)] = ops.host_like(t)
            hold.append(hosts)
            copied = set()
            for t in ins:
                if id(t) not in copied:
                    copied.add(id(t))
                    ops.d2h(hosts[id(t)], t, stream)
            if copied:
                ops.synchronize(ops.record(stream, dev))
            w = call(lambda t: hosts[id(t)])
            if w is not None:
                w.wait()
            copied = set()
            for t in outs:
                if id(t) not in copied:
                    copied.add(id(t))
                    ops.h2d(t, hosts[id(t)], stream)
        return body

    def _p2p_cuda(self, name, t, peer, tag, recv) -> dist.Work:
        """A send or receive of a CUDA tensor on a helper thread (a receive
        must not block the caller, who may send next), on a side stream of
        its own ordered after the current stream's work at issue; its
        completion gated as a collective's (_on_cuda), by a word of its own
        on the group's completion stream for sends and receives."""
        if not t.is_contiguous():
            raise ValueError(f"nexar: {name}: CUDA tensors must be contiguous")
        self._comm.check()
        ops, dev = self._cuda, t.device
        dt = stream_dtype(t, _FAST_DT)
        a, tg = t.data_ptr(), tag64(tag)
        n = t.numel() if dt is not None else t.numel() * t.element_size()
        if dt is None:
            dt = BYTE  # other dtypes move as bytes
        side = self._side(dev)
        issued = ops.record(ops.stream(dev), dev)
        with side.lock:
            p = side.p2p.pop() if side.p2p else ops.new_stream(dev)
            word = side.words.pop() if side.words else [ops.word(dev), 0]
            word[1] = v = (word[1] + 1) & 0xFFFFFFFF
            done = None
            if side.gated:
                if ops.wait_word(side.p2p_done, word[0], v):
                    done = ops.record(side.p2p_done, dev)
                else:
                    side.gated = False
            w = CudaWork([t], name, ops, dev, done, side.p2p_done)

        def fn():
            try:
                ops.stream_wait(p, issued, dev)
                if recv:
                    self._raw.recv_stream(a, n, dt, int(peer), tg, p)
                else:
                    self._raw.send_stream(a, n, dt, int(peer), tg, p)
            finally:
                try:
                    after = ops.record(p, dev)
                    ops.synchronize(after)
                    w._after = after
                finally:
                    ops.set_word(word[0], v)
                    with side.lock:
                        side.p2p.append(p)
                        side.words.append(word)
        complete_in_thread(f"nexar-{name}", fn, w)
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    def _reduce_ok(self, name: str, tensors, op):
        """Raise now what a reduction of tensors under op would raise in
        its host part (which runs later)."""
        for t in tensors:
            e = reduction_error(t.dtype, op)
            if e is not None:
                raise type(e)(f"{e} ({name})")

    def _stream_reduce(self, tensors, op, factor):
        """The nexar dtypes with which libnexar's stream-ordered reductions
        take tensors as they are, or None."""
        if factor is not None:
            return None
        dts = [stream_dtype(t, _FAST_DT) for t in tensors]
        if any(d is None for d in dts):
            return None
        return dts

    # ---- allreduce -------------------------------------------------------
    # all_reduce and broadcast of one plain CPU tensor go through C first
    # (_install_fast); these methods are what the C paths do not take.
    def allreduce(self, tensors, opts=None):
        op, factor = op_of(opts)
        raw = self._raw
        if is_cuda(tensors):
            return self._allreduce_cuda("allreduce", tensors, op, factor,
                                        lambda h: self.allreduce([h(t) for t in tensors], opts))

        def fn():
            for t in tensors:
                if t.is_sparse:
                    self._sparse_allreduce(t, op)
                    continue
                r = Reduction(t, op, factor)
                raw.allreduce(r.addr, r.addr, r.count, r.dt, r.op)
                r.s.back()
        return self._enqueue("allreduce", tensors, fn)

    def _allreduce_cuda(self, name, tensors, op, factor, staged):
        """allreduce and allreduce_coalesced of CUDA tensors: libnexar's
        stream-ordered allreduce per tensor where it takes them as they are,
        else staged(h) (the CPU method on host copies)."""
        self._reduce_ok(name, tensors, op)
        dev, raw = tensors[0].device, self._raw
        dts = self._stream_reduce(tensors, op, factor)
        if dts is None:
            return self._on_cuda(name, tensors, dev, self._staged_cuda(dev, tensors, tensors, staged))
        args = [(t.data_ptr(), t.numel(), d) for t, d in zip(tensors, dts)]
        o = int(op)

        def body(stream, hold):
            for a, n, d in args:
                raw.allreduce_stream(a, a, n, d, o, stream)
        return self._on_cuda(name, tensors, dev, body)

    def _sparse_allreduce(self, t: torch.Tensor, op):
        """Sum of sparse COO tensors, as gloo does it: every rank gathers
        every rank's indices and values, concatenates and coalesces, so all
        ranks compute the same result. t is replaced in place."""
        if op != SUM:
            raise ValueError("nexar: sparse tensors are reduced with SUM only")
        raw = self._raw
        c = t.coalesce()
        idx, val = c.indices().contiguous(), c.values().contiguous()
        nnz = torch.tensor([idx.shape[1]], dtype=torch.int64)
        counts = torch.empty(self._size_, dtype=torch.int64)
        raw.allgather(nnz.data_ptr(), counts.data_ptr(), 1, _INT64)
        nnzs = counts.tolist()

        def gather(part: torch.Tensor, per_nnz: int, dims) -> torch.Tensor:
            # part: this rank's nnz entries, per_nnz bytes each; the result
            # is every rank's, in rank order, laid out the same way.
            es = part.element_size()
            sizes = [k * per_nnz for k in nnzs]
            displs, total = offsets(sizes)
            out = torch.empty(total // es, dtype=part.dtype)
            raw.allgatherv(part.data_ptr() if part.numel() else 0, part.numel() * es,
                           out.data_ptr() if total else 0, sizes, displs, BYTE)
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

    # ---- bucketed allreduce ----------------------------------------------------
    # all_reduce_coalesced and _coalescing_manager's captured all_reduces
    # arrive here: one bucketed call (nexar_allreduce_multi) per element
    # type instead of one collective per tensor. bucket_bytes (0: 25 MiB,
    # DDP's default) must be the same on every rank.
    bucket_bytes = 0

    def allreduce_coalesced(self, tensors, opts=None):
        op, factor = op_of(opts)
        raw, bucket = self._raw, int(self.bucket_bytes)
        if tensors and is_cuda(tensors):
            return self._allreduce_cuda("allreduce_coalesced", tensors, op, factor,
                                        lambda h: self.allreduce_coalesced([h(t) for t in tensors], opts))
        if tensors and factor is None and self._fast():
            dt = _FAST_DT.get(tensors[0].dtype)
            t0 = tensors[0].dtype
            if (dt is not None and all(t.dtype == t0 and _plain(t) for t in tensors)
                    and (op != AVG or t0 in _FLOAT_DT) and (op not in (BAND, BOR, BXOR) or t0 not in _FLOAT_DT)):
                addrs = [t.data_ptr() for t in tensors]
                counts = [t.numel() for t in tensors]
                o = int(op)
                if not getattr(opts, "asyncOp", True):
                    return self._now("allreduce_coalesced", tensors,
                                     lambda: raw.allreduce_multi(addrs, counts, dt, o, bucket))
                return self._started("allreduce_coalesced", tensors,
                                     lambda: raw.iallreduce_multi_raw(addrs, counts, dt, o, bucket), list(tensors))

        def fn():
            # Staged (non-contiguous, bool, small ints, complex, PREMUL_SUM):
            # grouped by what the C call takes, in order of first appearance.
            groups = {}
            staged = []
            for t in tensors:
                if t.is_sparse:
                    self._sparse_allreduce(t, op)
                    continue
                r = Reduction(t, op, factor)
                staged.append(r)
                g = groups.setdefault((r.dt, r.op), ([], []))
                g[0].append(r.addr)
                g[1].append(r.count)
            for (dt, o), (addrs, counts) in groups.items():
                raw.allreduce_multi(addrs, counts, dt, o, bucket)
            for r in staged:
                r.s.back()
        return self._enqueue("allreduce_coalesced", tensors, fn)

    # ---- broadcast / reduce ---------------------------------------------------
    def broadcast(self, tensors, opts=None):
        root = self._root(opts)
        raw = self._raw
        me = self._rank_
        if is_cuda(tensors):
            dev = tensors[0].device
            if not all(t.is_contiguous() for t in tensors):
                return self._on_cuda("broadcast", tensors, dev, self._staged_cuda(
                    dev, tensors if me == root else [], [] if me == root else tensors,
                    lambda h: self.broadcast([h(t) for t in tensors], opts)))
            args = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]

            def body(stream, hold):
                for a, n in args:
                    raw.broadcast_stream(a, n, BYTE, root, stream)
            return self._on_cuda("broadcast", tensors, dev, body)

        def fn():
            for t in tensors:
                s = Staged(t)
                raw.broadcast(s.addr, s.nbytes, BYTE, root)
                if me != root:
                    s.back()
        return self._enqueue("broadcast", tensors, fn)

    def reduce(self, tensors, opts=None):
        root = self._root(opts)
        op, factor = op_of(opts)
        raw = self._raw
        me = self._rank_
        if is_cuda(tensors):
            self._reduce_ok("reduce", tensors, op)
            dev = tensors[0].device
            return self._on_cuda("reduce", tensors, dev, self._staged_cuda(
                dev, tensors, tensors if me == root else [], lambda h: self.reduce([h(t) for t in tensors], opts)))

        def fn():
            for t in tensors:
                r = Reduction(t, op, factor)
                raw.reduce(r.addr, r.addr, r.count, r.dt, r.op, root)
                if me == root:
                    r.s.back()
        return self._enqueue("reduce", tensors, fn)

    # ---- allgather -------------------------------------------------------------
    def _allgather_into_list(self, outs: List[torch.Tensor], inp: torch.Tensor):
        n = self._size_
        if len(outs) != n:
            raise ValueError(f"nexar: allgather needs {n} output tensors, got {len(outs)}")
        s = Staged(inp, writable=False)
        sizes = [nbytes(o) for o in outs]
        if sizes[self._rank_] != s.nbytes:
            raise ValueError("nexar: allgather: output tensor for this rank does not match the input size")
        displs, total = offsets(sizes)
        tmp = torch.empty(total, dtype=torch.uint8)
        if all(x == sizes[0] for x in sizes):
            self._raw.allgather(s.addr, tmp.data_ptr(), s.nbytes, BYTE)
        else:
            self._raw.allgatherv(s.addr, s.nbytes, tmp.data_ptr(), sizes, displs, BYTE)
        copy_blocks(outs, tmp, displs, sizes)

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = [o for os_ in output_tensors for o in os_]
        if is_cuda([*input_tensors, *outs]):
            for os_ in output_tensors:
                self._count("allgather", os_, self._size_)
            dev = input_tensors[0].device
            return self._on_cuda("allgather", output_tensors, dev, self._staged_cuda(
                dev, input_tensors, outs,
                lambda h: self.allgather([[h(o) for o in os_] for os_ in output_tensors],
                                         [h(t) for t in input_tensors], opts)))

        def fn():
            for outs, inp in zip(output_tensors, input_tensors):
                self._allgather_into_list(outs, inp)
        return self._enqueue("allgather", output_tensors, fn)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        outs = [o for os_ in output_lists for o in os_]
        if is_cuda([*input_list, *outs]):
            self._count("allgather_coalesced", output_lists, self._size_)
            dev = input_list[0].device
            return self._on_cuda("allgather_coalesced", output_lists, dev, self._staged_cuda(
                dev, input_list, outs,
                lambda h: self.allgather_coalesced([[h(o) for o in os_] for os_ in output_lists],
                                                   [h(t) for t in input_list], opts)))

        def fn():
            for i, inp in enumerate(input_list):
                self._allgather_into_list([output_lists[r][i] for r in range(self._size_)], inp)
        return self._enqueue("allgather_coalesced", output_lists, fn)

    def _allgather_tensor(self, what: str, output: torch.Tensor, input: torch.Tensor):
        s, o = Staged(input, writable=False), Staged(output)
        if o.nbytes != self._size_ * s.nbytes:
            raise ValueError(f"nexar: {what}: output has {o.nbytes} bytes, expected {self._size_} x {s.nbytes}")
        self._raw.allgather(s.addr, o.addr, s.nbytes, BYTE)
        o.back()

    def _allgather_base(self, output, input, opts=None):
        if is_cuda([output, input]):
            return self._allgather_tensors_cuda("all_gather_into_tensor", [output], [input],
                                                lambda h: self._allgather_base(h(output), h(input), opts))
        return self._enqueue("_allgather_base", [output],
                             lambda: self._allgather_tensor("all_gather_into_tensor", output, input))

    all_gather_single = _allgather_base

    def _allgather_tensors_cuda(self, name, outputs, inputs, staged):
        """all_gather_into_tensor and its coalesced form on CUDA tensors:
        libnexar's stream-ordered allgather per pair, of bytes, where the
        tensors are contiguous, else staged(h)."""
        for o, i in zip(outputs, inputs):
            ns, no = nbytes(i), nbytes(o)
            if no != self._size_ * ns:
                raise ValueError(f"nexar: {name}: output has {no} bytes, expected {self._size_} x {ns}")
        dev = outputs[0].device
        if not all(t.is_contiguous() for t in (*outputs, *inputs)):
            return self._on_cuda(name, outputs, dev, self._staged_cuda(dev, inputs, outputs, staged))
        args = [(i.data_ptr(), o.data_ptr(), nbytes(i)) for o, i in zip(outputs, inputs)]
        raw = self._raw

        def body(stream, hold):
            for a, b, n in args:
                raw.allgather_stream(a, b, n, BYTE, stream)
        return self._on_cuda(name, outputs, dev, body)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if outputs and is_cuda([*outputs, *inputs]):
            return self._allgather_tensors_cuda(
                "allgather_into_tensor_coalesced", outputs, inputs,
                lambda h: self.allgather_into_tensor_coalesced([h(o) for o in outputs], [h(i) for i in inputs], opts))

        def fn():
            for output, input in zip(outputs, inputs):
                self._allgather_tensor("allgather_into_tensor_coalesced", output, input)
        return self._enqueue("allgather_into_tensor_coalesced", outputs, fn)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # ---- reduce-scatter -----------------------------------------------------
    def _reduce_scatter_one(self, out: torch.Tensor, inp: torch.Tensor, op, factor):
        n = self._size_
        if inp.numel() != n * out.numel():
            raise ValueError(f"nexar: reduce_scatter: input has {inp.numel()} elements, "
                             f"expected {n} x {out.numel()}")
        ri = Reduction(inp, op, factor)
        ro = Reduction(out, op)
        self._raw.reduce_scatter(ri.addr, ro.addr, ro.count, ro.dt, ro.op)
        ro.s.back()

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op, factor = op_of(opts)
        ins = [t for ts in input_lists for t in ts]
        if is_cuda([*output_tensors, *ins]):
            for ts in input_lists:
                self._count("reduce_scatter", ts, self._size_)
            self._reduce_ok("reduce_scatter", output_tensors, op)
            dev = output_tensors[0].device
            return self._on_cuda("reduce_scatter", output_tensors, dev, self._staged_cuda(
                dev, ins, output_tensors,
                lambda h: self.reduce_scatter([h(t) for t in output_tensors], [[h(t) for t in ts] for ts in input_lists],
                                              opts)))

        def fn():
            for out, ins in zip(output_tensors, input_lists):
                if len(ins) != self._size_:
                    raise ValueError(f"nexar: reduce_scatter needs {self._size_} input tensors")
                self._reduce_scatter_one(out, flat_cat(ins), op, factor)
        return self._enqueue("reduce_scatter", output_tensors, fn)

    def _reduce_scatter_base(self, output, input, opts=None):
        op, factor = op_of(opts)
        if is_cuda([output, input]):
            return self._reduce_scatter_cuda("reduce_scatter_tensor", [output], [input], op, factor,
                                             lambda h: self._reduce_scatter_base(h(output), h(input), opts))
        return self._enqueue("_reduce_scatter_base", [output],
                             lambda: self._reduce_scatter_one(output, input, op, factor))

    reduce_scatter_single = _reduce_scatter_base

    def _reduce_scatter_cuda(self, name, outputs, inputs, op, factor, staged):
        """reduce_scatter_tensor and its coalesced form on CUDA tensors:
        libnexar's stream-ordered reduce-scatter per pair where it takes
        them as they are, else staged(h)."""
        for o, i in zip(outputs, inputs):
            if i.dtype != o.dtype or i.numel() != self._size_ * o.numel():
                raise ValueError(f"nexar: {name}: input has {i.numel()} {i.dtype} elements, "
                                 f"expected {self._size_} x {o.numel()} {o.dtype}")
        self._reduce_ok(name, outputs, op)
        dev = outputs[0].device
        dts = self._stream_reduce([*outputs, *inputs], op, factor)
        if dts is None:
            return self._on_cuda(name, outputs, dev, self._staged_cuda(dev, inputs, outputs, staged))
        args = [(i.data_ptr(), o.data_ptr(), o.numel(), d) for o, i, d in zip(outputs, inputs, dts)]
        raw, o_ = self._raw, int(op)

        def body(stream, hold):
            for a, b, n, d in args:
                raw.reduce_scatter_stream(a, b, n, d, o_, stream)
        return self._on_cuda(name, outputs, dev, body)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op, factor = op_of(opts)
        if outputs and is_cuda([*outputs, *inputs]):
            return self._reduce_scatter_cuda(
                "reduce_scatter_tensor_coalesced", outputs, inputs, op, factor,
                lambda h: self.reduce_scatter_tensor_coalesced([h(o) for o in outputs], [h(i) for i in inputs], opts))

        def fn():
            for out, inp in zip(outputs, inputs):
                self._reduce_scatter_one(out, inp, op, factor)
        return self._enqueue("reduce_scatter_tensor_coalesced", outputs, fn)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # ---- all-to-all -----------------------------------------------------------
    def _split_bytes(self, t: torch.Tensor, splits):
        """(byte counts, byte displacements) of t's dim-0 splits (equal when none)."""
        n = self._size_
        rows = t.shape[0] if t.dim() > 0 else 1
        row = (nbytes(t) // rows) if rows else 0
        if not splits:
            if rows % n:
                raise ValueError("nexar: all_to_all_single: dim 0 is not divisible by the world size")
            splits = [rows // n] * n
        if len(splits) != n or sum(splits) != rows:
            raise ValueError("nexar: all_to_all_single: split sizes do not match the tensor")
        c = [int(x) * row for x in splits]
        return c, offsets(c)[0]

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self._size_
        if is_cuda([output, input]):
            if output_split_sizes or input_split_sizes:
                self._split_bytes(input, input_split_sizes)
                self._split_bytes(output, output_split_sizes)
            elif nbytes(input) != nbytes(output) or nbytes(input) % n:
                raise ValueError("nexar: all_to_all_single: input and output must have the same size, "
                                 f"a multiple of {n}")
            return self._on_cuda("alltoall_base", [output], output.device, self._staged_cuda(
                output.device, [input], [output],
                lambda h: self.alltoall_base(h(output), h(input), output_split_sizes, input_split_sizes, opts)))

        def fn():
            s, o = Staged(input, writable=False), Staged(output)
            if not output_split_sizes and not input_split_sizes:
                if s.nbytes != o.nbytes or s.nbytes % n:
                    raise ValueError("nexar: all_to_all_single: input and output must have the same size, "
                                     f"a multiple of {n}")
                self._raw.alltoall(s.addr, o.addr, s.nbytes // n, BYTE)
            else:
                sc, sd = self._split_bytes(input, input_split_sizes)
                rc, rd = self._split_bytes(output, output_split_sizes)
                self._raw.alltoallv(s.addr, sc, sd, o.addr, rc, rd, BYTE)
            o.back()
        return self._enqueue("alltoall_base", [output], fn)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size_
        if is_cuda([*output_tensors, *input_tensors]):
            self._count("all_to_all", output_tensors, n)
            self._count("all_to_all", input_tensors, n)
            dev = output_tensors[0].device
            return self._on_cuda("alltoall", output_tensors, dev, self._staged_cuda(
                dev, input_tensors, output_tensors,
                lambda h: self.alltoall([h(t) for t in output_tensors], [h(t) for t in input_tensors], opts)))

        def fn():
            if len(output_tensors) != n or len(input_tensors) != n:
                raise ValueError(f"nexar: all_to_all needs {n} input and {n} output tensors")
            sin = bytes_cat(input_tensors)
            sc = [nbytes(t) for t in input_tensors]
            rc = [nbytes(t) for t in output_tensors]
            sd, _ = offsets(sc)
            rd, total = offsets(rc)
            tmp = torch.empty(total, dtype=torch.uint8)
            self._raw.alltoallv(sin.data_ptr(), sc, sd, tmp.data_ptr(), rc, rd, BYTE)
            copy_blocks(output_tensors, tmp, rd, rc)
        return self._enqueue("alltoall", output_tensors, fn)

    # ---- gather / scatter -----------------------------------------------------
    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._root(opts)
        n = self._size_
        outs = [o for os_ in output_tensors for o in os_]
        if is_cuda([*input_tensors, *outs]):
            if self._rank_ == root:
                self._count("gather", output_tensors[0] if output_tensors else [], n)
            dev = input_tensors[0].device
            return self._on_cuda("gather", output_tensors, dev, self._staged_cuda(
                dev, input_tensors[:1], outs,
                lambda h: self.gather([[h(o) for o in os_] for os_ in output_tensors], [h(input_tensors[0])], opts)))

        def fn():
            s = Staged(input_tensors[0], writable=False)
            if self._rank_ != root:
                self._raw.gatherv(s.addr, s.nbytes, 0, [], [], BYTE, root)
                return
            outs = output_tensors[0]
            if len(outs) != n:
                raise ValueError(f"nexar: gather needs {n} output tensors on the root")
            sizes = [nbytes(o) for o in outs]
            displs, total = offsets(sizes)
            tmp = torch.empty(total, dtype=torch.uint8)
            self._raw.gatherv(s.addr, s.nbytes, tmp.data_ptr(), sizes, displs, BYTE, root)
            copy_blocks(outs, tmp, displs, sizes)
        return self._enqueue("gather", output_tensors, fn)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._root(opts)
        n = self._size_
        ins = [t for ts in input_tensors for t in ts]
        if is_cuda([*output_tensors, *ins]):
            if self._rank_ == root:
                self._count("scatter", input_tensors[0] if input_tensors else [], n)
            dev = output_tensors[0].device
            return self._on_cuda("scatter", output_tensors, dev, self._staged_cuda(
                dev, ins, output_tensors[:1],
                lambda h: self.scatter([h(output_tensors[0])], [[h(t) for t in ts] for ts in input_tensors], opts)))

        def fn():
            o = Staged(output_tensors[0])
            if self._rank_ == root:
                ins = input_tensors[0]
                if len(ins) != n:
                    raise ValueError(f"nexar: scatter needs {n} input tensors on the root")
                sizes = [nbytes(t) for t in ins]
                cat = bytes_cat(ins)
                self._raw.scatterv(cat.data_ptr(), sizes, offsets(sizes)[0], o.addr, o.nbytes, BYTE, root)
            else:
                self._raw.scatterv(0, [], [], o.addr, o.nbytes, BYTE, root)
            o.back()
        return self._enqueue("scatter", output_tensors, fn)

    # ---- barrier ------------------------------------------------------------------
    def barrier(self, opts=None):
        if not getattr(opts, "asyncOp", True) and self._fast():
            return self._now("barrier", [], self._raw.barrier)
        return self._enqueue("barrier", [], self._raw.barrier)

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
        self._comm.check()
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
                if not self._mb_recv(r, tag, deadline):
                    failed.append(r)
                    if not wait_all_ranks:
                        break
            if failed:
                who = f"Rank {failed[0]}" if len(failed) == 1 else "Ranks " + ", ".join(map(str, failed))
                raise RuntimeError(f"{who} failed to pass monitoredBarrier in {ms} ms")
            for r in range(1, self._size_):
                self._raw.send(one.data_ptr(), 1, BYTE, r, tag)
            return
        self._raw.send(one.data_ptr(), 1, BYTE, 0, tag)
        if not self._mb_recv(0, tag, deadline):
            raise RuntimeError(
                f"Rank {self._rank_} successfully reached monitoredBarrier, but received errors while "
                f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.")

    def _mb_recv(self, peer, tag, deadline) -> bool:
        """Receive monitored_barrier's byte from peer by deadline. A receive
        given up stays posted (the C ABI can neither withdraw it nor wait
        with a deadline, hence the polling), so its Request, which holds its
        buffer, is kept with the group."""
        s = Staged(torch.zeros(1, dtype=torch.uint8))
        q = self._raw.irecv(s.addr, 1, BYTE, int(peer), tag, s)
        while not q.test():
            if time.monotonic() >= deadline:
                self.__dict__.setdefault("_mb_orphans", []).append(q)
                return False
            time.sleep(0.0005)
        return True

    # ---- point-to-point ---------------------------------------------------------
    def _p2p(self, name, tensors, peer, tag, recv):
        if len(tensors) != 1:
            raise ValueError(f"nexar: {name} takes exactly one tensor")
        if is_cuda(tensors):
            return self._p2p_cuda(name, tensors[0], peer, tag, recv)
        self._comm.check()
        s = Staged(tensors[0], writable=recv)
        post = self._raw.irecv if recv else self._raw.isend
        q = post(s.addr, s.nbytes, BYTE, int(peer), tag64(tag), s)
        w = NexarWork(tensors, name)

        def fn():
            st = q.wait()  # a receive's Request writes s back first
            if recv:
                w._source = st.source
        complete_in_thread(f"nexar-{name}", fn, w)
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
        if self._coalescing is None:
            self._gate.blocked += 1
        self._coalescing = []

    def _end_coalescing(self, device=None):
        works, self._coalescing = self._coalescing, None
        if works is None:
            works = []
        else:
            self._gate.blocked -= 1
        if any(isinstance(w, CudaWork) for w in works):
            return CudaBatchWork(works)
        agg = NexarWork([], "coalesced")

        def fn():
            err = None
            for w in works:
                try:
                    w.wait()
                except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
                    err = err or e
            if err is not None:
                raise err
        # Waiting on a thread of its own keeps queued collectives moving.
        complete_in_thread("nexar-coalesced", fn, agg)
        return agg

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing


# ---- torch.compile ---------------------------------------------------------
# torch registers ProcessGroup as an opaque object type for Dynamo, with a
# fixed list of members (rank, size, group_name, ...); our subclass inherits
# the registration. While a compiled function runs, Dynamo's frame hook sees
# every Python frame, including the frames of these methods when torch's C++
# (DDP's buffer broadcast, the reducer) or an eager graph break calls them:
# it wraps `self` as that opaque object, and the first attribute that is
# ours (`self._raw`, `self._root`, ... a Work's `_h`) is a hard error
# ("Member '_raw' is not registered for this opaque object type"). A C++
# backend such as gloo has no Python frame there. So the methods torch calls
# run with Dynamo disabled: never traced, called as they are (a graph break
# when called from compiled code, as for any opaque C++ call).
#
# Importing Dynamo costs seconds (it loads Inductor), which a job that never
# compiles must not pay at its first group. Nothing traces before Dynamo is
# imported, so the methods are wrapped when it is: at once if it is loaded
# already, else right after its import (_AfterImport).
def _untraced(cls) -> None:
    if getattr(cls, "_nexar_untraced", False):
        return
    try:
        from torch._dynamo import disable
    except Exception:  # pragma: no cover - a torch without Dynamo: nothing traces
        return
    for name, fn in list(vars(cls).items()):
        if name.startswith("_") and name not in ("_start_coalescing", "_end_coalescing", "_get_backend",
                                                 "_set_group_name", "_set_group_desc",
                                                 "_started_work", "_failed"):  # called from C
            continue
        if inspect.isfunction(fn):
            setattr(cls, name, disable(fn, recursive=True))
    # The general methods the C fast paths fall back to (_install_fast),
    # under their own names: the group's attributes allreduce and
    # broadcast are the C paths themselves.
    cls._allreduce_general = cls.allreduce
    cls._broadcast_general = cls.broadcast
    cls._nexar_untraced = True


class _AfterImport:
    """A meta path finder that runs then() once the module name has been
    imported (executed), and leaves sys.meta_path then. It finds nothing
    itself: it asks the finders after it and wraps the loader's
    exec_module (a find_spec without an import, importlib.util.find_spec,
    leaves it in place)."""

    def __init__(self, name: str, then):
        self._name, self._then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name or self not in sys.meta_path:
            return None
        finders = sys.meta_path[sys.meta_path.index(self) + 1:]
        for f in finders:
            find = getattr(f, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:  # pragma: no cover - a legacy loader: wrap on the next group instead
            return spec
        then = self._then

        def exec_then(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            then()

        spec.loader.exec_module = exec_then
        return spec


def untraced_when_dynamo(cls) -> None:
    """Wrap cls's methods for Dynamo now if it is loaded, else once it is.
    Idempotent; also called at each group's creation, which covers a
    Dynamo that was being imported when this module was."""
    if getattr(cls, "_nexar_untraced", False):
        return
    dyn = sys.modules.get("torch._dynamo")
    if dyn is not None and not getattr(getattr(dyn, "__spec__", None), "_initializing", False):
        _untraced(cls)
        return
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("torch._dynamo", lambda: _untraced(cls)))  # executed, still _initializing


# The general methods the C fast paths fall back to (_install_fast), under
# their own names: the group's attributes allreduce and broadcast are the C
# paths themselves (rebound by _untraced to the wrapped methods).
ProcessGroupNexar._allreduce_general = ProcessGroupNexar.allreduce
ProcessGroupNexar._broadcast_general = ProcessGroupNexar.broadcast
untraced_when_dynamo(ProcessGroupNexar)
