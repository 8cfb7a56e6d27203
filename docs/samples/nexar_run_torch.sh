nexar run -n 2 -- python torch_ddp.py
