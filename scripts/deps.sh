#!/usr/bin/env bash
# deps.sh installs what `make build` and `make test` need and is missing:
# Debian packages, the Go toolchain, Go modules and the Python virtualenv
# .venv. Every step checks first, so a second run changes nothing and
# finishes in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

GO_VERSION=${GO_VERSION:-1.26.8}
VENV=${VENV:-.venv}
APT_PACKAGES=(build-essential cmake ninja-build pkg-config iproute2 libibverbs-dev
	openmpi-bin libopenmpi-dev python3-mpi4py python3-venv
	slurmctld slurmd slurm-client munge)

say() { printf 'deps: %s\n' "$*"; }

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then
	sudo_cmd=(sudo)
fi

# --- Debian packages ---------------------------------------------------------
if command -v dpkg >/dev/null 2>&1; then
	missing=()
	for p in "${APT_PACKAGES[@]}"; do
		dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		say "installing ${missing[*]}"
		"${sudo_cmd[@]}" apt-get update -q
		DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
	fi
else
	say "not a Debian system: install ${APT_PACKAGES[*]} (or equivalents) yourself"
fi

# --- Go ------------------------------------------------------------------------
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null 2>&1; then
	arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
	case $arch in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
	say "installing Go $GO_VERSION into /usr/local/go (add /usr/local/go/bin to PATH)"
	tmp=$(mktemp -d)
	curl -fsSL -o "$tmp/go.tgz" "https://go.dev/dl/go$GO_VERSION.linux-$arch.tar.gz"
	"${sudo_cmd[@]}" tar -C /usr/local -xzf "$tmp/go.tgz"
	rm -rf "$tmp"
	export PATH=/usr/local/go/bin:$PATH
fi
# go.mod names the toolchain; an older local go fetches it (GOTOOLCHAIN=auto).
go mod download

# --- Python virtualenv -----------------------------------------------------------
# The stamp holds the hash of requirements-dev.txt that was installed, so a
# changed pin reinstalls and an unchanged one costs nothing.
stamp=$VENV/.nexar-deps-stamp
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ]; then
	say "creating $VENV"
	python3 -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
	say "installing requirements-dev.txt into $VENV (torch is large: this takes a while once)"
	"$VENV/bin/python" -m pip install -q --upgrade pip
	"$VENV/bin/python" -m pip install -q -r requirements-dev.txt
	echo "$want" >"$stamp"
fi
say "ok"
