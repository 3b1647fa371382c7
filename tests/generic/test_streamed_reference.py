"""``float64_eager`` streams its weights: the layers kept as stored (bfloat16 here) are converted
one at a time as they are called, the large tables as they are used, and every run computes what
the model converted whole computes, in float64 throughout (the model's own float32 casts kept)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import debug_framework.backends._streamed_layers as streamed
from benchmarks.models import tiny_generic as tiny
from debug_framework.backends.eager_reference import EagerReferenceBackend
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.modelio import load_model
from debug_framework.modelio.generic import random_inputs


@pytest.fixture(scope="module")
def bf16_zoo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("bf16")
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = root / family
            tiny.build(family).to(torch.bfloat16).save_pretrained(made[family])
        return made[family]

    return get


def _prepared(path: Path, *, whole: bool = False, dtype: str = "float64") -> EagerReferenceBackend:
    backend = EagerReferenceBackend()
    model = load_model(path, tier="generic")
    if whole:  # the model converted whole, run as the backend runs it
        backend.builder = build_hf_model
        super(EagerReferenceBackend, backend).prepare(model, dtype)
    else:
        backend.prepare(model, dtype)
    return backend


# gpt2: learned positions, a head tied to the token table; t5: a shared table, encoder-decoder;
# mixtral: loaded by transformers (renamed experts); gemma3_text: an embedding subclass that scales
@pytest.mark.parametrize("family", ["gpt2", "t5", "mixtral", "gemma3_text"])
def test_streamed_runs_compute_what_the_whole_model_computes(family: str, bf16_zoo, monkeypatch) -> None:
    monkeypatch.setattr(streamed, "STREAMED_TABLE_ELEMENTS", 1)  # every table outside the layers streams
    monkeypatch.setattr(streamed, "HEAD_BLOCK_BYTES", 256)  # a linear function over tables in many blocks
    path = bf16_zoo(family)
    ours, whole = _prepared(path), _prepared(path, whole=True)
    assert ours.streaming and not whole.streaming and ours.stream_note == ""
    stored = [n for n, p in ours.module.named_parameters() if p.dtype == torch.bfloat16]
    assert any(".0." in n for n in stored) and any(".0." not in n and ".1." not in n for n in stored), stored
    inputs = random_inputs(load_model(path, tier="generic").config, 2, 7, seed=3)
    got, want = ours.run(inputs), whole.run(inputs)
    assert set(got.tensors) == set(want.tensors)
    for key in want.tensors:
        assert got.tensors[key].dtype == torch.float64
        torch.testing.assert_close(got.tensors[key], want.tensors[key], rtol=1e-13, atol=1e-13)
    # the layers came back as stored after the run
    assert [n for n, p in ours.module.named_parameters() if p.dtype == torch.bfloat16] == stored


def test_at_most_one_layer_is_float64_at_a_time(bf16_zoo) -> None:
    """While each layer runs, the model's float64 parameter bytes are those outside the layers plus
    that layer's: never two layers (the tiny-scale proof of the streaming)."""
    backend = _prepared(bf16_zoo("mistral"))
    net = backend.module
    layers = net.model.layers

    def f64_bytes(mod: torch.nn.Module) -> int:
        return sum(p.numel() * 8 for p in mod.parameters() if p.dtype == torch.float64)

    outside = f64_bytes(net)
    assert outside > 0 and all(f64_bytes(layer) == 0 for layer in layers)
    seen: list[tuple[int, int]] = []
    hooks = [layer.register_forward_hook(lambda m, a, o: seen.append((f64_bytes(net), f64_bytes(m))), prepend=True)
             for layer in layers]
    try:
        backend.run(random_inputs(load_model(bf16_zoo("mistral"), tier="generic").config, 1, 5))
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == len(layers)
    for total, this_layer in seen:
        assert this_layer > 0 and total == outside + this_layer
    assert f64_bytes(net) == outside


def test_a_model_that_cannot_stream_is_loaded_whole_and_said_so(bf16_zoo, monkeypatch) -> None:
    """Layers left unconverted fail the forward at preparation (two dtypes in one product): the
    backend loads the model whole, and the results are the whole model's."""
    monkeypatch.setattr(streamed.LayerStreamer, "_enter", lambda self, module, args: self._calls.append(None))
    monkeypatch.setattr(streamed.LayerStreamer, "_leave", lambda self, module, args, output: self._calls.pop())
    backend = _prepared(bf16_zoo("olmo2"))
    assert not backend.streaming
    assert "loaded whole" in backend.stream_note
    assert all(p.dtype == torch.float64 for p in backend.module.parameters())


def test_the_reference_is_float64_where_the_model_casts_to_float32(tmp_path: Path) -> None:
    """transformers' RMSNorm computes in float32; the reference keeps float64: on a Llama-family
    model it agrees with the reference written from the math far below float32's rounding."""
    from debug_framework.backends import get_backend

    path = tmp_path / "mistral"
    tiny.build("mistral", hidden_size=64, intermediate_size=128).save_pretrained(path)
    model = load_model(path)
    inputs = random_inputs(load_model(path, tier="generic").config, 2, 9, seed=1)
    eager = get_backend("float64_eager")
    eager.prepare(model, "float64")
    math = get_backend("python_reference")
    math.prepare(model, "float64")
    ours, exact = eager.run(inputs), math.run(inputs)
    keys = set(ours.tensors) & set(exact.tensors)
    assert len(keys) == 2 * model.num_layers + 2
    for key in keys:
        a, b = np.asarray(ours.tensors[key], dtype=np.float64), np.asarray(exact.tensors[key], dtype=np.float64)
        rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        assert rel < 5e-9, (key, rel)  # float32 norms gave up to 7.6e-8 here; the rotary angles stay float32


def test_a_file_of_mixed_dtypes_loaded_by_transformers_streams_without_rounding(tmp_path: Path) -> None:
    """Experts renamed on loading (transformers loads them) with the routers stored in float32 and
    the rest in bfloat16: loaded at float32 (which holds both exactly) and streamed, the runs are
    the whole model's."""
    net = tiny.build("mixtral").to(torch.bfloat16)
    for layer in net.model.layers:
        layer.mlp.gate.float()
    net.save_pretrained(tmp_path / "mixed")
    model = load_model(tmp_path / "mixed", tier="generic")
    assert {model.weights.dtype_name(n) for n in model.weights} == {"BF16", "F32"}
    ours, whole = _prepared(tmp_path / "mixed"), _prepared(tmp_path / "mixed", whole=True)
    assert ours.streaming
    inputs = random_inputs(model.config, 2, 5, seed=2)
    got, want = ours.run(inputs), whole.run(inputs)
    for key in want.tensors:
        assert torch.equal(got.tensors[key], want.tensors[key]), key
