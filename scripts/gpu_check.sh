#!/bin/sh
# gpu_check.sh: nexar's device checks for a lent GPU machine, from binaries
# built here (the GPU machine builds nothing and needs no Go toolchain).
#
#   scripts/gpu_check.sh build     where Go is: .devbin/bundle.tgz (git-excluded;
#                                  carry .devbin to the GPU machine)
#   scripts/gpu_check.sh run       on the GPU machine, from the repository root:
#                                  figures under $OUT (default .devbin/out)
#   scripts/gpu_check.sh dry-run   here, against the fake CUDA runtime and fake
#                                  NCCL (tests/fakes): every part runs and must
#                                  pass, except torch's CUDA part, which the fakes
#                                  cannot reach (reported as not run); make test
#                                  runs it (gpu-check-dry)
#
# run's parts, each under its own time limit, each writing $OUT/<part>.json
# or .log, summed up in $OUT/summary.txt (exit status 1 if any failed):
#   matrix-staged  device allreduce of every dtype and op, blocking and on a
#                  stream, 2 processes, staged (device/gpucheck)
#   matrix-hier    the same through NCCL within a host and nexar between 2
#                  simulated hosts
#   collectives    broadcast, allgather, reduce-scatter, send/recv of device
#                  memory between 2 simulated hosts
#   bandwidth      allreduce bus bandwidth, 2 processes on GPU 0: nexar host
#                  memory, nexar staged device memory and NCCL's own allreduce
#                  in the same run (NCCL refuses 2 ranks on one GPU: then its
#                  error is the figure)
#   stage-real     hw/cuda/stage TestRealCUDAAllreduce2Proc
#   hier-real      hier TestRealNCCLHier (NCCL hierarchy, 2 simulated hosts,
#                  bus bandwidth of that path, staging and host memory)
#   nccl-real      hw/nccl TestLibrary, TestAllReduce
#   ddp            torch DDP on CUDA, 2 processes, "nexar" against "nccl":
#                  step time, final weights equal (scripts/gpu_check_ddp.py)
#   pycomm         nexar.Comm with torch CUDA tensors, their DLPack and
#                  __cuda_array_interface__ exports, CuPy where installed,
#                  blocking and stream= (scripts/gpu_check_pycomm.py)
# Whole run: under 8 minutes (each part's limit below; their sum is 440 s).
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
bin=$root/.devbin
GO=${GO:-go}
# The venv `make python` installs into, where there is one: build takes the
# extension and libnexar from it.
[ -x "$root/.venv/bin/python" ] && venvpy=$root/.venv/bin/python || venvpy=python3
PYTHON=${PYTHON:-$venvpy}

build() {
	stage=$(mktemp -d)
	trap 'rm -rf "$stage"' EXIT
	mkdir -p "$bin" "$stage/python"
	CGO_ENABLED=1 $GO build -ldflags='-s -w' -o "$stage/gpucheck" ./device/gpucheck
	for p in hw/cuda/stage hier hw/nccl; do
		CGO_ENABLED=1 $GO test -c -ldflags='-s -w' -o "$stage/$(echo "$p" | tr / _).test" "./$p"
	done
	# The Python package as `make python` installed it: sources from the
	# tree, the extension and libnexar from the venv (built for its Python).
	site=$($PYTHON -c 'import nexar._nexar as m, os; print(os.path.dirname(m.__file__))')
	cp -r bindings/python/nexar "$stage/python/nexar"
	find "$stage/python" -name __pycache__ -prune -exec rm -rf {} +
	cp "$site"/_nexar*.so "$site"/libnexar.so* "$stage/python/nexar/"
	$PYTHON -c 'import sys; print("%d.%d" % sys.version_info[:2])' >"$stage/python/VERSION"
	tar -C "$stage" -czf "$bin/bundle.tgz" .
	ls -l "$bin/bundle.tgz"
}

