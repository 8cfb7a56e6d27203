"""Loaded at start-up by the Python processes of `make test-asan`
(scripts/asan.sh puts this directory on PYTHONPATH): nexar._nexar is
taken from NEXAR_ASAN_EXT, the extension built with -fsanitize=address
next to a libnexar built with go build -asan, instead of the one the
editable install maps (whose finder comes first on sys.meta_path
otherwise). Nothing is imported until a program imports nexar."""

import importlib.machinery
import importlib.util
import os
import sys


class _AsanExtension:
    def __init__(self, path: str):
        self._path = path

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "nexar._nexar":
            return None
        return importlib.util.spec_from_file_location(
            fullname, self._path, loader=importlib.machinery.ExtensionFileLoader(fullname, self._path))


_ext = os.environ.get("NEXAR_ASAN_EXT", "")
if _ext:
    if not os.path.isfile(_ext):
        raise SystemExit(f"scripts/asan/sitecustomize.py: NEXAR_ASAN_EXT={_ext} does not exist")
    sys.meta_path.insert(0, _AsanExtension(_ext))
