"""One rank of the torchelastic restart test (test_rendezvous_netns.py):
on the first attempt the last rank exits before init_process_group once
the others are inside it; the restarted attempt must complete.

ELASTIC_MARK_PORT: a TCPStore (the test's) where ranks mark that they are
about to enter init."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401  (registers the backend)

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
marks = dist.TCPStore("127.0.0.1", int(os.environ["ELASTIC_MARK_PORT"]), is_master=False,
                      timeout=timedelta(seconds=120))
if attempt == 0 and rank == size - 1:
    marks.wait([f"in-init/{r}" for r in range(size - 1)])
    time.sleep(4)  # the others are inside the rendezvous by now
    print(f"rank {rank}: attempt 0: exiting before init", flush=True)
    sys.stdout.flush()
    os._exit(1)
marks.set(f"in-init/{rank}", "1")
dist.init_process_group("nexar", timeout=timedelta(seconds=float(os.environ.get("RDV_TIMEOUT", "300"))))
x = torch.tensor([rank + 1.0])
dist.all_reduce(x)
print(f"rank {rank}: attempt {attempt} sum {x.item():g}", flush=True)
dist.destroy_process_group()
