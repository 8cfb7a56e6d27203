# Start two ranks by hand (what a launcher does), the secret in a file
# instead of the environment (/proc/PID/environ is readable by the same user).
umask 077
tok=$(mktemp)
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$tok"
port=$(python -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
    NEXAR_RANK=$r NEXAR_WORLD_SIZE=2 NEXAR_SEED=127.0.0.1:$port NEXAR_TOKEN_FILE=$tok \
        python allreduce.py &
done
wait %1 && wait %2
status=$?
rm -f "$tok"
exit $status
