import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import nexar.torch  # noqa: F401  (torch >= 2.5 registers the backend by itself)

dist.init_process_group("nexar")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)  # each rank its own data
for step in range(5):
    x = torch.randn(32, 16, generator=gen)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()  # gradients averaged over ranks by nexar's allreduce
    opt.step()

# every replica ends with the same parameters
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
copies = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(copies, flat)
assert all(torch.equal(c, flat) for c in copies)
if rank == 0:
    print(f"trained on {world} ranks over {dist.get_backend()}")
dist.destroy_process_group()
