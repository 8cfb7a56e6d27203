"""One rank of the rendezvous tests across network namespaces
(test_rendezvous_netns.py): joins a 2-rank "nexar" group by the init
method argv[1] names, all_reduces its rank + 1 and prints the sum.

RANK and WORLD_SIZE (torchrun's or the test's), RDV_HOST and RDV_PORT (the
store's or the tcp:// address), RDV_TIMEOUT (the group's timeout, s)."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401  (registers the backend)

method = sys.argv[1]
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
host, port = os.environ.get("RDV_HOST", ""), int(os.environ.get("RDV_PORT", "0"))
timeout = timedelta(seconds=float(os.environ.get("RDV_TIMEOUT", "300")))
t0 = time.monotonic()
group = None
if method in ("env", "torchrun"):
    dist.init_process_group("nexar", timeout=timeout)
elif method == "tcp":
    dist.init_process_group("nexar", init_method=f"tcp://{host}:{port}", rank=rank, world_size=size, timeout=timeout)
elif method == "store":
    store = dist.TCPStore(host, port, size, rank == 0, timeout=timeout)
    dist.init_process_group("nexar", store=store, rank=rank, world_size=size, timeout=timeout)
elif method == "gloo-tcp-new-group":
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=size, timeout=timeout)
    group = dist.new_group(backend="nexar", timeout=timeout)
else:
    raise SystemExit(f"unknown method {method}")
x = torch.tensor([rank + 1.0])
dist.all_reduce(x, group=group)
print(f"rank {rank}: {method} sum {x.item():g} in {time.monotonic() - t0:.1f} s", flush=True)
dist.destroy_process_group()
