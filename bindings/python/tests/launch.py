"""Multi-process test launcher: runs one Python worker per rank as a fresh
process (never fork without exec), with the environment `nexar run` sets."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind(("127.0.0.1", 0))
            port = t.getsockname()[1]
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                    u.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def run_ranks(n: int, argv: Sequence[str], timeout: float = 180.0, env: Optional[Dict[str, str]] = None,
              torchrun_env: bool = False) -> List[str]:
    """Run `python argv...` as n ranks; return their outputs; raise if any fails."""
    port = free_port()
    token = secrets.token_hex(16)
    procs = []
    master_port = str(free_port())
    for r in range(n):
        e = dict(os.environ)
        e.update(env or {})
        e.update({
            "NEXAR_RANK": str(r), "NEXAR_WORLD_SIZE": str(n), "NEXAR_SEED": f"127.0.0.1:{port}",
            "NEXAR_TOKEN": token, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
        })
        if torchrun_env:
            e.update({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port})
        procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=HERE))
    deadline = time.monotonic() + timeout
    outs = [""] * n
    failed = []
    for r, p in enumerate(procs):
        try:
            outs[r], _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs[r] = (p.communicate()[0] or "") + "\n<<killed: timeout>>"
            failed.append(r)
            continue
        if p.returncode != 0:
            failed.append(r)
    if failed:
        for q in procs:
            if q.poll() is None:
                q.kill()
        msg = "\n".join(f"----- rank {r} (rc={procs[r].returncode}) -----\n{outs[r][-6000:]}" for r in range(n))
        raise AssertionError(f"ranks {failed} failed:\n{msg}")
    return outs


def run_ranks_status(n: int, argv: Sequence[str], timeout: float = 180.0, env: Optional[Dict[str, str]] = None,
                     ) -> List[Tuple[Optional[int], str]]:
    """Run `python argv...` as n ranks with torchrun's variables; return each
    rank's (return code, output), whatever they are. A rank still running at
    the deadline is killed and reported with return code None."""
    master_port = str(free_port())
    procs = []
    for r in range(n):
        e = dict(os.environ)
        e.update(env or {})
        e.update({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port,
                  "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=HERE))
    deadline = time.monotonic() + timeout
    res: List[Tuple[Optional[int], str]] = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            res.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            p.kill()
            res.append((None, (p.communicate()[0] or "") + "\n<<killed: timeout>>"))
    return res
