"""A bounded subset of PyTorch's distributed_test.py through the plugin hook,
for nexar and for gloo side by side (the full run is recorded in
docs/torch-compat.md; set NEXAR_DIST_SUITE_K to choose other tests)."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_suite")
PATTERN = os.environ.get("NEXAR_DIST_SUITE_K", "test_all_reduce_sum")


def _run(backend):
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE="2", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "run_dist_tests.py", "-k", PATTERN], cwd=HERE, env=env,
                       capture_output=True, text=True, timeout=900)
    m = re.search(r"Ran (\d+) tests?", r.stderr)
    return r, int(m.group(1)) if m else 0


@pytest.mark.parametrize("backend", ["nexar", "gloo"])
def test_pytorch_distributed_suite_subset(backend):
    r, ran = _run(backend)
    assert r.returncode == 0, r.stderr[-6000:]
    assert ran > 0, r.stderr[-2000:]
