"""One rank of the flight recorder test (launched by `nexar run` with
--flight-dir, or with NEXAR_FLIGHT_RECORDER_DIR): an allreduce and a
barrier on every rank, then every rank but the last calls another
allreduce, which the last never calls. The others time out (NEXAR_TIMEOUT)
and dump their records; the last dumps its own and waits for them."""

import os
import sys
import time

import numpy as np

import nexar

c = nexar.Comm()
r, n = c.rank, c.size
x = np.ones(2, dtype=np.float32)
c.allreduce(x)
c.barrier()
d = os.environ["NEXAR_FLIGHT_RECORDER_DIR"]
if r == n - 1:
    c.dump_flight_record(os.path.join(d, f"nexar-flight-r{r}-c0.json"))
    print(f"rank {r}: skipped the allreduce", flush=True)
    # the others' records appear when their allreduce times out
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(d, f"nexar-flight-r{q}-c0.json")) for q in range(n)):
            break
        time.sleep(0.1)
    time.sleep(1)
    c.close()
    sys.exit(0)
try:
    c.allreduce(x)
except nexar.Error as e:
    print(f"rank {r}: allreduce failed: {type(e).__name__}: {e}", flush=True)
rec = c.flight_record()
last = rec["entries"][-1]
assert last["op"] == "allreduce" and last["state"] == "failed" and last["seq"] == 2, last
print(f"rank {r}: flight ok", flush=True)
c.close()