# part NAME LIMIT CMD...: runs CMD under LIMIT seconds, output to
# $OUT/NAME.log, and notes the outcome in $OUT/summary.txt.
part() {
	name=$1 limit=$2
	shift 2
	start=$(date +%s)
	if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
		res=ok
	else
		res="FAILED (status $?)"
		status=1
	fi
	printf '%-14s %-18s %4ss\n' "$name" "$res" $(($(date +%s) - start)) | tee -a "$OUT/summary.txt"
}

# gotest NAME LIMIT BINARY REGEXP: a test binary's tests; a skip is a failure
# (a GPU machine where they skip is not what this script is for).
gotest() {
	name=$1 limit=$2 t=$3 run=$4
	part "$name" "$limit" sh -c "'$work/$t' -test.v -test.count=1 -test.run '$run' && ! grep -q -- '--- SKIP' '$OUT/$name.log'"
}

run() {
	OUT=${OUT:-$bin/out}
	mkdir -p "$OUT"
	: >"$OUT/summary.txt"
	[ -f "$bin/bundle.tgz" ] || { echo "gpu_check: $bin/bundle.tgz is missing: run '$0 build' where Go is" >&2; exit 1; }
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	tar -C "$work" -xzf "$bin/bundle.tgz"
	if [ -z "${NEXAR_CUDART:-}" ]; then
		for c in $(ldconfig -p 2>/dev/null | awk '/libcudart\.so/ {print $NF}') /usr/local/cuda/lib64/libcudart.so* \
			$(find /usr /opt /root /home -name 'libcudart.so*' 2>/dev/null | head -20); do
			if [ -f "$c" ]; then
				NEXAR_CUDART=$c
				break
			fi
		done
	fi
	if [ -z "${NEXAR_NCCL:-}" ]; then
		NEXAR_NCCL=$(find /usr /opt /root /home -name 'libnccl.so*' 2>/dev/null | head -1)
	fi
	export NEXAR_CUDART="${NEXAR_CUDART:-}" NEXAR_NCCL="${NEXAR_NCCL:-}"
	{
		echo "date: $(date -u +%FT%TZ)"
		echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
		echo "NEXAR_CUDART=${NEXAR_CUDART:-<none found>}"
		echo "NEXAR_NCCL=${NEXAR_NCCL:-<none found>}"
		command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not found"
	} | tee "$OUT/machine.txt"
	status=0
	g=$work/gpucheck
	part matrix-staged 40 "$g" matrix -mode staged -counts "$counts" -out "$OUT/matrix-staged.json"
	part matrix-hier 40 "$g" matrix -mode hier -counts "$counts" -out "$OUT/matrix-hier.json"
	part collectives 45 "$g" collectives -counts "$counts" -out "$OUT/collectives.json"
	part bandwidth 60 "$g" bandwidth -sizes "$sizes" -iters "$iters" -out "$OUT/bandwidth.json"
	gotest stage-real 45 hw_cuda_stage.test '^TestRealCUDAAllreduce2Proc$'
	gotest hier-real 60 hier.test '^TestRealNCCLHier$'
	gotest nccl-real 15 hw_nccl.test '^(TestLibrary|TestAllReduce)$'
	# torch: the python the machine has, with nexar from the bundle.
	py=${GPU_CHECK_PYTHON:-python3}
	part ddp 90 env GPU_CHECK_NEXAR="$work/python" "$py" scripts/gpu_check_ddp.py --device cuda --backends nexar,nccl \
		--out "$OUT/ddp.json"
	part pycomm 45 env GPU_CHECK_NEXAR="$work/python" "$py" scripts/gpu_check_pycomm.py --out "$OUT/pycomm.json"
	for p in ddp pycomm; do
		if grep -q '"not_run"' "$OUT/$p.json" 2>/dev/null; then
			echo "$p: NOT RUN: $(sed -n 's/.*"not_run": "\(.*\)".*/\1/p' "$OUT/$p.json")" | tee -a "$OUT/summary.txt"
			[ -n "${GPU_CHECK_DRY:-}" ] || status=1
		fi
	done
	if [ -n "${GPU_CHECK_DRY:-}" ]; then
		# The fakes have no torch CUDA: the script itself runs on CPU, nexar
		# against gloo, so that a broken script shows here, not on the GPU.
		part ddp-cpu 240 env GPU_CHECK_NEXAR="$work/python" "$py" scripts/gpu_check_ddp.py --device cpu \
			--backends nexar,gloo --steps 4 --warmup 1 --width 128 --out "$OUT/ddp-cpu.json"
		grep -q "\"nexar\": \"$work/python/nexar\"" "$OUT/ddp-cpu.json" || {
			echo "ddp-cpu: nexar was not imported from the bundle ($work/python)" | tee -a "$OUT/summary.txt"
			status=1
		}
	fi
	echo "gpu_check: status $status (figures in $OUT)" | tee -a "$OUT/summary.txt"
	return $status
}

