#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv, PyTorch pinned to the CPU build 2.13.0 installed
# FIRST (so nothing can pull CUDA wheels), then this package with all its extras.
#
# TORCH_INDEX_URL: install torch 2.13.0 from another wheel index instead of pip's configured one, e.g.
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash scripts/setup.sh
# (unset here: pip's own configuration, which holds the CPU build). An existing .venv keeps the torch it
# has when that is already 2.13.0: remove .venv to switch builds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
if ! "$VPY" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        echo "installing torch==2.13.0 from $TORCH_INDEX_URL" >&2
        "$VPY" -m pip install -q --disable-pip-version-check --index-url "$TORCH_INDEX_URL" torch==2.13.0
    else
        "$VPY" -m pip install -q --disable-pip-version-check torch==2.13.0
    fi
fi
"$VPY" -m pip install -q --disable-pip-version-check -e ".[all]"
# Headless Chromium renders the HTML reports in the browser tests, and graphviz's dot draws the
# graphs of svg=True runs; install them where we can.
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v dot >/dev/null 2>&1 || missing="$missing graphviz"
# initdb + pg_ctl start a throwaway PostgreSQL server for the tests that run on both database engines
{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } \
    || missing="$missing postgresql"
if [ -n "$missing" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null) \
        || echo "note: could not install$missing; browser, SVG and PostgreSQL tests will skip" >&2
fi
