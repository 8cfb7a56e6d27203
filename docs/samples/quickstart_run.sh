nexar run -n 2 -- python allreduce.py
