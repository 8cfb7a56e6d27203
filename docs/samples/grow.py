import os
import subprocess
import sys
import time

import numpy as np

import nexar

child = None
if os.environ.get("SAMPLE_JOINER"):
    # A process started later: it waits in a member's lobby until the
    # members grow (the job's token is its NEXAR_TOKEN).
    comm = nexar.Comm.join(os.environ["SAMPLE_JOIN_ADDRS"])
else:
    os.environ["NEXAR_MAX_WORLD_SIZE"] = "3"  # room for one more than the 2 ranks
    comm = nexar.init()
    if comm.rank == 0:
        env = dict(os.environ, SAMPLE_JOINER="1", SAMPLE_JOIN_ADDRS=",".join(comm.join_addrs))
        child = subprocess.Popen([sys.executable, __file__], env=env)
    # Every member grows at the same point; with nobody waiting yet, the
    # result is the members' own communicator, so try again.
    grown = comm.grow()
    while grown.size < 3:
        grown.close()
        time.sleep(0.1)
        grown = comm.grow()
    comm.close()
    comm = grown

x = np.array([comm.rank + 1.0])
comm.allreduce(x)
assert x[0] == 6.0, x  # ranks 0, 1 and the newcomer, 2
comm.barrier()
comm.close()
if child is not None:
    assert child.wait() == 0
