"""``executorch`` decode (``--decode-steps``): the model exported with a static KV cache held in the
program (methods ``prefill`` and ``decode`` sharing it), the session's left-padded rows stepped
through it teacher-forced, every step's checkpoints and the cache the program wrote judged; a wrong
position in the exported step alone found at its step and layer; a user's program refused with what
is supported.

Slow: each session exports the model's program for the prefill's comparison and the two-method decode
program (portable kernels), on a 2-layer Llama of hidden 32 with grouped-query attention (the cache
has fewer heads than the queries).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("executorch")

pytestmark = pytest.mark.slow

#: two steps over two rows, the second padded on the left by 3
DECODE = {"decode_steps": 2, "isolate": False, "precision_diagnosis": False, "input_shape": [2, 8],
          "pad_lengths": [0, 3], "padding_side": "left", "alternative_options": {"delegate": "portable"}}


@pytest.fixture(scope="module")
def decode_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    out = tmp_path_factory.mktemp("decode_llama") / "hf"
    LlamaForCausalLM(config).eval().save_pretrained(str(out))
    return out


def _wrong_step_position(net: torch.nn.Module, layer: int) -> None:
    """Layer ``layer`` rotates a one-token pass (the program's ``decode`` method, exported at one token
    per row) at position 0: the prefill method is untouched."""
    attn = net.model.layers[layer].self_attn

    def at_zero(_module, args, kwargs):
        if kwargs["hidden_states"].shape[1] == 1:
            kwargs["position_embeddings"] = net.model.rotary_emb(kwargs["hidden_states"], kwargs["position_ids"] * 0)
        return args, kwargs

    attn.register_forward_pre_hook(at_zero, with_kwargs=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from debug_framework.services.validation_engine import ValidationEngine

    return ValidationEngine(tmp_path_factory.mktemp("db") / "d.db")


def test_a_correct_program_passes_both_decode_steps_and_its_cache(decode_llama, engine):
    result = engine.run(engine.create_session(decode_llama, DECODE, "auto", "executorch"))
    assert result.passed, result.first_divergence
    assert sorted({r.step for r in result.results}) == [0, 1, 2]
    assert all(r.judged_by == "calibration" for r in result.results)
    assert all(r.comparison.masked_positions == 3 for r in result.results if r.step == 0)
    decode = result.summary()["decode"]
    assert {(row["step"], row["layer"]) for row in decode["kv_cache"]} == {(s, i) for s in range(3) for i in range(2)}
    assert all(row["passed"] for row in decode["kv_cache"])
    info = engine.db.sessions.get(result.session_id)["alternative_backend_info"]["versions"]
    programs = sorted(p.name.split("-", 3)[3] for p in Path(info["artifact_dir"]).glob("*.pte"))
    assert programs == ["decode2-2x8.pte", "model-2x8.pte"]  # the prefill's comparison, then the decode


def test_a_wrong_position_in_the_exported_step_fails_at_its_step_and_layer(decode_llama, engine, broken_layer):
    from debug_framework.backends import register_backend, unregister_backend
    from debug_framework.backends.executorch.runner import ExecuTorchBackend

    class WrongStep(ExecuTorchBackend):
        def prepare(self, model, dtype=None, device=None) -> None:
            super().prepare(model, dtype, device)
            _wrong_step_position(self.net, broken_layer)

    register_backend("executorch_wrong_step", WrongStep, replace=True)
    try:
        result = engine.run(engine.create_session(decode_llama, DECODE, "auto", "executorch_wrong_step"))
    finally:
        unregister_backend("executorch_wrong_step")
    assert not result.passed
    assert all(r.passed for r in result.results if r.step == 0)  # the prefill method is right
    first = result.first_divergence
    assert (first.step, str(first.key)) == (1, f"post_attention:{broken_layer}")
    assert all(r.passed for r in result.results if r.step == 1 and r.key.layer is not None
               and r.key.layer < broken_layer)
    kv = {(row["step"], row["layer"]): row["passed"] for row in result.summary()["decode"]["kv_cache"]}
    assert kv[(0, broken_layer)] and not kv[(1, broken_layer)]  # the key the step wrote, rotated wrongly
