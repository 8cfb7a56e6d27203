"""Run PyTorch's own torch/testing/_internal/distributed/distributed_test.py
against a backend through its plugin hook.

    BACKEND=nexar WORLD_SIZE=2 python run_dist_tests.py [-k pattern] [-v]
    BACKEND=gloo  WORLD_SIZE=2 python run_dist_tests.py ...
    START=fork ...   start each test's ranks with fork (fast) instead of spawn
    RESULTS=f.jsonl  also write each test's outcome to f.jsonl (docs/torch-compat.md)
    GATES=gloo       also run the tests the suite gates on gloo's name, on nexar

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

# GATES=gloo: import the suite as if for gloo, so that its tests gated on
# the backend's name ("requires gloo", "only gloo supports ...") are
# defined, then run them on nexar: what nexar does where the suite would
# not look (docs/torch-compat.md).
if os.environ.get("GATES") == "gloo" and BACKEND != "gloo":
    os.environ["BACKEND"] = "gloo"
    import torch.testing._internal.distributed.distributed_test as _dt  # noqa: E402

    os.environ["BACKEND"] = BACKEND
    _dt.BACKEND = BACKEND
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


def _run_with_results(path):
    """Run every test (argv filters apply) and write one JSON line per test:
    {"test", "outcome": passed|skipped|failed|error, "detail"}."""
    import json
    import unittest

    class Result(unittest.TextTestResult):
        def _rec(self, test, outcome, detail=""):
            with open(path, "a") as f:
                f.write(json.dumps({"test": test.id().split(".")[-1], "outcome": outcome,
                                    "detail": str(detail)[-2000:]}) + "\n")

        def addSuccess(self, test):
            super().addSuccess(test)
            self._rec(test, "passed")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._rec(test, "skipped", reason)

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._rec(test, "failed", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            self._rec(test, "error", self._exc_info_to_string(err, test))

    open(path, "w").close()
    argv = [sys.argv[0]] + [a for a in sys.argv[1:]]
    unittest.main(module="__main__", argv=argv, testRunner=unittest.TextTestRunner(resultclass=Result, verbosity=1))


if __name__ == "__main__":
    if os.environ.get("RESULTS"):
        _run_with_results(os.environ["RESULTS"])
    else:
        run_tests()
