#!/bin/sh
# asan.sh [quick|full]: libnexar, the Python extension and the C tests
# built with AddressSanitizer, then the torch tests, the stress test and
# the C tests run under it (make test-asan: full; make test: quick).
#
# - libnexar: capi/build.sh with GOFLAGS=-asan (Go instruments its own
#   loads and stores, copy() included, against ASan's shadow memory: a Go
#   write into a freed tensor is reported), into build/asan/py.
# - nexar._nexar: the extension compiled with -fsanitize=address next to
#   it; scripts/asan/sitecustomize.py makes Python import that one
#   (NEXAR_ASAN_EXT) instead of the editable install's.
# - Python runs with gcc's libasan (and libstdc++) in LD_PRELOAD (the interpreter is not
#   built with ASan; the runtime must be loaded first) and detect_leaks=0:
#   CPython and torch keep their interned objects, caches and thread
#   states until exit on purpose, so LeakSanitizer's report at exit would
#   be thousands of intended "leaks" with no bearing on nexar. Memory
#   errors (use after free, overflows, double free) abort the process
#   (halt_on_error, the default) and fail the test that ran it.
# - The C tests: the top-level CMake project in build/asan/cmake with
#   -fsanitize=address (the programs link libasan themselves), libnexar
#   built there with GOFLAGS=-asan too; run with ctest, leak detection on.
#
# quick: the Join regression test on 2 ranks, the dropped-Work lifetime
# test, the stress test (NEXAR_STRESS_CALLS, default 200) on 2 ranks and
# two C tests. full: every torch test (test_torch*.py), the stress test
# with 4000 calls on 2 and 3 ranks, and every C test.
set -eu
mode=${1:-full}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PYTHON=${PYTHON:-.venv/bin/python}
GO=${GO:-go}
CC=${CC:-gcc}
CXX=${CXX:-g++}
out=$root/build/asan
jobs=$(nproc 2>/dev/null || echo 2)
asan_cflags="-O1 -g -fno-omit-frame-pointer"
libasan=$("$CC" -print-file-name=libasan.so)
case $libasan in /*) ;; *) echo "asan.sh: $CC has no libasan.so (install libasan / gcc)" >&2; exit 1 ;; esac
# libstdc++ preloaded too: python does not link it, and ASan's __cxa_throw
# interceptor must find the real one when it starts, else the first C++
# exception (torch throws and catches some in DDP's constructor) aborts
# with "CHECK failed: ... real___cxa_throw".
libstdcxx=$("$CXX" -print-file-name=libstdc++.so.6)

# --- build -----------------------------------------------------------------
mkdir -p "$out/py"
echo "asan.sh: libnexar (go build -asan)"
GOFLAGS="${GOFLAGS:+$GOFLAGS }-asan" CGO_CFLAGS="$asan_cflags" CC="$CC" GO="$GO" \
	sh capi/build.sh "$out/py/libnexar.so.0"
ext=$out/py/_nexar$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ ! -f "$ext" ] || [ bindings/python/src/_nexar.cpp -nt "$ext" ] || [ include/nexar.h -nt "$ext" ] ||
	[ "$out/py/libnexar.so.0" -nt "$ext" ]; then
	echo "asan.sh: nexar._nexar (-fsanitize=address)"
	# shellcheck disable=SC2046 # pybind11 --includes is a list of flags
	"$CXX" -std=c++17 $asan_cflags -fsanitize=address -shared -fPIC -fvisibility=hidden \
		$("$PYTHON" -m pybind11 --includes) -Iinclude bindings/python/src/_nexar.cpp \
		"$out/py/libnexar.so.0" -Wl,-rpath,'$ORIGIN' -o "$ext.tmp"
	mv "$ext.tmp" "$ext"
fi
echo "asan.sh: C tests (-fsanitize=address)"
GOFLAGS="${GOFLAGS:+$GOFLAGS }-asan" CGO_CFLAGS="$asan_cflags" \
	cmake -S . -B "$out/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	-DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
	-DCMAKE_C_FLAGS="$asan_cflags -fsanitize=address" -DCMAKE_CXX_FLAGS="$asan_cflags -fsanitize=address" \
	-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address >/dev/null
GOFLAGS="${GOFLAGS:+$GOFLAGS }-asan" CGO_CFLAGS="$asan_cflags" cmake --build "$out/cmake" -j "$jobs"

# --- run -------------------------------------------------------------------
# Each process writes its report to the log as well (log_path), so that a
# report from a rank whose output a test swallowed is still seen.
rm -rf "$out/reports"
mkdir -p "$out/reports"
asan_common="abort_on_error=0:halt_on_error=1:log_path=$out/reports/asan:log_exe_name=1"
py() {
	LD_PRELOAD="$libasan $libstdcxx${LD_PRELOAD:+ $LD_PRELOAD}" ASAN_OPTIONS="detect_leaks=0:$asan_common" \
		PYTHONPATH="$root/scripts/asan${PYTHONPATH:+:$PYTHONPATH}" NEXAR_ASAN_EXT="$ext" \
		PATH="$root/build:$PATH" "$PYTHON" "$@"
}
ctests() {
	ASAN_OPTIONS="detect_leaks=1:$asan_common" ctest --test-dir "$out/cmake" --output-on-failure -j "$jobs" "$@"
}
py -c 'import nexar._nexar as m, sys; sys.exit(0 if m.__file__ == sys.argv[1] else "asan.sh: nexar._nexar is " + m.__file__)' "$ext"
status=0
if [ "$mode" = quick ]; then
	NEXAR_STRESS_CALLS=${NEXAR_STRESS_CALLS:-200} py -m pytest -q -p no:cacheprovider \
		"bindings/python/tests/test_torch_join.py::test_join_uneven_inputs[3,5]" \
		bindings/python/tests/test_torch_join.py::test_dropped_started_work_keeps_its_tensor \
		"bindings/python/tests/test_torch_stress.py::test_stress_every_collective[2]" || status=1
	ctests -R '^(c_collectives_n2|c_threads_n3)$' || status=1
else
	NEXAR_STRESS_CALLS=${NEXAR_STRESS_CALLS:-4000} py -m pytest -q -p no:cacheprovider \
		bindings/python/tests/test_torch*.py || status=1
	# cpp_package builds a consumer of the installed package with plain
	# flags (find_package, pkg-config): its program is not instrumented,
	# and ASan cannot start in it ("runtime does not come first"). It is a
	# packaging test; make test's ctest runs it.
	ctests -E '^cpp_package$' || status=1
fi
if ls "$out/reports"/asan* >/dev/null 2>&1; then
	echo "asan.sh: AddressSanitizer reports:" >&2
	for f in "$out/reports"/asan*; do echo "----- $f" >&2; cat "$f" >&2; done
	status=1
fi
[ "$status" = 0 ] && echo "asan.sh: $mode: clean"
exit "$status"
