# Open MPI only starts the processes; nexar reads OMPI_COMM_WORLD_RANK, _SIZE
# and _LOCAL_RANK, and rank 0 runs the seed on mpirun's host (run mpirun on
# host0) at a port from the job's id. nexar.init() needs the job's secret in
# a file both hosts see; a torch script (init_process_group("nexar")) needs
# nothing more.
export NEXAR_TOKEN_FILE=${NEXAR_TOKEN_FILE:-/shared/job.token}
mpirun -np 4 -H host0:2,host1:2 -x NEXAR_TOKEN_FILE python train.py
