"""Mixture of experts beyond the generic tier's own tests. Drill-down on a mixture-of-experts layer
names the culprit operator: experts 0 and 1 swapped in layer 1 of a Qwen3-MoE, judged by the
generic tier (float64 eager); the culprit is in that layer's experts, with a verified repro and the
swapped weights named. The Qwen3-MoE reference written from
the math gives router logits as checkpoints, so its expert choice is judged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from debug_framework.backends import module_backend, register_backend, unregister_backend
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.services.validation_engine import ValidationEngine


def _swapped(model, dtype, device):
    net = build_hf_model(model, dtype, device)
    experts = net.model.layers[1].mlp.experts
    with torch.no_grad():
        for param in (experts.gate_up_proj, experts.down_proj):
            param[[0, 1]] = param[[1, 0]].clone()
    return net


@pytest.mark.slow
@pytest.mark.parametrize("tier,reference", [("generic", "float64_eager")])  # ("auto", "python_reference") passes
def test_swapped_expert_is_named_by_the_drill_down(tier: str, reference: str, zoo, tmp_path: Path) -> None:
    """One tier in CI (about 10 s each): the reference from the math names the same culprit
    (docs/models-and-backends.md, 'Drill-down'); add its case to run it."""
    register_backend("swapped_expert", module_backend("swapped_expert", _swapped), replace=True)
    try:
        engine = ValidationEngine(database_path=tmp_path / "s.db")
        config = {"input_shape": [2, 6], "drill_down": True, **({"model_tier": tier} if tier != "auto" else {})}
        out = engine.run(engine.create_session(zoo("qwen3_moe"), config, "auto", "swapped_expert")).to_dict()
    finally:
        unregister_backend("swapped_expert")
    assert out["reference_backend"] == reference and out["verdict"] == "failed"
    assert out["first_divergence"]["id"] == "post_mlp:1"
    (entry,) = out["drilldown"]
    culprit = entry["culprit"]
    assert entry["layer"] == 1 and culprit is not None, entry["note"]
    assert culprit["module_path"] == "model.layers.1.mlp.experts" and culprit["verified"]
    assert "mlp.experts.gate_up_proj" in entry["note"]


def test_router_logits_are_checkpoints_of_the_reference_from_the_math(zoo, tmp_path: Path) -> None:
    """The Qwen3-MoE reference from the math gives ``router_logits:i`` per layer (one row per token,
    as transformers' router): a router that picks other experts is judged by its expert choice."""
    def builder(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        with torch.no_grad():
            net.model.layers[0].mlp.gate.weight.mul_(-1.0)
        return net

    register_backend("bad_router_math", module_backend("bad_router_math", builder), replace=True)
    try:
        engine = ValidationEngine(database_path=tmp_path / "s.db")
        out = engine.run(engine.create_session(zoo("qwen3_moe"), {"input_shape": [2, 6], "isolate": False},
                                               "auto", "bad_router_math")).to_dict()
    finally:
        unregister_backend("bad_router_math")
    assert out["reference_backend"] == "python_reference"
    ids = [r["id"] for r in out["results"]]
    assert ids[:4] == ["post_embedding", "post_attention:0", "router_logits:0", "post_mlp:0"]
    router = next(r for r in out["results"] if r["id"] == "router_logits:0")
    assert router["reference_shape"] == [12, 4] and router["alternative_shape"] == [12, 4]
    assert not router["passed"] and router["judged_by"] == "expert_choice" and "other experts" in router["reason"]
