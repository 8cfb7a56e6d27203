"""Run PyTorch's own torch/testing/_internal/distributed/distributed_test.py
against a backend through its plugin hook.

    BACKEND=nexar WORLD_SIZE=2 python run_dist_tests.py [-k pattern] [-v]
    BACKEND=gloo  WORLD_SIZE=2 python run_dist_tests.py ...
    START=fork ...   start each test's ranks with fork (fast) instead of spawn

For a plugin backend the name is added to DistTestCases.backend_feature
["plugin"] (and "ddp", "subgroup"); spawned children re-import this module,
which registers the backend again.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import expecttest  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "stubs"))
os.environ.setdefault("BACKEND", "nexar")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", "/tmp/nexar_dist_tests_tmp")
os.makedirs(os.environ["TEMP_DIR"], exist_ok=True)

import torch.distributed as dist  # noqa: E402

BACKEND = os.environ["BACKEND"]
if BACKEND == "nexar":
    import nexar.torch  # noqa: F401
    from torch.testing._internal.common_distributed import DistTestCases

    for feat in ["plugin", "ddp", "subgroup"] + [f for f in os.environ.get("FEATURES", "").split(",") if f]:
        DistTestCases.backend_feature.setdefault(feat, set()).add("nexar")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("START", "spawn") == "fork":
            # Fork: each test's ranks start in milliseconds instead of
            # re-importing torch (seconds). Safe for nexar: this parent
            # process never creates a group, so libnexar (and its Go
            # runtime) is not loaded here.
            import torch.multiprocessing as mp

            self._start_processes(mp.get_context("fork").Process)
        else:
            self._spawn_processes()


if __name__ == "__main__":
    run_tests()
