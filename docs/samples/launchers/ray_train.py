# Ray Train: TorchTrainer's workers form a torch.distributed group over
# nexar (TorchConfig(backend="nexar")); Ray sets RANK, WORLD_SIZE and
# MASTER_ADDR/PORT in each worker, torch's store carries nexar's token.
import os

import ray
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train_loop(config):
    import torch.distributed as dist

    import ray.train
    import ray.train.torch

    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rank = ray.train.get_context().get_world_rank()
    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(config["steps"]):
        loss = model(torch.randn(32, 64, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    if rank == 0 and config.get("out"):
        torch.save(flat, config["out"])  # the test compares nexar's with gloo's
    same = all(torch.equal(c, flat) for c in copies)
    if rank == 0:  # Ray forwards the workers' output to the driver's
        print("RESULT", dist.get_backend(), "same_weights=%s" % same, flush=True)
    ray.train.report({"backend": dist.get_backend(), "same": same})


if __name__ == "__main__":
    backend = os.environ.get("BACKEND", "nexar")
    ray.init(num_cpus=2, include_dashboard=False)  # a local Ray cluster
    out = os.path.join(os.environ["OUT_DIR"], f"weights-{backend}.pt") if os.environ.get("OUT_DIR") else None
    trainer = TorchTrainer(train_loop, train_loop_config={"steps": 20, "out": out},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           torch_config=TorchConfig(backend=backend))
    trainer.fit()  # raises if a worker failed; rank 0 printed its RESULT line
    ray.shutdown()
