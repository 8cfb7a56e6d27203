"""DDP communication hooks over nexar's compressed allreduce.

    from nexar.torch.hooks import CompressionState, compressed_allreduce_hook
    model = DistributedDataParallel(model)          # on a "nexar" group
    model.register_comm_hook(CompressionState(method="topk", ratio=0.01),
                             compressed_allreduce_hook)

Each gradient bucket is reduced with nexar_allreduce_compressed (TopK or
RandomK, see nexar.CompressState) and averaged over the ranks; the error
feedback residual of each bucket lives in the state, keyed by the bucket's
index (DDP rebuilds its buckets once after the first step; a bucket whose
size changed starts from a zero residual). The result is the same on every
rank, so the replicas stay in step.
"""

from typing import Optional

import torch
import torch.distributed as dist

from .._compress import CompressState
from .._types import Datatype

__all__ = ["CompressionState", "compressed_allreduce_hook"]

_F32 = int(Datatype.FLOAT32)


class CompressionState(CompressState):
    """CompressState plus the process group to reduce on (None: the
    default group), which must be a "nexar" group."""

    def __init__(self, process_group=None, method="topk", ratio: float = 0.01,
                 error_feedback: Optional[bool] = None, seed: int = 0):
        super().__init__(method, ratio, error_feedback, seed)
        self.process_group = process_group


def _nexar_group(pg):
    from ._pg import ProcessGroupNexar

    if pg is None:
        pg = dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupNexar):
        return pg
    try:
        b = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001 - reported below
        b = None
    if isinstance(b, ProcessGroupNexar):
        return b
    raise TypeError(f"nexar: compressed_allreduce_hook needs a \"nexar\" process group, got {pg!r}")


# The return annotation is evaluated (no `from __future__ import
# annotations`): DDP's register_comm_hook compares it with this very type.
def compressed_allreduce_hook(state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients, compressed, summed over the
    ranks and divided by their number. Runs on the group's worker thread in
    issue order (DDP issues buckets in the same order on every rank, which
    also keeps RandomK's seeds equal)."""
    pg = _nexar_group(state.process_group)
    t = bucket.buffer()
    size = pg.size()
    residual = state.residual(bucket.index(), t) if state.error_feedback else None
    seed = state.next_seed()
    raw = pg._raw

    def fn():
        w = t if t.dtype == torch.float32 and t.is_contiguous() else t.detach().float().contiguous()
        raw.allreduce_compressed(w.data_ptr(), residual.data_ptr() if residual is not None else 0, w.numel(),
                                 _F32, state.method, state.ratio, seed)
        with torch.no_grad():
            w.div_(size)
            if w is not t:
                t.copy_(w)

    work = pg._enqueue("allreduce_compressed", [t], fn)
    return work.get_future().then(lambda f: f.value()[0])
