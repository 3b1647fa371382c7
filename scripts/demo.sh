#!/usr/bin/env bash
# Set up (idempotent) and run the main job end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m debug_framework.demo "$@"
