#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as a failure" >&2
    exit 1
fi
exit "$rc"
