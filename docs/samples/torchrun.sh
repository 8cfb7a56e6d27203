torchrun --standalone --nproc-per-node 2 torch_ddp.py
