# keep each rank's last 256 operations; dump them into a directory on a timeout,
# and report who waits for whom if no rank progresses for 30 s
dir=$(mktemp -d)
NEXAR_FLIGHT_RECORDER_SIZE=256 nexar run -n 2 --flight-dir "$dir" --hang-timeout 30s -- python allreduce.py
rm -rf "$dir"
