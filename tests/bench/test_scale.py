"""bench_scale's models: the documented shapes' sizes, and a written model the loader reads as written."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_scale


@pytest.mark.parametrize("name, billions", [("0.1B", 0.125), ("0.5B", 0.55), ("1.2B", 1.24), ("8B", 8.03)])
def test_shapes_have_the_documented_sizes(name, billions):
    assert bench_scale.parameters(name) / 1e9 == pytest.approx(billions, abs=0.005)


def test_written_model_loads_with_its_shapes_and_bfloat16_weights(tmp_path, monkeypatch):
    from debug_framework.modelio import load_model

    monkeypatch.setitem(bench_scale.SHAPES, "tiny", (32, 48, 2, 4, 2, 40, True))
    model = load_model(bench_scale.write_model("tiny", tmp_path / "tiny"))
    shapes = bench_scale.tensor_shapes("tiny")
    assert sorted(model.weights) == sorted(shapes) and "lm_head.weight" not in shapes  # tied
    assert all(model.weights.shape(n) == s and model.weights.dtype_name(n) == "BF16" for n, s in shapes.items())
    assert np.all(model.weights.numpy("model.norm.weight") == 1.0)
    q = model.weights.numpy("model.layers.1.self_attn.q_proj.weight")
    assert 0.01 < q.std() < 0.03
    assert model.num_layers == 2 and model.config.vocab_size == 40


def test_the_olmo2_family_is_written_for_the_generic_tier(tmp_path, monkeypatch):
    """The same shape as OLMo-2: loaded on the generic tier (judged by float64_eager), every tensor
    of the transformers model present."""
    from debug_framework.backends import get_backend
    from debug_framework.modelio import load_model

    monkeypatch.setitem(bench_scale.SHAPES, "tiny", (32, 48, 2, 4, 2, 40, True))
    model = load_model(bench_scale.write_model("tiny", tmp_path / "tiny", family="olmo2"))
    assert model.architecture == "generic" and model.config.model_type == "olmo2"
    assert sorted(model.weights) == sorted(bench_scale.tensor_shapes("tiny", "olmo2"))
    backend = get_backend("float64_eager")
    backend.prepare(model, "float64")  # DF004 if a tensor the model has were missing
    assert backend.streaming



def test_a_plain_load_that_cannot_fit_is_named_and_refused(monkeypatch, tmp_path, capsys):
    gib = 2**30
    assert bench_scale.too_big("1.2B", None, 24 * gib) is None
    reason = bench_scale.too_big("8B", None, 24 * gib)
    assert reason and "float32" in reason and "29.9" in reason and "--dtype bfloat16" in reason
    assert bench_scale.too_big("8B", "bfloat16", 24 * gib) is None
    monkeypatch.setattr(bench_scale, "machine_memory", lambda: 24 * gib)
    with pytest.raises(SystemExit) as exit_:  # refused before any model is written
        bench_scale.main(["--sizes", "0.1B", "--with-8b", "--keep", str(tmp_path / "models")])
    assert exit_.value.code == 2 and "--dtype bfloat16" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()
