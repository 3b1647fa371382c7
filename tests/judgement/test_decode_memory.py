"""Decode at engine speed (issue 47): a long prefill's eager attention a block of query rows at a
time (the same arithmetic, a fraction of the scores held); a streamed reference's weights held for a
whole decode; the calibration's last-position cut of a tensor of flattened tokens (a router's logits)."""

from __future__ import annotations

import numpy as np
import torch

from debug_framework.backends import get_backend


def test_eager_attention_in_blocks_of_query_rows_is_the_same_computation(tiny_models, monkeypatch):
    """A padded prefill longer than a block: every checkpoint what eager attention computes at once
    (to a rounding of the products), and the reference says how it ran."""
    from debug_framework.backends import _attention_rows
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.modelio.loader import load_model

    monkeypatch.setattr(_attention_rows, "QUERY_ROWS", 3)
    model = load_model(tiny_models("llama", 0))
    ids = np.arange(2 * 10, dtype=np.int64).reshape(2, 10) % 50
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    inputs = ModelInputs(input_ids=ids, attention_mask=mask)
    runs = {}
    for blocks in (True, False):
        backend = get_backend("float64_eager")
        if not blocks:
            monkeypatch.setattr("debug_framework.backends.eager_reference.attention_in_row_blocks", lambda m: False)
        backend.prepare(model, "float32")
        assert backend.row_blocks is blocks
        assert ("query rows at a time" in backend.version_info()["attention"]) is blocks
        runs[blocks] = backend.run(inputs)
    assert runs[True].tensors.keys() == runs[False].tensors.keys()
    for key, value in runs[False].tensors.items():
        a, b = torch.as_tensor(runs[True].tensors[key]), torch.as_tensor(value)
        # the same arithmetic per row: products over fewer rows may take another kernel, a rounding apart
        assert float((a - b).abs().max()) <= 4 * torch.finfo(torch.float32).eps * float(b.abs().max()), key


def test_the_calibrations_last_position_of_flattened_tokens_is_each_rows_last_token():
    from debug_framework.services.validation.decode_calibration import _last_position

    logits = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2 * 5, 3)  # [batch * tokens, experts]
    assert torch.equal(_last_position(logits, 2), logits.reshape(2, 5, 3)[:, -1])
    hidden = torch.arange(2 * 5 * 4, dtype=torch.float32).reshape(2, 5, 4)
    assert torch.equal(_last_position(hidden, 2), hidden[:, -1:])


def test_the_from_math_reference_converts_each_layer_once_for_a_whole_decode(tiny_models):
    """A streamed reference holds its converted layers and LM head while it decodes (they were
    converted again at every step) and streams again afterwards."""
    from debug_framework.backends.decode import collect_run
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.modelio.loader import load_model

    backend = get_backend("python_reference")
    backend.prepare(load_model(tiny_models("llama", 0)), "float64")
    net = backend.reference
    assert net.layers.keep == 1 and not net.params.resident  # streamed
    ids = np.arange(12, dtype=np.int64).reshape(2, 6) % 50
    before = net.layers.conversions
    run = collect_run(backend.iter_decode(ModelInputs(input_ids=ids, attention_mask=np.ones_like(ids)), 4), 4)
    assert len(run.captures) == 5
    assert net.layers.conversions - before == len(net.layers)  # once each, not once per pass
    assert net.layers.keep == 1 and len(net.layers.resident_layers()) == 1 and not net.params._values


def test_a_decode_leaves_older_objects_out_of_the_collectors_full_passes_and_anothers_freeze_alone():
    import gc

    from debug_framework.services.validation.memory import older_objects_frozen

    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        assert gc.get_freeze_count() > 0  # what existed before is out of the full passes
        made = [[] for _ in range(3)]
        assert gc.is_tracked(made)
    assert gc.get_freeze_count() == 0  # all of it back after
    gc.freeze()  # someone else's freeze: not undone by ours (frozen objects may still be freed meanwhile)
    try:
        with older_objects_frozen():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
