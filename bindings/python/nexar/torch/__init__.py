"""torch.distributed backend "nexar".

    import nexar.torch  # registers the backend (automatic on torch >= 2.5)
    torch.distributed.init_process_group("nexar")

Works under torchrun (env://) and with tcp:// and file:// init methods, and
for new_group(). Under srun and mpirun too: init_process_group("nexar")
with the env:// method (the default) and no RANK or MASTER_ADDR takes them
from Slurm's, Open MPI's or PMIx's variables (nexar._launcher, in the order
docs/guides/launchers.md gives) and sets the torchrun-style variables it
derived (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: the store's port is derived from the job's id) where unset. Rendezvous goes through the Store torch gives the backend
(rank 0 publishes a fresh random token and the seed address there), so no
extra configuration is needed. The knobs (topology, data path, plaintext
between trusted hosts, ...) come from the NEXAR_* variables or from
pg_options=nexar.torch.Options(...) (docs/reference/env.md).

Importing this module registers the name only; libnexar (and its Go runtime)
is loaded when the first "nexar" group is created.
"""

from __future__ import annotations

import functools
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
    _hook_init(dist, c10d)
    _REGISTERED = True


def _is_nexar(backend) -> bool:
    return backend is not None and "nexar" in str(backend).lower()


def launcher_env(rank: int = -1, world_size: int = -1) -> dict:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT from the launcher's variables (nexar._launcher.detect)
    where they are unset, as torchrun would have: what init_process_group
    does before a "nexar" group's env:// rendezvous. rank and world_size,
    when >= 0, are init_process_group's arguments. The variables set."""
    import os

    from .. import _launcher

    info = _launcher.detect(rank=rank if rank is not None and rank >= 0 else None,
                            world_size=world_size if world_size is not None and world_size > 0 else None)
    if info.name in ("none", "torchrun") and os.environ.get("MASTER_ADDR"):
        return {}  # torchrun's environment, or the user's: complete
    return _launcher.export(info)


def _hook_init(dist, c10d) -> None:
    """Wrap init_process_group so that a "nexar" group under srun or
    mpirun finds the torchrun-style variables env:// needs (launcher_env).
    Other backends and other init methods are left as they are."""
    orig = c10d.init_process_group
    if getattr(orig, "_nexar_hooked", False):
        return

    @functools.wraps(orig)
    def init_process_group(backend=None, init_method=None, *args, **kwargs):
        if _is_nexar(backend) and kwargs.get("store") is None and init_method in (None, "env://") and not args:
            launcher_env(kwargs.get("rank", -1), kwargs.get("world_size", -1))
        return orig(backend, init_method, *args, **kwargs)

    init_process_group._nexar_hooked = True
    c10d.init_process_group = init_process_group
    if getattr(dist, "init_process_group", None) is orig:
        dist.init_process_group = init_process_group


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
