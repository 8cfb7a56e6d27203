#!/bin/sh
# check_exports.sh LIB HEADER: the library exports exactly the functions
# declared in the header (nexar_* only: no Go runtime or cgo symbols).
set -eu
lib=$1
hdr=$2
tmp=${TMPDIR:-/tmp}/nexar-exports.$$
trap 'rm -f "$tmp".*' EXIT
nm -D --defined-only "$lib" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort >"$tmp.lib"
sed -nE 's/^[a-z_ *]*[ *](nexar_[a-z0-9_]+)\(.*/\1/p' "$hdr" | sort -u >"$tmp.hdr"
if grep -v '^nexar_' "$tmp.lib"; then
	echo "FAIL: $lib exports symbols outside nexar_* (above)" >&2
	exit 1
fi
if ! diff -u "$tmp.hdr" "$tmp.lib"; then
	echo "FAIL: exports differ from the functions of $hdr (- header only, + library only)" >&2
	exit 1
fi
echo "ok: $(wc -l <"$tmp.lib") nexar_* symbols, nothing else"
