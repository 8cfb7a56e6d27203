"""pg_options of a "nexar" group: the knobs of nexar.Comm, from torch.

    dist.init_process_group("nexar", pg_options=nexar.torch.Options(
        topology="kregular:2", bulk="tcp", bulk_plaintext=True))

Every knob left out takes its NEXAR_* variable, else the default, as
everywhere (docs/reference/env.md); one given here beats the variable.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .. import _knobs

__all__ = ["Options", "comm_kwargs"]

# nexar.Comm's keyword arguments that a group may set (its rank, size, seed
# and token come from torch's rendezvous).
_KNOBS = frozenset({
    "topology", "schedules", "bulk", "bulk_plaintext", "bulk_conns", "spin_wait", "memory_profile",
    "min_world_size", "max_world_size", "join_addr", "cuda_runtime", "nccl_library", "ibverbs_library",
    "rdma_device", "bind_addr", "heartbeat_interval", "heartbeat_timeout", "max_buffered_bytes",
    "failure_policy", "timeout", "connect_timeout",
})


class Options:
    """The knobs of one "nexar" group (init_process_group's or new_group's
    pg_options). Keyword arguments as nexar.Comm's: topology, schedules,
    bulk, bulk_plaintext, bulk_conns, spin_wait, memory_profile,
    min_world_size, max_world_size, join_addr, cuda_runtime, nccl_library,
    ibverbs_library, rdma_device, bind_addr, heartbeat_interval,
    heartbeat_timeout (seconds), max_buffered_bytes, failure_policy, and
    timeout and connect_timeout (seconds; default: the group's timeout,
    unless NEXAR_TIMEOUT / NEXAR_CONNECT_TIMEOUT is set). Immutable."""

    def __init__(self, **knobs: Any):
        bad = sorted(set(knobs) - _KNOBS)
        if bad:
            raise TypeError("nexar.torch.Options: unknown knob(s) %s; known: %s"
                            % (", ".join(bad), ", ".join(sorted(_KNOBS))))
        self._knobs = {k: v for k, v in knobs.items() if v is not None}

    def __repr__(self) -> str:
        return "nexar.torch.Options(%s)" % ", ".join(f"{k}={v!r}" for k, v in sorted(self._knobs.items()))

    def knobs(self) -> Dict[str, Any]:
        """The knobs set, by name (a copy)."""
        return dict(self._knobs)


def comm_kwargs(options: Optional[Options], group_timeout: float) -> Dict[str, Any]:
    """nexar.Comm's keyword arguments for a group: options' knobs, and the
    group's timeout (torch always passes one, 30 minutes unless the program
    set another) as the operation and connect deadlines where neither the
    options nor NEXAR_TIMEOUT / NEXAR_CONNECT_TIMEOUT set them. torch's
    default cannot be told from a chosen one, so the variable wins over
    both."""
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"nexar: pg_options must be nexar.torch.Options, not {type(options).__name__}")
    kw = options.knobs() if options is not None else {}
    if "timeout" not in kw and _knobs.env("NEXAR_TIMEOUT") is None:
        kw["timeout"] = group_timeout
    if "connect_timeout" not in kw and _knobs.env("NEXAR_CONNECT_TIMEOUT") is None:
        kw["connect_timeout"] = group_timeout
    return kw
