"""Train a small model for a few steps under a training framework, over a
given torch.distributed backend, and save rank 0's final parameters.

  frameworks_worker.py lightning BACKEND OUT   # run once: Lightning starts rank 1
  frameworks_worker.py accelerate BACKEND OUT  # run as 2 ranks with torchrun's variables

The test compares the parameters saved over "nexar" and over "gloo".
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nexar.torch  # noqa: F401  registers the "nexar" backend

STEPS = 6
BATCH = 8


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * BATCH * 2, 8, generator=g)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1) + 0.1 * torch.randn(x.shape[0], 1, generator=g)
    return TensorDataset(x, y)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def lightning(backend: str, out: str) -> None:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_start(self):
            # The framework really runs over the backend asked for.
            assert dist.get_backend() == backend, dist.get_backend()
            assert dist.get_world_size() == 2

    m = Module()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=backend),
                        max_steps=STEPS, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(m, DataLoader(data(), batch_size=BATCH))
    if trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in m.net.state_dict().items()}, out)
    print(f"rank {trainer.global_rank}: lightning over {backend} ok", flush=True)


def accelerate(backend: str, out: str) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    # On CPU, Accelerate picks gloo (or MPI) itself when it creates the
    # process group; a group that already exists is the one it uses.
    dist.init_process_group(backend)
    acc = Accelerator(cpu=True)
    assert acc.distributed_type == DistributedType.MULTI_CPU, acc.distributed_type
    assert dist.get_backend() == backend, dist.get_backend()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    dl = DataLoader(data(), batch_size=BATCH)
    net, opt, dl = acc.prepare(net, opt, dl)
    assert isinstance(net, nn.parallel.DistributedDataParallel), type(net)
    steps = 0
    for x, y in dl:
        opt.zero_grad()
        acc.backward(nn.functional.mse_loss(net(x), y))
        opt.step()
        steps += 1
    assert steps == STEPS, steps
    acc.wait_for_everyone()
    if acc.is_main_process:
        torch.save({k: v.detach().clone() for k, v in acc.unwrap_model(net).state_dict().items()}, out)
    print(f"rank {acc.process_index}: accelerate over {backend} ok", flush=True)
    acc.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    kind, backend, out = sys.argv[1:4]
    {"lightning": lightning, "accelerate": accelerate}[kind](backend, out)
