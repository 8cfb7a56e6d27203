#!/bin/sh
# package_test.sh BUILD_DIR SRC_DIR CMAKE CXX LAUNCH: install nexar into a
# scratch prefix, then build and run (1) tests/cpp/find_package with
# find_package(nexar) and (2) tests/cpp/pkgconfig with pkg-config.
set -eu
build=$1 src=$2 cmake=$3 cxx=$4 launch=$5
work=$build/package-test
rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" >"$work/install.log"
libdir=$(dirname "$(find "$work/prefix" -name 'libnexar.so.0' | head -n 1)")
test -L "$libdir/libnexar.so" && test -L "$libdir/libnexar.so.0"

echo "== find_package(nexar)"
"$cmake" -S "$src/find_package" -B "$work/fp" -DCMAKE_PREFIX_PATH="$work/prefix" \
	-DCMAKE_CXX_COMPILER="$cxx" >"$work/fp.log"
"$cmake" --build "$work/fp" >>"$work/fp.log"
sh "$launch" 1 "$work/fp/consumer"
sh "$launch" 2 "$work/fp/consumer"

echo "== pkg-config --cflags --libs nexar"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
"$cxx" -std=c++17 -Wall -Wextra -Werror -o "$work/pc-consumer" "$src/pkgconfig/main.cpp" \
	$(pkg-config --cflags --libs nexar)
LD_LIBRARY_PATH="$libdir" sh "$launch" 1 "$work/pc-consumer"
echo "package ok"
