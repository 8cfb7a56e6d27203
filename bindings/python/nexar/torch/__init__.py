"""torch.distributed backend "nexar".

    import nexar.torch  # registers the backend (automatic on torch >= 2.5)
    torch.distributed.init_process_group("nexar")

Works under torchrun (env://) and with tcp:// and file:// init methods, and
for new_group(). Rendezvous goes through the Store torch gives the backend
(rank 0 publishes a fresh random token and the seed address there), so no
extra configuration is needed. The knobs (topology, data path, plaintext
between trusted hosts, ...) come from the NEXAR_* variables or from
pg_options=nexar.torch.Options(...) (docs/reference/env.md).

Importing this module registers the name only; libnexar (and its Go runtime)
is loaded when the first "nexar" group is created.
"""

from __future__ import annotations

import inspect
import warnings

from ._options import Options  # pg_options; imports neither torch nor libnexar

__all__ = ["Options", "ProcessGroupNexar", "register"]

_REGISTERED = False


def _create(opts, pg_options=None):
    """Backend creator (extended_api=True): torch passes _DistributedBackendOptions."""
    from ._pg import ProcessGroupNexar, untraced_when_dynamo

    untraced_when_dynamo(ProcessGroupNexar)  # Dynamo may have been loaded since (by a path we did not see)
    return ProcessGroupNexar(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             group_id=str(getattr(opts, "group_id", "")), options=pg_options)


def register() -> None:
    """Register "nexar" with torch.distributed (idempotent)."""
    global _REGISTERED
    import torch.distributed as dist

    if _REGISTERED or "NEXAR" in getattr(dist.Backend, "_plugins", {}):
        _REGISTERED = True
        return
    kwargs = {}
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        kwargs["devices"] = ["cpu", "cuda"]
    dist.Backend.register_backend("nexar", _create, extended_api=True, **kwargs)
    # A nexar group is a Python ProcessGroup with no C++ backend registered
    # on it, so torch's flight recorder, which files entries under the C++
    # group name, cannot record it (attaching raises "ProcessGroup name not
    # set"). Tell torch not to try, as for the backends that record
    # themselves; nexar records nothing there.
    import torch.distributed.distributed_c10d as c10d

    fr = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(fr, set):
        fr.add("nexar")
    _REGISTERED = True


_register = register  # entry point "torch.distributed.backends"


def _autoload() -> None:
    """Entry point "torch.backends": runs at the end of `import torch`.

    It must never break `import torch`, so a failure only warns.
    """
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        register()
    except Exception as e:  # pragma: no cover - depends on the host's torch
        warnings.warn(f"nexar: could not register the torch.distributed backend: {e!r}", RuntimeWarning)


def __getattr__(name):
    if name == "ProcessGroupNexar":
        from ._pg import ProcessGroupNexar

        return ProcessGroupNexar
    raise AttributeError(f"module 'nexar.torch' has no attribute {name!r}")


register()
