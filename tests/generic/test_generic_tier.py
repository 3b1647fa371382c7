"""The generic tier: tiny random models of many ``transformers`` families validate against
``pytorch`` with the model's own eager code in float64 as the reference (``float64_eager``),
checkpoints found from the module structure under the canonical names, each with its module path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from debug_framework.backends import get_backend, module_backend, register_backend, unregister_backend
from debug_framework.backends.eager_reference import NoNarrowing
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.capture.keys import CheckpointKey, all_checkpoints
from debug_framework.errors import ModelLoadingError
from debug_framework.modelio import load_model as _load_model
from debug_framework.modelio.generic import random_inputs
from debug_framework.services.validation_engine import ValidationEngine

def load_model(path, **kw):
    """Load on the generic tier: families with a reference from the math too (mistral, qwen3, gemma2 ...)."""
    return _load_model(path, tier="generic", **kw)


#: the issue's fifteen families, and two more it does not name (the mechanism is generic)
FAMILIES = ["mistral", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt2", "mixtral", "qwen3_moe", "roberta",
            "distilbert", "gpt_neox", "olmo2", "falcon", "t5", "vit", "starcoder2", "stablelm"]


def _validate(model_dir: Path, db: Path, alternative: str = "pytorch", **config: object) -> dict:
    engine = ValidationEngine(database_path=db)
    sid = engine.create_session(model_dir, {"input_shape": [2, 6], "model_tier": "generic", **config}, "auto", alternative)
    return engine.run(sid).to_dict()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_validates_against_pytorch(family: str, zoo, tmp_path: Path) -> None:
    model = load_model(zoo(family))
    assert model.architecture == "generic"
    out = _validate(zoo(family), tmp_path / "s.db")
    assert out["verdict"] == "passed", out["first_divergence"]
    assert out["reference_backend"] == "float64_eager"
    ids = [r["id"] for r in out["results"]]
    assert ids == [str(k) for k in all_checkpoints(model.num_layers, model.router_layers)]
    assert all(r["module"] for r in out["results"]), [r["id"] for r in out["results"] if not r["module"]]
    assert len(out["isolation"]) == model.num_layers  # every layer replayed on the reference's input


def _backend(model_dir: Path, dtype: str = "float64"):
    model = load_model(model_dir)
    backend = get_backend("float64_eager")
    backend.prepare(model, dtype)
    return model, backend


@pytest.mark.parametrize("family", ["gpt_neox", "falcon"])
def test_parallel_blocks(family: str, zoo) -> None:
    """Attention and MLP read the same input: post_attention is the attention block's output, and
    the MLP is judged with the whole layer (no MLP-alone replay), said so."""
    _, backend = _backend(zoo(family))
    layer = backend.structure.layers[0]
    assert layer.parallel and layer.seam is None
    assert layer.post_attention.module == layer.attention and layer.post_attention.where == "output"
    ok, why = backend.can_run_block()
    assert not ok and "parallel" in why


def test_phi_parallel_block(zoo) -> None:
    _, backend = _backend(zoo("phi"))
    assert all(layer.parallel for layer in backend.structure.layers)


def _layer_parts(backend, i: int):
    net = backend.module
    return dict(net.named_modules())[backend.structure.layers[i].module]


@pytest.mark.parametrize("family,norm,post", [
    ("mistral", "post_attention_layernorm", None),  # pre-norm
    ("gemma2", "pre_feedforward_layernorm", "post_feedforward_layernorm"),  # sandwich norms
    ("olmo2", None, "post_feedforward_layernorm"),  # norms after each block, none before
])
def test_post_attention_is_the_residual_stream(family: str, norm: str | None, post: str | None, zoo) -> None:
    """post_mlp = post_attention + [post-norm](mlp([pre-norm](post_attention))): the checkpoint is the
    residual stream after attention whatever the norms' places."""
    model, backend = _backend(zoo(family))
    inputs = random_inputs(model.config, 1, 6)
    cap = backend.run(inputs)
    layer = _layer_parts(backend, 1)
    a = cap[CheckpointKey("post_attention", 1)]
    with torch.no_grad(), NoNarrowing():  # float64 throughout, as the reference computes
        h = getattr(layer, norm)(a) if norm else a
        h = layer.mlp(h)
        h = getattr(layer, post)(h) if post else h
    torch.testing.assert_close(a + h, cap[CheckpointKey("post_mlp", 1)], rtol=1e-12, atol=1e-12)
    assert backend.can_run_block() == (True, "")
    replay = backend.run_block(1, "mlp", a, inputs)  # the MLP block alone on that state
    torch.testing.assert_close(replay[CheckpointKey("post_mlp", 1)], cap[CheckpointKey("post_mlp", 1)])


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3_text"])
def test_sliding_window_is_the_models_own(family: str, zoo, tmp_path: Path) -> None:
    """The reference runs the model's own sliding-window (or local/global) attention: beyond the
    window its logits differ from the same weights with full attention."""
    import json

    model, backend = _backend(zoo(family))
    inputs = random_inputs(model.config, 1, 12)
    windowed = backend.run(inputs)[CheckpointKey("post_processing")]
    full_dir = tmp_path / "full"
    full_dir.mkdir()
    raw = json.loads((zoo(family) / "config.json").read_text())
    raw["sliding_window"] = None if family == "mistral" else 64
    (full_dir / "config.json").write_text(json.dumps(raw))
    (full_dir / "model.safetensors").symlink_to(zoo(family) / "model.safetensors")
    _, full_backend = _backend(full_dir)
    full = full_backend.run(inputs)[CheckpointKey("post_processing")]
    assert not torch.allclose(windowed[:, 8:], full[:, 8:])
    torch.testing.assert_close(windowed[:, :4], full[:, :4])  # within the window: the same


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_moe_router_logits_are_checkpoints(family: str, zoo) -> None:
    model, backend = _backend(zoo(family))
    assert model.router_layers == (0, 1) and model.config.experts_per_token == 2
    cap = backend.run(random_inputs(model.config, 2, 6), all_checkpoints(2, (0, 1)))
    logits = cap[CheckpointKey("router_logits", 1)]
    assert logits.shape == (12, 4)
    assert backend.structure.modules["router_logits:1"].endswith("mlp.gate")


