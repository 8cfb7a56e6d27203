import numpy as np

import nexar

with nexar.init() as comm:
    # many small gradients in one call, packed into 25 MiB buckets as DDP does
    grads = [np.full(n, comm.rank + 1.0, dtype=np.float32) for n in (10, 1000, 3)]
    comm.allreduce_multi(grads)  # in place
    assert all(np.all(g == comm.size * (comm.size + 1) / 2) for g in grads)
    print(comm.stats())  # memory and traffic counters of this communicator
