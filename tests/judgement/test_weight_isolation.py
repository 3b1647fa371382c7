"""A backend that changes its weights in place changes no other backend's: the reference, the
calibration and the alternative each read weights nothing else writes (``LoadedModel.fork``), every
backend call gets inputs of its own, and a guard refuses a verdict when the weights the references
read changed during the session (exit 3 from the CLI, naming the backend).

Each in-place kind a user's backend does (``mul_`` as in folding a scale, ``copy_`` as in fusing or
converting, ``fill_`` and ``zero_`` as in a broken quantizer) is caught at the edited layer's
checkpoint against every reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.injected_bugs import BUG_LAYER
from debug_framework.backends import module_backend, register_backend, unregister_backend
from debug_framework.backends.pytorch import PyTorchBackend, build_hf_model
from debug_framework.backends.python_reference import PythonReferenceBackend
from debug_framework.capture import CheckpointKey
from debug_framework.modelio import load_model
from debug_framework.services.validation.context import WeightsChangedError, own

#: kind -> what it does to a weight in place
EDITS = {
    "mul_": lambda w: w.mul_(1.5),
    "copy_": lambda w: w.copy_(w.flip(0)),  # a layout conversion done wrong
    "fill_": lambda w: w.fill_(0.01),
    "zero_": lambda w: w.zero_(),
}

#: family -> (the attention output projection, the MLP's down projection) of layer ``BUG_LAYER``
PROJECTIONS = {
    "llama": ("model.layers.{i}.self_attn.o_proj", "model.layers.{i}.mlp.down_proj"),
    "mistral": ("model.layers.{i}.self_attn.o_proj", "model.layers.{i}.mlp.down_proj"),
    "bert": ("encoder.layer.{i}.attention.output.dense", "encoder.layer.{i}.output.dense"),
}


def _tamper(name: str, family: str, kind: str, block: str) -> str:
    """A module backend that builds eager transformers and edits one weight of layer BUG_LAYER in place."""
    attn, mlp = PROJECTIONS[family]
    path = (attn if block == "attention" else mlp).format(i=BUG_LAYER)

    def build(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        with torch.no_grad():
            EDITS[kind](net.get_submodule(path).weight)
        return net

    register_backend(name, module_backend(name, build), replace=True)
    return name


@pytest.fixture
def tampered():
    names: list[str] = []

    def make(family: str, kind: str, block: str = "attention") -> str:
        names.append(_tamper(f"tamper_{family}_{kind.rstrip('_')}_{block}", family, kind, block))
        return names[-1]

    yield make
    for n in names:
        unregister_backend(n)


def _expect_located(result, block: str) -> None:
    first = CheckpointKey("post_attention" if block == "attention" else "post_mlp", BUG_LAYER)
    assert result.verdict == "failed"
    assert result.first_divergence.key == first, result.first_divergence.key
    assert result.introducing_layers == [BUG_LAYER]
    idx = [o.key for o in result.results].index(first)
    assert all(o.passed for o in result.results[:idx])


@pytest.mark.parametrize("kind", sorted(EDITS))
@pytest.mark.parametrize("reference", ["pytorch", "float64_eager", "auto"])
def test_in_place_edit_is_caught_against_every_reference(kind, reference, tiny_models, engine, tampered):
    """The issue's case: the `pytorch` reference (and every other) no longer sees the alternative's
    edit; the calibration (torch_reference, reading the loaded weights) neither."""
    backend = tampered("llama", kind)
    result = engine.run(engine.create_session(tiny_models("llama"), {"dtype": "float32"}, reference, backend))
    _expect_located(result, "attention")


@pytest.mark.parametrize(("family", "kind", "block"), [("mistral", "mul_", "mlp"), ("bert", "copy_", "attention"),
                                                       ("llama", "zero_", "mlp")])
def test_other_families_and_blocks(family, kind, block, tiny_models, engine, tampered):
    """The generic tier (Mistral: float64_eager is both the reference and the calibration, a pytorch
    alternative beside them) and BERT, an MLP weight as well as an attention one."""
    backend = tampered(family, kind, block)
    for reference in ("pytorch", "auto"):
        result = engine.run(engine.create_session(tiny_models(family), {"dtype": "float32"}, reference, backend))
        _expect_located(result, block)


def test_a_backend_writing_into_the_weights_it_was_given_changes_only_its_own(tiny_models, engine):
    """A user's builder that edits the store it is handed (``model.weights[name]``, the NumPy view of
    it) before building: the references still read the file's values."""
    name = f"model.layers.{BUG_LAYER}.self_attn.o_proj.weight"

    def build(model, dtype, device):
        assert model.weights.private  # a fork: its own copy-on-write mapping
        model.weights.numpy(name, np.float32)[...] *= 2.0  # a view of the fork's mapping, written
        return build_hf_model(model, dtype, device)

    register_backend("store_writer", module_backend("store_writer", build), replace=True)
    try:
        path = tiny_models("llama")
        result = engine.run(engine.create_session(path, {"dtype": "float32"}, "pytorch", "store_writer"))
        _expect_located(result, "attention")
        fresh = load_model(path)  # the file itself was never written
        assert fresh.digest == result_digest(engine, result)
    finally:
        unregister_backend("store_writer")


def result_digest(engine, result) -> str:
    return engine.db.sessions.get(result.session_id)["weights_digest"]


