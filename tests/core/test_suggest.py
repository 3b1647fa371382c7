"""Unknown names suggest the closest known one, the same way everywhere (debug_framework.suggest)."""

from __future__ import annotations

import pytest

from debug_framework.errors import ValidationError
from debug_framework.suggest import closest, did_you_mean, one_of


def test_closest_and_did_you_mean():
    assert closest("pytroch", ["python_reference", "pytorch", "inductor"]) == "pytorch"
    assert closest("BFLOAT16", ["float32", "bfloat16"]) == "bfloat16"  # case-insensitive, the choice as written
    assert closest("zzz", ["float32", "bfloat16"]) is None
    assert did_you_mean("jsno", ["json", "html"]) == " (did you mean 'json'?)"
    assert did_you_mean("zzz", ["json", "html"]) == ""
    assert one_of(["a", "b"]) == "use one of a, b"


def test_checkpoint_names_and_session_keys_suggest():
    from debug_framework.capture.keys import CheckpointKey
    from debug_framework.services.validation.plan import validate_session_config

    with pytest.raises(ValidationError, match=r"unknown checkpoint name 'post_mlpp' \(did you mean 'post_mlp'\?\)"):
        CheckpointKey.parse("post_mlpp:1")
    with pytest.raises(ValidationError, match=r"'isolte' \(did you mean 'isolate'\?\)"):
        validate_session_config({"isolte": True})
