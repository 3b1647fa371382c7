"""Acceptance on real weights: all-MiniLM-L6-v2, NumPy float64 reference vs PyTorch float32."""

from __future__ import annotations

import pytest

from debug_framework.backends import get_backend
from debug_framework.capture import all_checkpoints
from debug_framework.comparison import compare
from debug_framework.modelio import ModelInputs, load_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to dense vectors that capture meaning.",
    "Short one.",
]


@pytest.mark.slow
def test_minilm_reference_vs_pytorch_agree_at_every_checkpoint(minilm_path):
    model = load_model(minilm_path)
    inputs = ModelInputs.from_text(model.tokenizer, TEXTS)
    assert inputs.attention_mask.min() == 0  # the batch really has padding
    ref = get_backend("python_reference")
    ref.prepare(model, "float64")
    alt = get_backend("pytorch")
    alt.prepare(model, "float32", "cpu")
    a, b = ref.run(inputs), alt.run(inputs)
    assert list(a) == list(b) == all_checkpoints(6)
    real = inputs.attention_mask.astype(bool)  # padded positions are not outputs of the model
    for key in a:
        # float32 on activations up to ~30 in magnitude, six layers: observed max error ~6e-6
        res = compare(a[key][real], b[key].numpy()[real], rtol=1e-5, atol=2e-5, check_dtype=False)
        assert res.passed, (key, res.reason, res.max_abs_error)
    final = compare(a["post_processing"], b["post_processing"], check_dtype=False)
    assert final.max_abs_error <= 1e-4, final.max_abs_error
