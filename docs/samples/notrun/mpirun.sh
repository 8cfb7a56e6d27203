# Open MPI starts the ranks; nexar reads OMPI_COMM_WORLD_RANK and _SIZE
# (no MPI library is used for communication)
export NEXAR_SEED=host0:29400 NEXAR_TOKEN_FILE=/shared/job.token
mpirun -np 8 -H host0:4,host1:4 -x NEXAR_SEED -x NEXAR_TOKEN_FILE python train.py
