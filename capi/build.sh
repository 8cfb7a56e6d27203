#!/bin/sh
# build.sh builds libnexar.so from ./capi; used by the Makefile and CMake.
#
#   capi/build.sh [OUTPUT]     (default build/libnexar.so, relative to the repo root)
#
# - SONAME libnexar.so.0 and a version script (capi/exports.map) so that only
#   nexar_* symbols are exported (tests/c/check_exports.sh verifies it).
# - The hash of include/nexar.h goes into CGO_CFLAGS because cgo does not
#   notice changes to headers outside the package directory; a changed
#   header therefore changes the build cache key and forces a recompile.
# - The header cgo generates is deleted: include/nexar.h is the only public one.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-build/libnexar.so}
case $out in /*) ;; *) out=$root/$out ;; esac
GO=${GO:-go}
hdr=$(cksum <"$root/include/nexar.h" | cut -d' ' -f1)
mkdir -p "$(dirname "$out")"
cd "$root"
CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -DNEXAR_HEADER_CKSUM=$hdr" \
	"$GO" build -buildmode=c-shared -trimpath \
	-ldflags "-s -w -extldflags '-Wl,-soname,libnexar.so.0 -Wl,--version-script=$root/capi/exports.map'" \
	-o "$out" ./capi
rm -f "${out%.*}.h"
# Programs linked against the SONAME find it next to the library (unless the
# output is named by the SONAME already, as in the Python build).
if [ "$(basename "$out")" != libnexar.so.0 ]; then
	ln -sf "$(basename "$out")" "$(dirname "$out")/libnexar.so.0"
fi
