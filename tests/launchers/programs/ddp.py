"""torch DDP over BACKEND (default nexar) under any launcher: 20 steps of a
small MLP, then every rank checks that all replicas hold the same weights.
Rank 0 prints a RESULT line (init and step times) and saves the weights to
$OUT_DIR/weights-<backend>.pt for the test to compare across backends.
Under srun or mpirun, "nexar" needs no variable; gloo gets the same ones
from nexar.torch.launcher_env() (what the nexar backend does by itself)."""
import os
import socket
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import nexar.torch  # noqa: E402

backend = os.environ.get("BACKEND", "nexar")
if backend != "nexar":
    nexar.torch.launcher_env()
t1 = time.perf_counter()
dist.init_process_group(backend)
t_init = time.perf_counter() - t1
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1234 + rank)
steps = int(os.environ.get("STEPS", "20"))
times = []
for step in range(steps):
    x = torch.randn(32, 64, generator=gen)
    s = time.perf_counter()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - s)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
copies = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(copies, flat)
same = all(torch.equal(c, flat) for c in copies)
sys.stdout.write(f"RESULT rank={rank} world={world} backend={backend} host={socket.gethostname()} same_weights={same} "
      f"init_s={t_init:.2f} steps_ms={1000 * sum(times):.0f} wall_s={time.perf_counter() - t0:.1f}\n")
sys.stdout.flush()
if rank == 0 and os.environ.get("OUT_DIR"):
    torch.save(flat, os.path.join(os.environ["OUT_DIR"], f"weights-{backend}.pt"))
dist.destroy_process_group()
if not same:
    raise SystemExit("replicas differ")
