"""Each block is judged on the reference's input to it: an attention-only bug in layer 1 marks only
layer 1's attention, an MLP-only bug only its MLP (eager Hugging Face modules, where the MLP block is
fed the reference's post-attention state through the attention seam; and a user runner's run_block).
"""

from __future__ import annotations

import pytest

from benchmarks.injected_bugs import BUG_LAYER

ATTENTION_ONLY = [("attention_scale", "llama"), ("attention_scale", "bert"), ("kv_head_mapping", "qwen2")]
MLP_ONLY = [("dropped_mlp_norm_weight", "llama"), ("gelu_variant", "bert"), ("dropped_bias_bert", "bert")]


def _marks(engine, model, backend):
    result = engine.run(engine.create_session(model, {"isolate": True}, "python_reference", backend))
    rows = {r.id: r for r in result.results}
    introduced = sorted(k for k, r in rows.items() if r.introduces_error)
    return result, rows, introduced


@pytest.mark.parametrize(("bug", "family"), ATTENTION_ONLY)
def test_an_attention_only_bug_marks_only_the_attention(bug, family, tiny_models, engine, bug_backend):
    result, rows, introduced = _marks(engine, tiny_models(family, 0), bug_backend(bug))
    assert BUG_LAYER == 1 and introduced == ["post_attention:1"], introduced
    assert result.isolation[1].verdict.blocks == ["attention"]
    mlp = rows["post_mlp:1"].introduced
    assert mlp is not None and mlp.block == "mlp" and mlp.input == "reference" and mlp.judgement.passed
    assert mlp.judgement.margin < 1  # the MLP replayed on the reference's post-attention state is exact


@pytest.mark.parametrize(("bug", "family"), MLP_ONLY)
def test_an_mlp_only_bug_marks_only_the_mlp(bug, family, tiny_models, engine, bug_backend):
    result, rows, introduced = _marks(engine, tiny_models(family, 0), bug_backend(bug))
    assert introduced == ["post_mlp:1"], introduced
    assert result.isolation[1].verdict.blocks == ["mlp"]
    assert rows["post_attention:1"].introduced.judgement.passed and rows["post_attention:1"].passed
    assert result.first_divergence.id == "post_mlp:1" and result.error_source["block"] == "mlp"


def test_without_run_block_the_mlp_is_not_judged_apart_after_a_failing_attention(tiny_models, engine):
    """A backend that cannot run the MLP block alone: the MLP is not blamed for the attention's error;
    the layer entry says why it was not judged apart."""
    import numpy as np

    from debug_framework.architectures.llama import LlamaReference
    from debug_framework.backends import register_backend, unregister_backend, user_backend
    from debug_framework.capture import CheckpointKey

    class Scaled(LlamaReference):  # attention output doubled in layer 1
        def attention(self, i, x, mask):
            out = super().attention(i, x, mask)
            return 2 * out if i == 1 else out

    class Runner:
        def __init__(self, model, dtype, device):
            self.net = Scaled(model.config, model.weights, np.float32)

        def run(self, inputs, keys):
            out = self.net.forward(inputs.input_ids, inputs.attention_mask, {tuple(k) for k in keys})
            return {CheckpointKey(*k): v for k, v in out.items()}

        def run_layer(self, i, hidden_in, inputs):
            return self.net.layer(i, np.asarray(hidden_in, np.float32), inputs.attention_mask)

    register_backend("scaled_no_blocks", user_backend("scaled_no_blocks", Runner, dtypes=("float32",)), replace=True)
    try:
        result, rows, introduced = _marks(engine, tiny_models("llama", 0), "scaled_no_blocks")
    finally:
        unregister_backend("scaled_no_blocks")
    assert introduced == ["post_attention:1"] and rows["post_mlp:1"].introduced is None
    layer1 = result.isolation[1]
    assert layer1.verdict.blocks == ["attention"] and layer1.verdict.mlp is None
    assert "run_block" in layer1.evidence.mlp_note
