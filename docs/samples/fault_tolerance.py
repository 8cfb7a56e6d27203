import numpy as np

import nexar

with nexar.init(failure_policy="manual") as comm:
    comm.on_failure(lambda rank, err: print(f"rank {rank} failed: {err}", flush=True))
    x = np.ones(4, dtype=np.float32)
    try:
        comm.allreduce(x)
    except nexar.PeerDownError:
        comm.revoke()  # make every member leave the failed collective
    # every member that gets here agrees on the same flag and the same failed ranks
    flag, left_out = comm.agree(1)
    if left_out:
        with comm.shrink() as survivors:  # carry on without them
            survivors.barrier()
    else:
        # nobody failed (this run): a barrier, so that no member destroys the
        # communicator while another is still in agree (it would lose its quorum)
        comm.barrier()
        assert comm.failed == [] and flag == 1
