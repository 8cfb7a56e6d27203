#!/bin/sh
# scale64.sh [RUNS] [RANKS]: RUNS runs (default 20) of RANKS local ranks
# (default 64) of tests/c/test_collectives under `nexar run`, with default
# settings, on whatever else this host runs: issue 32's check that a live
# process is never declared dead under load (docs/fault-tolerance.md,
# "Failure detection"). Each run's output goes to build/scale64/run.N.log;
# one line per run, then the tally. Fails unless every run passed with no
# rank declared dead or unreachable.
set -eu
runs=${1:-20}
ranks=${2:-64}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
prog=build/cmake/tests/c/test_collectives
[ -x build/nexar ] || { echo "scale64.sh: build/nexar missing (make build)" >&2; exit 1; }
[ -x "$prog" ] || { echo "scale64.sh: $prog missing (make ctest builds it)" >&2; exit 1; }
out=build/scale64
mkdir -p "$out"
echo "scale64.sh: $runs runs of $ranks ranks, tree $(git log --oneline -1 2>/dev/null || echo unknown)"
pass=0
for i in $(seq 1 "$runs"); do
	start=$(date +%s)
	rc=0
	timeout 2400 build/nexar run -n "$ranks" -- "$prog" >"$out/run.$i.log" 2>&1 || rc=$?
	wall=$(($(date +%s) - start))
	dead=$(grep -c -E "unreachable|declared|no heartbeat" "$out/run.$i.log" || true)
	stalled=$(grep -c "stalled" "$out/run.$i.log" || true)
	[ "$rc" = 0 ] && [ "$dead" = 0 ] && pass=$((pass + 1))
	echo "run $i: rc=$rc wall=${wall}s dead/unreachable lines=$dead stall reports=$stalled load=$(cut -d' ' -f1 /proc/loadavg)"
done
echo "scale64.sh: $pass of $runs runs passed"
[ "$pass" = "$runs" ]
