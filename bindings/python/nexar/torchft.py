"""nexar as torchft's process group.

    from nexar.torchft import ProcessGroupNexar
    manager = torchft.Manager(pg=ProcessGroupNexar(), ...)

torchft (https://github.com/pytorch/torchft) keeps training going while
replica groups die and come back: a lighthouse forms a quorum of the live
replica groups at each step, and the Manager rebuilds its process group
among them whenever the quorum changes. ProcessGroupNexar here is the
process group it expects: a torchft ``ProcessGroup`` made before any quorum
exists, rebuilt in place by each quorum over a nexar.torch group:

- torchft 0.2.0 calls ``configure(store_addr, replica_id, rank, world_size,
  quorum_id, group_rank, group_world_size, global_ranks)``: the nexar
  rendezvous runs through that store (a fresh prefix per quorum);
- its development version (torch >= 2.14) exchanges
  ``get_reconfigure_handle()`` through the lighthouse and calls
  ``reconfigure(opts)``: the rendezvous runs on the first handle's store;
- ``errored()`` (asked at every commit) is the communicator's recorded
  failure;
- a quorum change closes the old communicator gracefully (its peers see a
  goodbye, not a failure): nothing is aborted and nothing is logged as a
  warning. ``abort()`` aborts (torchft's call on an error).

Importing this module needs torchft (it subclasses torchft's ProcessGroup);
``import nexar`` does not import it. docs/torch-compat.md, "torchft", lists
what torchft calls, version by version.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch

try:
    from torchft.process_group import ProcessGroup as _FTProcessGroup
except ImportError as e:  # pragma: no cover - exercised without torchft
    raise ImportError(f"nexar.torchft needs torchft (pip install torchft): {e}") from e

from .torch import _pg

__all__ = ["ProcessGroupNexar"]


class ProcessGroupNexar(_FTProcessGroup):
    """torchft's reconfigurable process group over nexar (CPU tensors).

    timeout bounds each configuration's rendezvous and every collective of
    the groups it makes (torchft's Manager passes its own timeout to the
    operations it waits for). One nexar.torch.ProcessGroupNexar does the
    work; configure() and reconfigure() make it a new communicator in
    place. After abort() or shutdown() the next configure() starts afresh.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(0, 1)
        self._timeout = timeout
        self._pg = _pg.ProcessGroupNexar(None, 0, 1, timeout, group_id="torchft")

    # ---- configuration ------------------------------------------------------
    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: Optional[int] = None, group_rank: Optional[int] = None,
                  group_world_size: Optional[int] = None, global_ranks=None) -> None:
        """torchft 0.2.0's per-quorum call: the replica groups' process
        group among world_size of them, this one rank; store_addr is
        ``host:port/prefix``, a prefix unique to the quorum. Blocks until
        the group is formed; raises on failure (torchft then skips the step
        and tries the next quorum)."""
        self._pg.configure(store_addr, replica_id, rank, world_size)

    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        """This group's handle for reconfigure() (torch 2.15's API, which
        torchft's development version drives through its lighthouse)."""
        return self._pg.get_reconfigure_handle()

    def reconfigure(self, opts) -> torch.distributed.Work:
        """Rebuild the group among the handles of opts (ordered: this one's
        rank is its position). Returns a completed Work."""
        return self._pg.reconfigure(opts)

    def errored(self) -> Optional[Exception]:
        return self._pg.errored()

    def set_timeout(self, timeout: timedelta) -> None:
        """The timeout of the next configurations (not of the current one)."""
        self._timeout = timeout
        self._pg._timeout = timeout

    def abort(self, errored: bool = True) -> None:
        """Fail the current communicator's operations here and on its
        peers (errored, torchft's call on a failure), or close it
        gracefully (errored=False, a routine change: no peer logs a
        failure). The next configure() forms a new one."""
        old = self._fresh()
        if errored:
            old.abort()
        else:
            old.shutdown()

    def shutdown(self) -> None:
        self._fresh().shutdown()

    def _fresh(self) -> _pg.ProcessGroupNexar:
        """Put an unconfigured group in place of the current one (which is
        returned), keeping the reconfigure handle already handed out."""
        old = self._pg
        self._pg = _pg.ProcessGroupNexar(None, 0, 1, self._timeout, group_id="torchft")
        self._pg._rc_store, self._pg._rc_host, self._pg._rc_id = old._rc_store, old._rc_host, old._rc_id
        return old

    # ---- identity -------------------------------------------------------------
    def rank(self) -> int:
        return self._pg.rank()

    def size(self) -> int:
        return self._pg.size()

    def getBackendName(self) -> str:
        return "torchft-nexar"

    @property
    def parent(self) -> _pg.ProcessGroupNexar:
        """The nexar.torch group doing the work now (it changes with each
        configuration)."""
        return self._pg

    @property
    def _device_types(self):
        return [torch.device("cpu")]

    def _get_backend(self, device=None):
        return self._pg

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pg={self._pg!r})"

    # ---- collectives: the current group's -------------------------------------
    def allreduce(self, tensors, opts=None):
        return self._pg.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._pg.allreduce_coalesced(tensors, opts)

    def allgather(self, output_tensors, input_tensor, opts=None):
        return self._pg.allgather(output_tensors, input_tensor, opts)

    def allgather_into_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        return self._pg.allgather_into_tensor_coalesced(output_tensors, input_tensors, opts)

    def _allgather_base(self, output, input, opts=None):
        return self._pg._allgather_base(output, input, opts)

    def alltoall_base(self, output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts=None):
        return self._pg.alltoall_base(output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts=None):
        return self._pg.barrier(opts)

    def broadcast(self, tensor_list, opts=None):
        return self._pg.broadcast(tensor_list, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._pg.reduce_scatter(output_tensors, input_tensors, opts)

    def reduce_scatter_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        return self._pg.reduce_scatter_tensor_coalesced(output_tensors, input_tensors, opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._pg._reduce_scatter_base(output, input, opts)

    def send(self, tensors, dst_rank: int, tag: int = 0):
        return self._pg.send(tensors, dst_rank, tag)

    def recv(self, tensors, src_rank: int, tag: int = 0):
        return self._pg.recv(tensors, src_rank, tag)
