#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on PYTEST_WORKERS worker processes (default 2,
# pytest-xdist; 0 runs it in this process). Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow"` for the quick subset.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
workers=${PYTEST_WORKERS:-2}
if [ "$workers" = "0" ]; then
    .venv/bin/python -m pytest "$@"
else
    # loadscope: a module's tests stay on one worker, so its module-scoped fixtures are built once
    .venv/bin/python -m pytest -n "$workers" --dist loadscope --durations=25 "$@"
fi
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as a failure" >&2
    exit 1
fi
exit "$rc"
