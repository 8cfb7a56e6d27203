"""nexar.init() from whatever launcher started this process: an allreduce
whose sum every rank checks (twice, HOLD seconds apart); one line per rank,
with the seed address the launcher variables gave."""
import os
import socket
import sys
import time

import numpy as np

import nexar
from nexar import _launcher

t0 = time.perf_counter()
seed = _launcher.detect().seed
with nexar.init() as comm:
    x = np.full(1024, comm.rank + 1, dtype=np.float64)
    comm.allreduce(x)
    time.sleep(float(os.environ.get("HOLD", "0")))
    y = np.full(1024, comm.rank + 1, dtype=np.float64)
    comm.allreduce(y)
    want = comm.size * (comm.size + 1) / 2
    ok = bool(np.all(x == want) and np.all(y == want))
    sys.stdout.write(f"RESULT rank={comm.rank} size={comm.size} host={socket.gethostname()} sum={x[0]:g} want={want:g} "
          f"ok={ok} seed={seed} wall_s={time.perf_counter() - t0:.2f}\n")
    sys.stdout.flush()
    if not ok:
        raise SystemExit(f"wrong sum {x[0]} != {want}")
