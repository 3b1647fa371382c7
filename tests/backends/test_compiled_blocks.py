"""``inductor`` and ``onnxruntime`` run a layer's MLP block alone (``run_block``), so isolation
judges each block on the reference's input to it.

Per backend, on a tiny Llama and a tiny BERT: the MLP block fed the backend's own post-attention
state gives the backend's own whole-layer replay (the same computation), and fed the reference's
post-attention state it gives Hugging Face eager's MLP block on that state; a session with
isolation replays every MLP block on the reference's post-attention state and passes. An attention
bug patched into the Hugging Face module Inductor compiles marks only the attention block.

Each test compiles or exports for real, so all are slow; each backend is built once per model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_framework.backends import get_backend, register_backend, unregister_backend
from debug_framework.backends.inductor import InductorBackend
from debug_framework.capture import CheckpointKey
from debug_framework.comparison import compare
from debug_framework.errors import BackendInitializationError, ConfigurationError
from debug_framework.modelio import load_model
from debug_framework.services.validation_engine import ValidationEngine

pytestmark = pytest.mark.slow

#: The same float32 computation twice: one graph against another (eager, a fused kernel): ~1e-7 seen.
ROUNDING = dict(rtol=1e-5, atol=1e-6)


def _host(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _close(a, b, what) -> None:
    res = compare(_host(a), _host(b), **ROUNDING)
    assert res.passed, (what, res.reason, res.max_abs_error)


def _blocks_replay_the_layer(backend, model, inputs) -> list[dict]:
    """For each layer, on the reference's (eager PyTorch's) layer input and post-attention state:
    the backend's MLP block on its own post-attention state is its whole-layer replay's post_mlp;
    on the reference's state it is eager's MLP block there (and not the layer's output on the
    reference's input with the backend's own attention: the block starts from the given state);
    its attention block is its layer replay's post_attention. Returns the MLP replays' meta."""
    eager = get_backend("pytorch")
    eager.prepare(model, "float32", "cpu")
    ref = eager.run(inputs, capture_layer_inputs=True)
    metas = []
    for i in range(model.num_layers):
        k_attn, k_mlp = CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)
        layer = backend.run_layer(i, ref.layer_inputs[i], inputs)
        own = backend.run_block(i, "mlp", layer[k_attn], inputs)
        assert list(own) == [k_mlp]
        _close(own[k_mlp], layer[k_mlp], f"layer {i}: MLP block on the backend's own post-attention state")
        shifted = ref[k_attn] * 1.5  # a state no layer produced: the block really starts from it
        got = backend.run_block(i, "mlp", shifted, inputs)
        _close(got[k_mlp], eager.run_block(i, "mlp", shifted, inputs)[k_mlp], f"layer {i}: MLP block vs eager")
        assert not compare(_host(got[k_mlp]), _host(layer[k_mlp]), **ROUNDING).passed
        attention = backend.run_block(i, "attention", ref.layer_inputs[i], inputs)
        assert list(attention) == [k_attn]
        _close(attention[k_attn], layer[k_attn], f"layer {i}: attention block")
        metas += [own.meta, got.meta]
    with pytest.raises(BackendInitializationError, match="layer 9 does not exist"):
        backend.run_block(9, "mlp", shifted, inputs)
    with pytest.raises(ConfigurationError, match="unknown block 'ffn'"):
        backend.run_block(0, "ffn", shifted, inputs)
    _close(ref[CheckpointKey("post_processing")], backend.run(inputs)[CheckpointKey("post_processing")],
           "the full model after the replays")
    return metas


def _session_judges_mlp_on_the_reference(model_path, backend, tmp_path) -> None:
    """A session with isolation: every layer's MLP block is replayed on the reference's
    post-attention state (``introduced.input == "reference"``, no fallback note) and it passes."""
    engine = ValidationEngine(tmp_path / "debug.db")
    sid = engine.create_session(model_path, {"isolate": True}, "python_reference", backend)
    result = engine.run(sid)
    assert result.passed, result.first_divergence
    n = load_model(model_path).num_layers
    assert [iso.layer for iso in result.isolation] == list(range(n))
    for iso in result.isolation:
        assert iso.evidence.mlp is not None and iso.evidence.mlp_note is None, iso.evidence.mlp_note
        assert iso.verdict.mlp_input == "reference" and iso.verdict.blocks == []
    rows = [r for r in engine.get_session_results(sid)["checkpoints"] if r["checkpoint"] == "post_mlp"]
    assert len(rows) == n and all(r["introduced"]["input"] == "reference" for r in rows), rows


@pytest.mark.parametrize("family", ["bert"])  # Llama's MLP block under Inductor: the attention-bug test below
def test_inductor_runs_the_mlp_block_alone(family, tiny_llama, tiny_bert, random_inputs, tmp_path):
    path = tiny_llama if family == "llama" else tiny_bert
    model = load_model(path)
    backend = get_backend("inductor")
    backend.prepare(model, "float32")
    metas = _blocks_replay_the_layer(backend, model, random_inputs)
    # each layer's block compiled once, on its first call; the sink of the checkpoint hooks left empty
    assert metas == [m for i in range(model.num_layers) for m in (
        {"variant": f"mlp block {i}", "compiled_in_this_call": True},
        {"variant": f"mlp block {i}", "compiled_in_this_call": False})]
    assert [e["variant"] for e in backend.compile_log if e["variant"].startswith("mlp")] == [
        f"mlp block {i}" for i in range(model.num_layers)]
    assert backend._wrapper._sink == []
    # an Inductor session judging MLP blocks on the reference's state: the attention-bug test below


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_onnxruntime_cuts_the_mlp_block_out_of_its_export(family, tiny_llama, tiny_bert, random_inputs, tmp_path):
    path = tiny_llama if family == "llama" else tiny_bert
    model = load_model(path)
    backend = get_backend("onnxruntime", artifact_dir=tmp_path / "run")
    backend.prepare(model, "float32", "cpu")
    assert backend.can_run_block() == (True, "")
    before = sorted((tmp_path / "run").iterdir())
    metas = _blocks_replay_the_layer(backend, model, random_inputs)
    assert [(m["variant"], m["replay"], m["built_in_this_call"]) for m in metas] == [
        (f"mlp block {i}", "graph", built) for i in range(model.num_layers) for built in (True, False)]
    assert {m["onnx_path"] for m in metas} == {str(backend.onnx_path)}
    assert sorted((tmp_path / "run").iterdir()) == before  # cut from the export: nothing exported again
    if family == "bert":  # one session (the smaller export) is enough for the engine's side
        _session_judges_mlp_on_the_reference(path, "onnxruntime", tmp_path)


class _AttentionScaleBug(InductorBackend):
    """Inductor compiling a Llama whose layer 1 attention scales its scores by 1.5 / sqrt(d)."""

    def prepare(self, model, dtype=None, device=None):
        super().prepare(model, dtype, device)
        self.net.model.layers[1].self_attn.scaling *= 1.5  # read by the forward, so by what is compiled


def test_an_attention_bug_marks_only_the_attention_block(tiny_llama, tmp_path):
    register_backend("inductor_attention_bug", _AttentionScaleBug, replace=True)
    try:
        engine = ValidationEngine(tmp_path / "debug.db")
        result = engine.run(engine.create_session(tiny_llama, {"isolate": True}, "python_reference",
                                                  "inductor_attention_bug"))
    finally:
        unregister_backend("inductor_attention_bug")
    assert result.verdict == "failed" and result.introducing_layers == [1]
    assert result.first_divergence.key == CheckpointKey("post_attention", 1)
    layer1 = result.isolation[1].verdict
    # the MLP, fed the reference's post-attention state, is exact: only the attention is marked
    assert layer1.blocks == ["attention"] and layer1.mlp_input == "reference" and layer1.mlp.passed
    for lr in result.isolation:  # every layer's MLP block ran alone on the reference's post-attention state
        assert lr.evidence.mlp is not None and lr.evidence.mlp_note is None and lr.verdict.mlp_input == "reference"
