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
# Headless Chromium renders the HTML reports in the browser tests; install it where we can.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "note: chromium could not be installed; browser tests will skip" >&2
fi
