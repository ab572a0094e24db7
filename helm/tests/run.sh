#!/usr/bin/env bash
# Runs the Helm chart tests (helm/tests/test_chart.py) with pytest.
#
# Installs what they need when missing: pytest, helm-python-sdk (the Helm v4 SDK; no `helm`
# binary needed) and kubernetes-validate (Kubernetes JSON schemas), and builds the shoal
# binaries (and shoal-kubeapi, the Kubernetes API test server the cluster-aware renders use)
# when target/debug has none (scripts/test.sh has built them already).
# Extra arguments go to pytest (e.g. `bash helm/tests/run.sh -k rbac`).
set -euo pipefail
cd "$(dirname "$0")/../.."

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "installing python3-pip..."
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
fi

pip_install() {
  # Debian's Python refuses system-wide installs (PEP 668) unless told otherwise.
  python3 -m pip install -q --disable-pip-version-check "$@" 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages "$@"
}

# module -> PyPI package; install only what does not import.
missing=()
for pair in pytest:pytest helm_python:helm-python-sdk kubernetes_validate:kubernetes-validate yaml:PyYAML; do
  module="${pair%%:*}"
  package="${pair#*:}"
  python3 -c "import $module" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (pip)..."
  pip_install "${missing[@]}"
fi

bin_dir="${SHOAL_BIN_DIR:-target/debug}"
if [ ! -x "$bin_dir/shoal-server" ] || [ ! -x "$bin_dir/shoal-ingester" ]; then
  echo "building shoal-server and shoal-ingester..."
  cargo build -p shoal-server -p shoal-ingester --bins --quiet
fi
# The Kubernetes API test server, for cluster-aware renders (the chart's lookup calls).
if [ ! -x "$bin_dir/shoal-kubeapi" ]; then
  echo "building shoal-kubeapi..."
  cargo build -p shoal-tests --bin shoal-kubeapi --quiet
fi

# No .pytest_cache or __pycache__ in the source tree.
export PYTHONDONTWRITEBYTECODE=1
set +e
python3 -m pytest -p no:cacheprovider -q -rs "helm/tests/test_chart.py" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  # pytest's "no tests collected" must never pass for a green run.
  echo "helm/tests/run.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
