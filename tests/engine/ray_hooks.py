"""Ray worker set-up for the Ray executor tests: registers the test backends in every Ray worker
process (``runtime_env={"worker_process_setup_hook": "ray_hooks.setup"}``), as a user would
register theirs."""

from __future__ import annotations

import os

from resource_backends import register


def setup() -> None:
    markers = os.environ.get("RAY_TEST_MARKERS")
    register("exit_once", "exit_once", markers)
    register("slowish", "slow:1.0", markers)
