# On each of the 2 hosts; HEAD is node 0's address (or a name that every host
# resolves to it). torch's store carries nexar's token and seed.
torchrun --nnodes 2 --nproc-per-node "${NPROC_PER_NODE:-4}" \
    --rdzv-backend c10d --rdzv-endpoint "$HEAD:29500" train.py
