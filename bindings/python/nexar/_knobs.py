"""The environment knobs that the Python layers read themselves (the rest
are read by libnexar, from the same table: core/knobs.go).

Generated from core/knobs.go (go test ./core -run TestKnobFilesGenerated
-update-knobs); do not edit.

env(name) is the one place in the Python package that reads a NEXAR_*
variable; a name that is not in the table is a KeyError, so a knob cannot be
read without being declared and documented (docs/reference/env.md).
"""

from __future__ import annotations

import os
from typing import Optional

# The knobs the Python package reads itself.
PYTHON = frozenset({
    "NEXAR_ADVERTISE_ADDR",
    "NEXAR_ADVERTISE_HOST",
    "NEXAR_CONNECT_TIMEOUT",
    "NEXAR_SEED",
    "NEXAR_TIMEOUT",
    "NEXAR_TOKEN",
    "NEXAR_TORCH_HUGEPAGE_MIN",
})


def env(name: str) -> Optional[str]:
    """The value of the knob name in the environment, stripped; None when
    it is unset or blank. KeyError for a name the table does not declare."""
    if name not in PYTHON:
        raise KeyError(f"nexar: {name} is not a knob the Python package reads (core/knobs.go)")
    v = os.environ.get(name, "").strip()
    return v or None
