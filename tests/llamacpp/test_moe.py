"""Qwen3-MoE in the llamacpp engine: a tiny mixture of experts (2 layers, 4 experts, top 2) written
as convert_hf_to_gguf.py writes it (experts stacked per layer), read back unstacked, run in llama.cpp
with its router logits as ``router_logits:i``, judged at llama.cpp's precision (``mul_mat_id``'s
activation quantization emulated), decoded through its cache, converter bugs drilled to the node."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from debug_framework.backends.llamacpp.convert import write_gguf
from debug_framework.errors import ModelLoadingError
from debug_framework.modelio import load_model
from debug_framework.modelio.gguf_read import read_gguf

from .conftest import make_hf, validate

pytest.importorskip("xllamacpp")

#: the experts' shape: 4 of width 32 (one Q8_0/Q4_0 block), each token taking 2, renormalised as
#: llama.cpp's qwen3moe graph always does
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


def _scaled_expert(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """A converter bug in one expert: layer 1's expert 2's down projection scaled by 1.5."""
    if name == "blk.1.ffn_down_exps.weight":
        converted = converted.copy()
        converted[2] *= 1.5
    return converted


def _swapped_router_rows(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """A converter bug in the router: layer 1's logits of experts 0 and 1 swapped."""
    return converted[[1, 0, 2, 3]] if name == "blk.1.ffn_gate_inp.weight" else converted


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Hugging Face directory (``hf``) and its GGUFs: f32, q8_0 and two with a converter bug."""
    out = tmp_path_factory.mktemp("gguf_moe")
    hf = make_hf("qwen3_moe", out / "hf", seed=17, **EXPERTS)
    return {"hf": hf, "f32": write_gguf(hf, out / "f32.gguf"),
            "q8_0": write_gguf(hf, out / "q8_0.gguf", tensor_type="q8_0"),
            "expert": write_gguf(hf, out / "bug-expert.gguf", transform=_scaled_expert),
            "router": write_gguf(hf, out / "bug-router.gguf", transform=_swapped_router_rows)}


def test_experts_are_stacked_and_read_back_per_expert(moe: dict[str, Path]) -> None:
    """The file holds each layer's experts as one [experts, out, in] tensor (ne reversed), the router
    in F32 even in a q8_0 file, the expert keys; reading it gives every expert back under its name."""
    f = read_gguf(moe["q8_0"])
    assert f.architecture == "qwen3moe"
    assert (f.key("expert_count"), f.key("expert_used_count"), f.key("expert_feed_forward_length")) == (4, 2, 32)
    assert f.tensors["blk.1.ffn_down_exps.weight"].shape == (4, 64, 32)
    assert f.tensors["blk.1.ffn_gate_exps.weight"].shape == (4, 32, 64)
    types = f.tensor_types()
    assert types["blk.1.ffn_gate_inp.weight"] == "F32" and types["blk.1.ffn_up_exps.weight"] == "Q8_0"
    mine, theirs = load_model(moe["f32"]), load_model(moe["hf"])
    assert mine.config.model_type == "qwen3_moe" and mine.config.num_experts == 4 and mine.config.norm_topk_prob
    assert sorted(mine.weights) == sorted(theirs.weights)
    for name in ("model.layers.1.mlp.experts.2.down_proj.weight", "model.layers.0.mlp.experts.3.gate_proj.weight",
                 "model.layers.1.mlp.gate.weight"):
        np.testing.assert_array_equal(mine.weights.numpy(name, np.float32), theirs.weights.numpy(name, np.float32))
    # one expert of a quantized stack is its own bytes: the same numbers as the whole stack's slice
    whole = f.read("blk.1.ffn_up_exps.weight")
    for e in range(4):
        np.testing.assert_array_equal(f.read("blk.1.ffn_up_exps.weight", e), whole[e])


def test_what_llamas_qwen3moe_does_not_compute_is_refused(moe: dict[str, Path], tmp_path: Path) -> None:
    """A stacked tensor that disagrees with the expert keys is DF004 on reading; a model whose chosen
    experts' weights are not renormalised is DF004 on writing (llama.cpp's graph always does)."""
    short = write_gguf(moe["hf"], tmp_path / "short.gguf",
                       transform=lambda name, hf, converted: converted[:3] if name == "blk.0.ffn_up_exps.weight"
                       else converted)
    with pytest.raises(ModelLoadingError, match=r"DF004.*blk\.0\.ffn_up_exps\.weight has shape \[3, 32, 64\]"):
        load_model(short)
    plain = shutil.copytree(moe["hf"], tmp_path / "plain")
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({**config, "norm_topk_prob": False}))
    with pytest.raises(ModelLoadingError, match="DF004.*norm_topk_prob"):
        write_gguf(plain, tmp_path / "plain.gguf")


def test_a_file_of_another_mixture_is_not_this_model(engine, moe: dict[str, Path], tmp_path: Path) -> None:
    """The conversion check of a model that takes another number of experts per token than the file
    (or does not renormalise their weights) stops at preparation (DF002), before any comparison."""
    from debug_framework.errors import BackendInitializationError

    other = shutil.copytree(moe["hf"], tmp_path / "top1")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 1}))
    with pytest.raises(BackendInitializationError, match="DF002.*num_experts_per_tok 2 where the model has 1"):
        validate(engine, other, alternative_options={"model_file": str(moe["q8_0"])})


@pytest.mark.parametrize("kind, conversion", [("f32", False), ("q8_0", False), ("q8_0", True)])
def test_correct_files_pass_at_dtype_auto(engine, moe: dict[str, Path], kind: str, conversion: bool) -> None:
    """Isolated, so that each MLP block (router and mul_mat_id) is judged alone against the
    emulation's: against its own weights a q8_0 file's MLP block errs by the Q8_0 activations
    ggml feeds the experts (an emulation without them fails it); as a conversion, the experts'
    weights re-quantized at the stacked tensors' types."""
    model = moe["hf"] if conversion else moe[kind]
    options = {"alternative_options": {"model_file": str(moe[kind])}} if conversion else {}
    result = validate(engine, model, isolate=True, **options)
    assert result.passed, [c.to_dict() for c in result.results if not c.passed]
    routers = [c for c in result.results if c.key.name == "router_logits"]
    assert [c.key.layer for c in routers] == [0, 1]


