#!/bin/sh
# launch.sh N PROGRAM [ARGS...] runs N ranks of PROGRAM on this host.
#
# With NEXAR_CLI naming an executable `nexar` binary it runs
# `nexar run -n N -- PROGRAM ARGS`. Otherwise it starts the N processes
# itself with the environment `nexar run` sets (NEXAR_RANK,
# NEXAR_WORLD_SIZE, NEXAR_SEED, NEXAR_TOKEN) and fails if any rank fails.
# Every rank runs under a deadline (NEXAR_TEST_TIMEOUT seconds, default 120).
set -u
n=$1
shift
limit=${NEXAR_TEST_TIMEOUT:-120}
if [ -n "${NEXAR_CLI:-}" ] && [ -x "$NEXAR_CLI" ]; then
	exec timeout "$limit" "$NEXAR_CLI" run -n "$n" -- "$@"
fi
port=$((20000 + $$ % 20000))
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
pids=""
r=0
while [ "$r" -lt "$n" ]; do
	NEXAR_RANK=$r NEXAR_WORLD_SIZE=$n NEXAR_SEED=127.0.0.1:$port NEXAR_TOKEN=$token \
		timeout "$limit" "$@" &
	pids="$pids $!"
	r=$((r + 1))
done
status=0
for p in $pids; do
	wait "$p" || status=1
done
exit $status