# dry_run: run against the fakes, then require every part's figures. The
# fakes' timings are not figures.
dry_run() {
	fakes=$(mktemp -d)
	OUT=${OUT:-$fakes/out}
	cc=${CC:-cc}
	$cc -std=c11 -O2 -shared -fPIC -o "$fakes/libfakecudart.so" tests/fakes/cudart/src/fake_cudart.c -lpthread
	$cc -std=c11 -O2 -shared -fPIC -o "$fakes/libfakenccl.so" tests/fakes/nccl/src/fake_nccl.c -lpthread -ldl -lrt
	# The names the real-hardware tests look for (cuda.Default, nccl.Default).
	ln -s libfakecudart.so "$fakes/libcudart.so"
	ln -s libfakenccl.so "$fakes/libnccl.so.2"
	export LD_LIBRARY_PATH="$fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export NEXAR_CUDART="$fakes/libfakecudart.so" NEXAR_NCCL="$fakes/libfakenccl.so" NEXAR_FAKE_CUDA_DELAY_US=20
	export GPU_CHECK_DRY=1 GPU_CHECK_PYTHON="${PYTHON}" OUT
	status=0
	(run) || status=1
	fail() {
		echo "gpu_check dry-run: $*" >&2
		status=1
	}
	jsonok() { # FILE: the JSON's "ok" is true
		[ -f "$1" ] && $PYTHON -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] is True else 1)' "$1"
	}
	for p in matrix-staged matrix-hier collectives bandwidth ddp-cpu; do
		jsonok "$OUT/$p.json" || fail "$p: no passing figures in $OUT/$p.json"
	done
	for p in stage-real:TestRealCUDAAllreduce2Proc hier-real:TestRealNCCLHier nccl-real:TestAllReduce; do
		grep -q -- "--- PASS: ${p#*:}" "$OUT/${p%%:*}.log" 2>/dev/null || fail "${p%%:*}: ${p#*:} did not pass against the fakes"
	done
	for p in ddp pycomm; do
		$PYTHON -c 'import json, sys; sys.exit(0 if "not_run" in json.load(open(sys.argv[1])) else 1)' "$OUT/$p.json" ||
			fail "$p: torch's CUDA part says neither a result nor why it did not run ($OUT/$p.json)"
	done
	grep -h . "$OUT/summary.txt" >/dev/null || fail "no summary"
	if [ $status -ne 0 ]; then
		for f in "$OUT"/*.log; do
			echo "----- $f"
			tail -40 "$f"
		done
	fi
	rm -rf "$fakes"
	echo "gpu_check dry-run: status $status"
	return $status
}

case ${1:-} in
build) build ;;
run)
	counts=7,65537,1048579 sizes=1048576,16777216,67108864 iters=9
	run
	;;
dry-run)
	counts=7,4099 sizes=65536,1048576 iters=3
	# Always built, and into a scratch directory: the dry run is of this
	# tree, and leaves no bundle behind in .devbin.
	bin=$(mktemp -d)
	build
	dry_run || { rm -rf "$bin"; exit 1; }
	rm -rf "$bin"
	;;
*)
	echo "usage: $0 build|run|dry-run" >&2
	exit 2
	;;
esac