def test_tied_and_untied_heads(zoo) -> None:
    """gpt2 ties its head to the embeddings (not stored); mistral's is its own tensor."""
    from safetensors import safe_open

    for family, tied in (("gpt2", True), ("mistral", False)):
        with safe_open(str(zoo(family) / "model.safetensors"), "pt") as fh:
            stored = set(fh.keys())
        assert ("lm_head.weight" in stored) is (not tied)
        model = load_model(zoo(family))
        net = build_hf_model(model, torch.float64)
        assert (net.get_output_embeddings().weight is net.get_input_embeddings().weight) is tied


@pytest.mark.parametrize("family,shape", [("roberta", (2, 6, 32)), ("distilbert", (2, 6, 32)), ("vit", (2, 5, 32))])
def test_encoders_end_with_the_last_hidden_state(family: str, shape: tuple, zoo) -> None:
    model, backend = _backend(zoo(family))
    out = backend.run(random_inputs(model.config, 2, 6))[CheckpointKey("post_processing")]
    assert tuple(out.shape) == shape


def test_t5_has_encoder_and_decoder_checkpoints(zoo) -> None:
    model, backend = _backend(zoo("t5"))
    assert model.config.input_kind == "seq2seq" and model.num_layers == 4
    modules = backend.structure.modules
    assert modules["post_mlp:1"].startswith("encoder.") and modules["post_mlp:2"].startswith("decoder.")
    assert modules["post_attention:3"].startswith("decoder.block.1.layer.2")  # after self- and cross-attention


# -------------------------------------------------------------------------------------------------
# injected bugs: localized to their layer and block on the generic tier
# -------------------------------------------------------------------------------------------------


def _scale_attention(net: torch.nn.Module) -> None:
    net.model.layers[1].self_attn.scaling *= 1.5


def _drop_qk_norm(net: torch.nn.Module) -> None:
    net.model.layers[1].self_attn.q_norm = torch.nn.Identity()


def _swap_experts(net: torch.nn.Module) -> None:
    experts = net.model.layers[1].mlp.experts
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(experts, name)
            w.copy_(w[[1, 0, 2, 3]])


