#!/bin/sh
# gpu_check.sh: the real-CUDA checks of device memory staging (issue 13),
# from prebuilt test binaries, for a lent GPU machine with no Go toolchain.
#
#   scripts/gpu_check.sh build   where Go is: writes .devbin/ (git-excluded)
#   scripts/gpu_check.sh run     on the GPU machine, from the repository
#                                root with .devbin/ copied over
#
# run finds libcudart through NEXAR_CUDART, else ldconfig, /usr/local/cuda,
# or a pip-installed nvidia-cuda-runtime, and runs:
#   - hw/cuda's own tests (device round trip, pointer attributes);
#   - hw/cuda/stage TestRealCUDAAllreduce2Proc: staged allreduce of real
#     device memory between 2 processes, blocking and stream-ordered,
#     checked element by element, then staged-device against host busbw
#     (64 MiB, median of 7) printed by each rank;
#   - hw/nccl's real-NCCL tests (its fake-NCCL tests need a C compiler and
#     run where Go does);
#   - hier TestRealNCCLHier: the hierarchical collectives (NCCL within a
#     host, nexar between two simulated hosts) on real GPUs and NCCL,
#     checked element by element, then busbw of that path, of staging and
#     of host memory (64 MiB, median and p99 of 9) printed by each rank.
# Each prints what it ran; a test skips (saying why) without a device.
set -eu
cd "$(dirname "$0")/.."
bin=.devbin

case ${1:-} in
build)
	mkdir -p "$bin"
	for p in hw/cuda hw/cuda/stage hw/nccl hier; do
		name=$(echo "$p" | tr / _)
		CGO_ENABLED=1 go test -c -o "$bin/$name.test" "./$p"
	done
	ls -l "$bin"
	;;
run)
	if [ -z "${NEXAR_CUDART:-}" ]; then
		for c in $(ldconfig -p 2>/dev/null | awk '/libcudart\.so/ {print $NF}') \
			/usr/local/cuda/lib64/libcudart.so* \
			$(find /usr /opt /root /home -name 'libcudart.so*' 2>/dev/null | head -20); do
			if [ -f "$c" ]; then
				NEXAR_CUDART=$c
				break
			fi
		done
	fi
	echo "NEXAR_CUDART=${NEXAR_CUDART:-<none found>}"
	export NEXAR_CUDART="${NEXAR_CUDART:-}"
	if [ -z "${NEXAR_NCCL:-}" ]; then
		NEXAR_NCCL=$(find /usr /opt /root /home -name 'libnccl.so*' 2>/dev/null | head -1)
	fi
	export NEXAR_NCCL="${NEXAR_NCCL:-}"
	echo "NEXAR_NCCL=${NEXAR_NCCL:-<none found>}"
	command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not found"
	status=0
	echo "== hw/cuda"
	"$bin/hw_cuda.test" -test.v -test.count=1 || status=1
	echo "== hw/cuda/stage (real CUDA, 2 processes)"
	"$bin/hw_cuda_stage.test" -test.v -test.count=1 -test.run '^TestRealCUDAAllreduce2Proc$' || status=1
	echo "== hw/nccl"
	"$bin/hw_nccl.test" -test.v -test.count=1 -test.run '^(TestLibrary|TestAllReduce)$' || status=1
	echo "== hier (real NCCL and CUDA, 2 simulated hosts)"
	"$bin/hier.test" -test.v -test.count=1 -test.run '^TestRealNCCLHier$' || status=1
	echo "gpu_check: status $status"
	exit $status
	;;
*)
	echo "usage: $0 build|run" >&2
	exit 2
	;;
esac
