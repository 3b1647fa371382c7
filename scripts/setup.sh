#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv, PyTorch pinned to the CPU build 2.13.0 installed
# FIRST (so nothing can pull CUDA wheels), then this package with all its extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
if ! "$VPY" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
    "$VPY" -m pip install -q --disable-pip-version-check torch==2.13.0
fi
"$VPY" -m pip install -q --disable-pip-version-check -e ".[all]"
# Headless Chromium renders the HTML reports in the browser tests, and graphviz's dot draws the
# graphs of svg=True runs; install them where we can.
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v dot >/dev/null 2>&1 || missing="$missing graphviz"
if [ -n "$missing" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null) \
        || echo "note: could not install$missing; browser and SVG tests will skip" >&2
fi
