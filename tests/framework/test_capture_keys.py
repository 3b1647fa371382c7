import json

import pytest

from debug_framework.capture import Capture, CheckpointKey, CheckpointSelection, all_checkpoints
from debug_framework.errors import ValidationError


def test_key_json_round_trip_and_parse_forms():
    key = CheckpointKey("post_attention", 3)
    assert key.to_json() == {"checkpoint": "post_attention", "layer": 3}
    assert CheckpointKey.from_json(json.loads(json.dumps(key.to_json()))) == key
    assert CheckpointKey.parse("post_attention:3") == key
    assert CheckpointKey.parse(("post_attention", 3)) == key
    assert CheckpointKey.parse("post_embedding") == CheckpointKey("post_embedding", None)
    assert str(key) == "post_attention:3"
    assert key == ("post_attention", 3)  # a NamedTuple: plain tuples compare equal


@pytest.mark.parametrize("bad", [("post_everything", None), ("post_mlp", None), ("post_embedding", 2), ("post_mlp", -1)])
def test_invalid_keys_raise_df005(bad):
    with pytest.raises(ValidationError) as info:
        CheckpointKey(*bad).validate()
    assert info.value.code == "DF005"


@pytest.mark.parametrize("bad", ["post_mlp:two", ("post_mlp",), ("post_mlp", "x"), {"layer": 1}, {"checkpoint": "post_mlp", "layer": "x"}])
def test_malformed_checkpoint_text_raises_df005_not_a_bare_error(bad):
    with pytest.raises(ValidationError) as info:
        CheckpointKey.parse(bad)
    assert info.value.code == "DF005"
    assert bad not in Capture()


def test_all_checkpoints_order():
    keys = all_checkpoints(2)
    assert [str(k) for k in keys] == [
        "post_embedding", "post_attention:0", "post_mlp:0", "post_attention:1", "post_mlp:1", "post_processing",
    ]


def test_selection_by_name_and_layer_range():
    sel = CheckpointSelection(names={"post_mlp", "post_processing"}, layers=(1, 3))
    assert [str(k) for k in sel.keys(4)] == ["post_mlp:1", "post_mlp:2", "post_processing"]
    only_layers = CheckpointSelection(layers=(0, 1))
    assert [str(k) for k in only_layers.keys(3)] == ["post_embedding", "post_attention:0", "post_mlp:0", "post_processing"]
    assert CheckpointSelection.coerce(["post_mlp:1", "post_embedding"], 3) == [
        CheckpointKey("post_embedding"), CheckpointKey("post_mlp", 1)
    ]
    with pytest.raises(ValidationError):
        CheckpointSelection.coerce(["post_mlp:7"], 3)
    with pytest.raises(ValidationError):
        CheckpointSelection(names={"nope"})


def test_capture_is_a_mapping_keyed_by_checkpoint():
    cap = Capture(tensors={CheckpointKey("post_mlp", 0): 1.0}, backend="x")
    assert cap["post_mlp:0"] == 1.0 and cap[("post_mlp", 0)] == 1.0
    assert "post_mlp:0" in cap and "post_mlp:1" not in cap and "garbage" not in cap
    assert list(cap) == [CheckpointKey("post_mlp", 0)]
