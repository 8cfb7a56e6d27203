"""A peer that leaves right after init_process_group (issue 32: the
survivor erred after 2.4-2.7 s where gloo's does in under 1 s). Rank 1
leaves as MODE says: "exit" (sys.exit, the backend's finalizer destroys
its communicator), "_exit" (os._exit: no finalizer, the process is gone)
or "kill" (SIGKILL). Rank 0 runs an all_reduce and prints the error and
how long after rank 1's exit it came (rank 1 writes its exit time to a
file first)."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401  registers the backend

mode, stamp = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
dist.init_process_group("nexar", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
if rank == 1:
    with open(stamp + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(stamp + ".tmp", stamp)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "_exit":
        os._exit(0)
    sys.exit(0)
t = torch.ones(4)
try:
    dist.all_reduce(t)
    print("rank 0: all_reduce succeeded without rank 1", flush=True)
except Exception as e:  # noqa: BLE001
    now = time.time()
    for _ in range(200):  # rank 1's stamp is written before it leaves
        if os.path.exists(stamp):
            break
        time.sleep(0.01)
    with open(stamp) as f:
        left = float(f.read())
    print(f"rank 0: error {now - left:.3f}s after rank 1 left: {type(e).__name__}: {e}", flush=True)