def test_a_q8_0_file_at_float32_fails_consistent_with_q8_0(engine, moe: dict[str, Path]) -> None:
    result = validate(engine, moe["q8_0"], dtype="float32")
    assert not result.passed and result.consistent_with == "q8_0"


@pytest.mark.parametrize("bug, node, judged_by", [("expert", "ffn_moe_out-1", None),
                                                  ("router", "ffn_moe_logits-1", "expert_choice")])
def test_converter_bugs_fail_at_layer_1s_mlp_and_name_the_node(engine, moe: dict[str, Path], bug: str, node: str,
                                                               judged_by: str | None) -> None:
    result = validate(engine, moe["hf"], alternative_options={"model_file": str(moe[bug])}, isolate=True,
                      drill_down=True)
    failed = {str(c.key): c for c in result.results if not c.passed}
    assert not result.passed and "post_mlp:0" not in failed and "post_attention:1" not in failed
    assert ("router_logits:1" in failed) == (bug == "router")
    if judged_by is not None:
        assert failed["router_logits:1"].judged_by == judged_by
    source = result.source
    assert source is not None and (source.kind, source.layer, source.block) == ("layer", 1, "mlp")
    drilled = {d.layer: d for d in result.drilldown or []}
    assert drilled[1].method == "ggml" and drilled[1].culprit is not None and drilled[1].culprit.node == node
    if bug == "router":  # the router is one product: its standalone repro reproduces alone
        assert drilled[1].culprit.verified, drilled[1].note


def test_two_decode_steps_through_llamas_cache_pass(engine, moe: dict[str, Path]) -> None:
    """The MoE layers decode through llama.cpp's KV cache, their router logits judged at every step
    (the calibration's prefill cut to each row's last token: ``[batch, experts]``)."""
    result = validate(engine, moe["q8_0"], decode_steps=2)
    assert result.passed, [c.to_dict() for c in result.results if not c.passed]
    assert {1, 2} <= {c.to_dict().get("step") for c in result.results}
    assert {(c.key.layer, c.step) for c in result.results if c.key.name == "router_logits" and c.step} == \
        {(i, s) for i in range(2) for s in (1, 2)}
    kv = result.decoded.kv_cache  # the MoE layers' keys and values llama.cpp writes, every pass
    assert {(row.step, row.layer) for row in kv} == {(s, i) for s in range(3) for i in range(2)}
    assert all(row.k.passed and row.v.passed for row in kv)
