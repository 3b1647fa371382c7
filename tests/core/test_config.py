"""PIE_* environment overrides: parsed once at the edge, bad values are DF001 naming the variable."""

import pytest

from debug_framework.config import ENV_VARIABLES, from_environment, merge_config
from debug_framework.errors import FrameworkInitializationError


def test_every_documented_variable_is_read():
    env = {"PIE_DEBUG_ENABLED": "true", "PIE_DEBUG_LEVEL": "info", "PIE_DEBUG_DATABASE": "/tmp/x.db", "PIE_METAL_PATH": "/opt/k",
           "PIE_DEBUG_ARTIFACT_ROOT": "/mnt/team", "PIE_DEBUG_MEMORY_BUDGET": "2G", "PIE_DEBUG_CAPTURE_MEMORY": "16M"}
    got = from_environment(env)
    assert set(got) == set(ENV_VARIABLES.values())
    assert got == {"debug_enabled": True, "log_level": "INFO", "database_path": "/tmp/x.db", "metal_path": "/opt/k",
                   "artifact_root": "/mnt/team", "memory_budget": 2 * 2**30, "capture_memory_budget": 16 * 2**20}
    assert from_environment({"PIE_DEBUG_DATABASE": ""}) == {}  # empty means unset
    assert merge_config(got, {"comparison_tolerance": {"atol": 1.0}})["comparison_tolerance"] == {"rtol": 1e-4, "atol": 1.0}


@pytest.mark.parametrize("var,value", [("PIE_DEBUG_ENABLED", "maybe"), ("PIE_DEBUG_LEVEL", "LOUD"),
                                       ("PIE_DEBUG_MEMORY_BUDGET", "plenty")])
def test_bad_values_are_df001_naming_the_variable(var, value):
    with pytest.raises(FrameworkInitializationError) as e:
        from_environment({var: value})
    assert "DF001" in str(e.value) and var in str(e.value)