@pytest.mark.parametrize("family,bug,block", [
    ("mistral", _scale_attention, "attention"),
    ("qwen3", _drop_qk_norm, "attention"),
    ("mixtral", _swap_experts, "mlp"),
])
def test_injected_bug_is_localized(family: str, bug, block: str, zoo, tmp_path: Path) -> None:
    def builder(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        bug(net)
        return net

    name = f"buggy_{family}"
    register_backend(name, module_backend(name, builder), replace=True)
    try:
        out = _validate(zoo(family), tmp_path / "s.db", name)
    finally:
        unregister_backend(name)
    assert out["verdict"] == "failed"
    assert out["error_source"]["kind"] == "layer"
    assert (out["error_source"]["layer"], out["error_source"]["block"]) == (1, block)
    assert out["introducing_layers"] == [1]
    assert out["first_divergence"]["id"] == ("post_attention:1" if block == "attention" else "post_mlp:1")


def test_a_different_expert_choice_is_reported_as_such(zoo, tmp_path: Path) -> None:
    def builder(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        with torch.no_grad():
            net.model.layers[0].mlp.gate.weight.mul_(-1.0)  # the router now picks other experts
        return net

    register_backend("bad_router", module_backend("bad_router", builder), replace=True)
    try:
        out = _validate(zoo("mixtral"), tmp_path / "s.db", "bad_router")
    finally:
        unregister_backend("bad_router")
    router = next(r for r in out["results"] if r["id"] == "router_logits:0")
    assert not router["passed"] and router["judged_by"] == "expert_choice"
    assert "other experts" in router["reason"]


# -------------------------------------------------------------------------------------------------
# what the generic tier cannot run: DF004 naming what is missing and how to map it yourself
# -------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, raw: dict) -> Path:
    import json

    from safetensors.torch import save_file

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("raw,says", [
    ({"model_type": "mistral", "auto_map": {"AutoModel": "modeling_x.X"}, "num_hidden_layers": 1}, "custom code"),
    ({"hidden_size": 8, "num_hidden_layers": 1}, "no model_type"),
    ({"model_type": "no_such_family", "num_hidden_layers": 1}, "no_such_family"),
])
def test_unrunnable_models_are_df004(raw: dict, says: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadingError) as err:
        load_model(_write(tmp_path / "m", raw))
    assert says in str(err.value) and "module_backend" in str(err.value) and "checkpoint_map" in str(err.value)


def test_unknown_structure_is_df004(zoo) -> None:
    """A module without a stack of the model's layers: DF004 saying so and how to map it."""
    model = load_model(zoo("mistral"))

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, input_ids, attention_mask=None):
            return self.proj(torch.zeros(*input_ids.shape, 4))

    backend = module_backend("flat", lambda m, d, dev: Flat())()
    with pytest.raises(ModelLoadingError) as err:
        backend.prepare(model, "float32")
    assert "no stack of 2 layers" in str(err.value) and "checkpoint_map" in str(err.value)


def test_python_reference_names_the_eager_reference(zoo) -> None:
    model = load_model(zoo("gemma2"))
    with pytest.raises(ModelLoadingError) as err:
        get_backend("python_reference").prepare(model, "float64")
    assert "float64_eager" in str(err.value)


# -------------------------------------------------------------------------------------------------
# the command line, named inputs, any two backends
# -------------------------------------------------------------------------------------------------


def test_debug_validate_runs_any_family_and_says_which_reference_judged(zoo, tmp_path: Path, capsys) -> None:
    import json

    from debug_framework.cli.debug_validate import run

    code = run(["--model-path", str(zoo("starcoder2")), "--alternative-backend", "pytorch", "--database",
                str(tmp_path / "s.db"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verdict"] == "passed" and out["reference_backend"] == "float64_eager"
    assert next(r for r in out["results"] if r["id"] == "post_attention:1")["module"].startswith("model.layers.1.")


def test_debug_validate_refuses_custom_code_with_df004_exit_2(tmp_path: Path, capsys) -> None:
    from debug_framework.cli.debug_validate import run

    path = _write(tmp_path / "m", {"model_type": "mistral", "auto_map": {"AutoModel": "x.Y"}, "num_hidden_layers": 1})
    code = run(["--model-path", str(path), "--alternative-backend", "pytorch", "--database", str(tmp_path / "s.db")])
    err = capsys.readouterr().err
    assert code == 2 and "DF004" in err and "custom code" in err and "Traceback" not in err


def test_named_inputs_file_feeds_a_vit(zoo, tmp_path: Path) -> None:
    """--inputs FILE.safetensors: the model's own forward arguments by name (pixels here)."""
    import numpy as np
    from safetensors.numpy import save_file

    pixels = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    save_file({"pixel_values": pixels}, str(tmp_path / "in.safetensors"))
    out = _validate(zoo("vit"), tmp_path / "s.db", inputs_file=str(tmp_path / "in.safetensors"))
    assert out["verdict"] == "passed"
    assert next(r for r in out["results"] if r["id"] == "post_processing")["numel"] == 1 * 5 * 32  # one image


def test_two_backends_without_a_reference_from_the_math(zoo, tmp_path: Path) -> None:
    """--reference-backend pytorch: no NumPy reference and no float64 run involved."""
    engine = ValidationEngine(database_path=tmp_path / "s.db")
    sid = engine.create_session(zoo("gemma2"), {"input_shape": [1, 6], "dtype": "float32"}, "pytorch",
                                "float64_eager")
    out = engine.run(sid).to_dict()
    assert out["reference_backend"] == "pytorch" and out["alternative_backend"] == "float64_eager"
    assert out["verdict"] == "passed"


@pytest.mark.slow
def test_onnxruntime_runs_the_generic_tier_against_pytorch(zoo, tmp_path: Path) -> None:
    """Any two backends on any model: pytorch as the reference, ONNX Runtime's export of a family
    without a reference from the math as the alternative, each layer replayed by its cut."""
    pytest.importorskip("onnxruntime")
    engine = ValidationEngine(database_path=tmp_path / "s.db")
    sid = engine.create_session(zoo("mistral"), {"input_shape": [1, 8]}, "pytorch", "onnxruntime")
    out = engine.run(sid).to_dict()
    assert out["verdict"] == "passed", out["first_divergence"]
    assert [layer["mlp"]["input"] for layer in out["isolation"]] == ["reference", "reference"]


def test_mlx_says_why_it_cannot_run_the_generic_tier(zoo) -> None:
    from debug_framework.backends.mlx.runner import MLXBackend
    from debug_framework.errors import BackendInitializationError

    backend = MLXBackend()
    if not backend.availability()[0]:
        pytest.skip("mlx is not installed here")
    with pytest.raises(BackendInitializationError, match="cannot express"):
        backend.prepare(load_model(zoo("gemma2")), "float32")


def test_map_your_own_model_example_runs(zoo) -> None:
    """The 'Map your own model' example of docs/models-and-backends.md registers a backend that runs."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "models-and-backends.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "generic-tier example" in b)
    exec(compile(block, "models-and-backends.md", "exec"), {})
    try:
        backend = get_backend("my_mapped")
        model = load_model(zoo("mistral"))
        backend.prepare(model, "float32")
        cap = backend.run(random_inputs(model.config, 1, 4), ["post_mlp:1", "post_processing"])
        assert tuple(cap["post_processing"].shape) == (1, 4, 100)
    finally:
        unregister_backend("my_mapped")


@pytest.mark.slow
def test_drill_down_names_the_culprit_operator_on_the_generic_tier(zoo, tmp_path: Path) -> None:
    """A wrong attention scale in Mistral's layer 1: the drill-down names the scaling multiply in
    that layer's attention, with a verified repro."""
    def builder(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        _scale_attention(net)
        return net

    register_backend("scaled", module_backend("scaled", builder), replace=True)
    try:
        out = _validate(zoo("mistral"), tmp_path / "s.db", "scaled", drill_down=True)
    finally:
        unregister_backend("scaled")
    layer = out["drilldown"][0]
    assert layer["layer"] == 1 and layer["culprit"]["module_path"] == "model.layers.1.self_attn"
    assert layer["culprit"]["op"] == "aten.mul.Tensor" and layer["culprit"]["verified"]
