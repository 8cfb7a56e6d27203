# Ranks 0-1 on host0 (10.0.0.1), ranks 2-3 on host1: run this on each host
# with BASE=0 on host0 and BASE=2 on host1. Rank 0 runs the seed embedded
# on its own address; each rank listens on the address that routes to it.
export NEXAR_WORLD_SIZE=4 NEXAR_SEED=10.0.0.1:29400
export NEXAR_TOKEN_FILE=${NEXAR_TOKEN_FILE:-/shared/job.token}
for i in 0 1; do
    NEXAR_RANK=$((BASE + i)) python train.py &
done
wait
# Or a stand-alone seed on a third host, serving job after job:
#   nexar seed --listen 0.0.0.0:29400 --world-size 4 --token-file /shared/job.token --persist
