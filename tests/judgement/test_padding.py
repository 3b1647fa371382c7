"""Padding and positions: padded positions are not model outputs, so the comparison core leaves them
out of every metric and verdict; left padding and a start position place each token where an
engine places it (``position_ids``), in every backend alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_framework.comparison import compare
from debug_framework.errors import ConfigurationError
from debug_framework.modelio import ModelInputs

from benchmarks.injected_bugs import BUG_LAYER

#: a ragged batch: row 0 full, row 1 with 5 positions of padding, row 2 with 9
RAGGED = {"input_shape": [3, 16], "pad_lengths": [0, 5, 9], "isolate": False, "precision_diagnosis": False}


def _zero_padded_rows(net: torch.nn.Module) -> None:
    """What a packed or paged engine does: nothing is written at padded positions (they read 0).
    Every module whose output is ``[batch, sequence, ...]`` gets its padded rows zeroed."""
    state: dict[str, torch.Tensor] = {}

    def remember(_module, _args, kwargs):
        state["mask"] = kwargs["attention_mask"]

    def zero(_module, _args, out):
        mask = state["mask"]
        hidden = out[0] if isinstance(out, tuple) else out
        if not isinstance(hidden, torch.Tensor) or tuple(hidden.shape[:2]) != tuple(mask.shape):
            return None
        hidden = hidden * mask.to(hidden.dtype)[..., None]
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    net.register_forward_pre_hook(remember, with_kwargs=True)
    for name, module in net.named_modules():
        if name and name.count(".") <= 2:  # the embedding, the layers, the final norm, the head
            module.register_forward_hook(zero)


@pytest.fixture
def padded_engine(patched_backend):
    """``make(name, bug_at=None)``: eager transformers that leaves padded positions at zero, with
    optionally a bug (a scaled MLP output) at one unpadded position of layer ``BUG_LAYER``."""

    def make(name: str, bug_at: tuple[int, int] | None = None) -> str:
        def patch(net) -> None:
            if bug_at is not None:
                b, t = bug_at

                def bug(_module, _args, out):
                    out = out.clone()
                    out[b, t] *= 1.05
                    return out

                net.model.layers[BUG_LAYER].mlp.register_forward_hook(bug)
            _zero_padded_rows(net)

        return patched_backend(name, patch)

    return make


def test_compare_leaves_padded_positions_out_and_keeps_full_indices():
    ref = torch.randn(2, 6, 4, dtype=torch.float64)
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2])
    alt = ref.clone()
    alt[1, 4:] = 0.0  # padded rows left at zero: not outputs
    assert not compare(ref, alt).passed
    ok = compare(ref, alt, positions=mask)
    assert ok.passed and ok.numel == 10 * 4 and ok.masked_positions == 2 and ok.reference_shape == (2, 6, 4)
    alt[1, 2, 3] += 1.0  # a real error at a token
    bad = compare(ref, alt, positions=mask)
    assert not bad.passed and bad.worst[0].index == (1, 2, 3)
    flat = compare(ref.reshape(12, 4), alt.reshape(12, 4), positions=mask)  # tokens flattened (router logits)
    assert not flat.passed and flat.worst[0].index == (8, 3) and flat.masked_positions == 2
    assert compare(ref[:, 0], alt[:, 0], positions=mask).masked_positions == 0  # not [batch, sequence]: whole


def test_select_positions_takes_an_attention_mask_as_its_boolean():
    """An integer attention mask selects its tokens' rows, never rows by index (one row: no IndexError)."""
    from debug_framework.comparison import select_positions

    t = torch.arange(12.0).reshape(1, 6, 2)
    assert select_positions(t, np.ones((1, 6), dtype=np.int64)).shape == (6, 2)
    left = select_positions(t, np.array([[0, 0, 1, 1, 1, 1]]))
    assert left.tolist() == t[0, 2:].tolist()


def test_an_engine_that_leaves_padding_at_zero_passes_and_a_real_bug_still_fails(tiny_models, engine,
                                                                                padded_engine):
    model = tiny_models("llama", 0)
    good = engine.run(engine.create_session(model, RAGGED, "python_reference", padded_engine("zero_pad")))
    assert good.passed, good.first_divergence
    assert all(r.comparison.masked_positions == 14 for r in good.results)  # 5 + 9 padded positions left out
    bugged = padded_engine("zero_pad_bug", bug_at=(2, 3))  # row 2 has 7 tokens: position 3 is one
    bad = engine.run(engine.create_session(model, RAGGED, "python_reference", bugged))
    assert not bad.passed and str(bad.first_divergence.key) == f"post_mlp:{BUG_LAYER}"
    assert tuple(bad.first_divergence.comparison.worst[0].index[:2]) == (2, 3)


@pytest.mark.parametrize("family,offset", [("llama", 40), ("bert", 40)])
def test_left_padding_and_a_start_position_pass_in_every_backend(tiny_models, engine, padded_engine, family, offset):
    cfg = {**RAGGED, "padding_side": "left", "position_offset": offset}
    result = engine.run(engine.create_session(tiny_models(family, 0), cfg, "python_reference",
                                              padded_engine("zero_pad_left")))
    assert result.passed, result.first_divergence
    assert result.results[0].comparison.masked_positions == 14


def test_left_padding_positions_are_each_rows_own():
    inputs = ModelInputs.random(50, 2, 6, seed=1, pad_lengths=[0, 2], padding_side="left")
    assert inputs.attention_mask.tolist() == [[1] * 6, [0, 0, 1, 1, 1, 1]]
    placed = inputs.with_positions(3)
    assert placed.position_ids().tolist() == [[3, 4, 5, 6, 7, 8], [3, 3, 3, 4, 5, 6]]
    assert ModelInputs.random(50, 2, 6, pad_lengths=[0, 2]).with_positions(0).position_ids() is None  # 0..T-1
    with pytest.raises(ConfigurationError):
        ModelInputs.random(50, 2, 6, padding_side="middle")


def test_wrong_positions_under_left_padding_are_caught(tiny_models, engine, patched_backend):
    """An engine that ignores the rows' own positions (0 .. T-1 whatever the padding) fails where
    positions are absolute (BERT's position embeddings; under rotary embeddings a whole row shifted
    by its padding is the same attention, exactly)."""
    def patch(net) -> None:
        def drop_positions(_module, args, kwargs):
            kwargs.pop("position_ids", None)
            return args, kwargs

        net.register_forward_pre_hook(drop_positions, with_kwargs=True)

    name = patched_backend("no_positions", patch)
    cfg = {**RAGGED, "padding_side": "left"}
    result = engine.run(engine.create_session(tiny_models("bert", 0), cfg, "python_reference", name))
    right = engine.run(engine.create_session(tiny_models("bert", 0), RAGGED, "python_reference", name))
    assert not result.passed and str(result.first_divergence.key) == "post_embedding"
    assert right.passed, right.first_divergence  # right padding: positions 0 .. T-1 are each row's own


def test_bad_padding_settings_are_config_errors(tiny_models, engine):
    for bad in ({"padding_side": "top"}, {"position_offset": -1}, {"position_offset": 1.5}):
        with pytest.raises(ConfigurationError):
            engine.create_session(tiny_models("llama", 0), bad, "python_reference", "pytorch")