def test_forks_share_nothing_written(tiny_models):
    model = load_model(tiny_models("llama"))
    name = "model.layers.0.mlp.up_proj.weight"
    a, b = model.fork(), model.fork()
    before = model.weights[name].clone()
    a.weights[name].mul_(3.0)
    assert torch.equal(a.weights[name], before * 3.0)  # a fork keeps its own writes
    assert torch.equal(b.weights[name], before) and torch.equal(model.weights[name], before)
    assert a.digest == model.digest and a.raw_config is not model.raw_config
    assert model.weights.changed() == []


def test_each_call_gets_inputs_of_its_own():
    from debug_framework.modelio import ModelInputs

    inputs = ModelInputs(np.ones((1, 4), np.int64), np.ones((1, 4), np.int64), extra={"x": np.zeros(2)})
    mine = own(inputs)
    mine.input_ids[0, 0] = 7
    mine.extra["x"][0] = 1.0
    assert inputs.input_ids[0, 0] == 1 and inputs.extra["x"][0] == 0.0
    t = torch.arange(12.0).reshape(3, 4).t()  # a strided view: its clone keeps the strides a view needs
    c = own(t)
    assert c.stride() == t.stride() and c.data_ptr() != t.data_ptr()
    c.zero_()
    assert t.sum() == 66.0


class _ClobbersReplayInput(PyTorchBackend):
    """Eager transformers whose layer replay zeroes the hidden state it was given once done (a
    buffer reused in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "clobbers_replay_input"

    def run_layer(self, i, hidden_in, inputs):
        cap = super().run_layer(i, hidden_in, inputs)
        torch.as_tensor(hidden_in).zero_()
        return cap


def test_a_replay_that_writes_into_its_input_corrupts_nothing(tiny_models, engine):
    """The reference's layer inputs handed to a replay are copies: a backend writing into them
    changes neither the reference's capture nor what the calibration's replay is given."""
    register_backend("clobbers_replay_input", _ClobbersReplayInput, replace=True)
    try:
        result = engine.run(engine.create_session(tiny_models("llama"), {"dtype": "float32"}, "pytorch",
                                                  "clobbers_replay_input"))
    finally:
        unregister_backend("clobbers_replay_input")
    assert result.verdict == "passed" and result.introducing_layers == []
    for iso in result.isolation:  # both float32 eager runs: nothing carried into any layer
        assert iso.accumulation()["carried_in_rmse"] == 0.0, iso.layer


class _WritingReference(PythonReferenceBackend):
    """A backend that declares it only reads the loaded weights, and writes them."""

    name = "writing_reference"
    reads_weights_only = True

    def prepare(self, model, dtype=None, device="cpu"):
        model.weights[f"model.layers.{BUG_LAYER}.self_attn.o_proj.weight"].mul_(1.5)
        super().prepare(model, dtype, device)


def test_guard_refuses_a_verdict_when_the_shared_weights_change(tiny_models, engine):
    register_backend("writing_reference", _WritingReference, replace=True)
    try:
        sid = engine.create_session(tiny_models("llama"), {"dtype": "float32", "calibrate": True},
                                    "writing_reference", "pytorch")
        with pytest.raises(WeightsChangedError) as info:
            engine.run(sid)
        message = str(info.value)
        assert "'writing_reference' (reference)" in message and "'torch_reference' (calibration)" in message
        assert f"model.layers.{BUG_LAYER}.self_attn.o_proj.weight" in message
        row = engine.db.sessions.get(sid)
        assert row["status"] == "error" and "weights changed" in row["error_message"]
        assert (row.get("results") or {}).get("verdict") is None  # no verdict kept
    finally:
        unregister_backend("writing_reference")


def test_guard_exits_3_from_the_cli(tiny_models, tmp_path, capsys, monkeypatch):
    from debug_framework.cli.debug_validate import run

    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(tmp_path / "logs"))
    register_backend("writing_reference", _WritingReference, replace=True)
    try:
        code = run(["--model-path", str(tiny_models("llama")), "--reference-backend", "writing_reference",
                    "--alternative-backend", "pytorch", "--no-isolate", "--database", str(tmp_path / "g.db")])
    finally:
        unregister_backend("writing_reference")
    err = capsys.readouterr().err
    assert code == 3, err
    assert "internal error" in err and "writing_reference" in err and "WeightsChangedError" in err


def test_a_fork_maps_only_what_it_keeps(tiny_models):
    """Converting a fork's tensors reads the mapping the references share (the resident set counts
    the file's pages once, as the 1.2B figures need); only a tensor kept at the file's dtype opens
    the fork's own mapping."""
    model = load_model(tiny_models("llama"))
    fork = model.fork()
    name = "model.layers.0.mlp.up_proj.weight"
    assert name in fork.weights and fork.weights._own == {}  # membership reads the names alone
    build_hf_model(fork, torch.bfloat16)  # every tensor converted from the float32 file
    assert fork.weights._own == {}
    net = build_hf_model(fork, torch.float32)  # kept at the file's dtype: the fork's own pages
    assert len(fork.weights._own) == 1
    with torch.no_grad():
        net.get_submodule("model.layers.0.mlp.up_proj").weight.mul_(2.0)
    assert torch.equal(fork.weights[name], model.weights[name] * 2.0) and model.weights.changed() == []
