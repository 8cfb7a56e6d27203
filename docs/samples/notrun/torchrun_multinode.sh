# on each of the 2 hosts (node 0 at 10.0.0.1); torch's store carries nexar's token and seed
torchrun --nnodes 2 --node-rank "$NODE_RANK" --nproc-per-node 4 \
    --master-addr 10.0.0.1 --master-port 29500 train.py
