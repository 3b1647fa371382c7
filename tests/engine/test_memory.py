"""Memory at scale (issue 28): the references stream their weights layer by layer, a session's
memory is estimated before it runs (DF007 when it cannot fit) and its peak and stage times are
recorded with it."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from debug_framework.architectures import build_reference
from debug_framework.capture.spill import CaptureSink, capture_sink, checkpoint_dict
from debug_framework.config import from_environment
from debug_framework.errors import FrameworkInitializationError, ResourceExhaustedError
from debug_framework.modelio import load_model

from .conftest import make_tiny

WIDE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            vocab_size=64)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory) -> dict[int, Path]:
    """The same tiny Llama shape with 2 and 8 layers."""
    root = tmp_path_factory.mktemp("stacks")
    return {n: make_tiny("llama", root / f"l{n}", num_hidden_layers=n, **WIDE) for n in (2, 8)}


def _layer_bytes(model) -> int:
    """One layer's weights in float64."""
    return sum(int(np.prod(model.weights.shape(n))) for n in model.weights if n.startswith("model.layers.0.")) * 8


def _forward_peak(path: Path, stream: bool, tokens: int = 8, sink: CaptureSink | None = None) -> tuple[int, int, dict]:
    """(traced peak bytes of building the float64 reference and running it on ``tokens`` tokens
    (batches of 32 beyond 32), capturing every checkpoint and layer input as a validation run
    does (within ``sink``'s budget when given), one layer's float64 bytes, what it captured)."""
    model = load_model(path)
    ids = np.arange(tokens).reshape(-1, min(tokens, 32)) % 64
    mask = np.ones_like(ids)
    tracemalloc.start()
    try:
        with capture_sink(sink):
            ref = build_reference(model.config, model.weights, np.float64, stream=stream)
            inputs = checkpoint_dict()
            out = ref.forward(ids, mask, None, inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if stream:
        assert len(ref.layers.resident_layers()) <= 1
    return peak, _layer_bytes(model), {**{("in", i): inputs[i] for i in inputs}, **{k: out[k] for k in out}}


def test_float64_reference_holds_about_one_layer_as_layers_are_added(stacks, tmp_path):
    """Six more layers cost a streamed session less than one layer of float64 weights more at its
    peak; held resident (the old way) they cost all six. The captured checkpoints too: with a
    capture budget they go to disk as they are produced (six more layers of an 8 x 32 batch cost
    less than one layer's weights more), read back bit for bit; held in memory they cost their 12
    activations."""
    small, layer, _ = _forward_peak(stacks[2], stream=True)
    large, _, _ = _forward_peak(stacks[8], stream=True)
    assert large - small < layer, (small, large, layer)
    resident_small, _, _ = _forward_peak(stacks[2], stream=False)
    resident_large, _, _ = _forward_peak(stacks[8], stream=False)
    assert resident_large - resident_small > 5 * layer  # the measure sees layers held at once

    activation = 256 * WIDE["hidden_size"] * 8  # one checkpoint of the 8 x 32 batch in float64
    sinks = {n: CaptureSink(tmp_path / f"spill{n}", budget=activation) for n in (2, 8)}
    spilled = {n: _forward_peak(stacks[n], stream=True, tokens=256, sink=sinks[n]) for n in (2, 8)}
    held = {n: _forward_peak(stacks[n], stream=True, tokens=256) for n in (2, 8)}
    assert spilled[8][0] - spilled[2][0] < layer, (spilled[8][0], spilled[2][0], layer)
    assert held[8][0] - held[2][0] > 6 * 2 * activation * 0.9  # the measure sees captures held (an input is the last output)
    assert sinks[8].resident <= activation and sinks[8].spilled_bytes > 6 * 3 * activation
    for n in (2, 8):
        assert spilled[n][2].keys() == held[n][2].keys()
        for k, v in held[n][2].items():
            got = spilled[n][2][k]
            assert got.dtype == v.dtype and np.array_equal(got, v), k
    for sink in sinks.values():
        sink.close()
    assert not any(tmp_path.iterdir())


def test_streamed_and_resident_references_agree_exactly(stacks):
    model = load_model(stacks[2])
    ids, mask = np.array([[1, 5, 9, 2]]), np.array([[1, 1, 1, 0]])
    streamed = build_reference(model.config, model.weights, np.float64).forward(ids, mask)
    resident = build_reference(model.config, model.weights, np.float64, stream=False).forward(ids, mask)
    assert streamed.keys() == resident.keys()
    assert all(np.array_equal(streamed[k], resident[k]) for k in streamed)


def test_estimate_counts_the_alternatives_copy_and_one_streamed_layer(stacks):
    from debug_framework.architectures.layout import HEAD_BLOCK_BYTES
    from debug_framework.backends.python_reference import PythonReferenceBackend
    from debug_framework.backends.pytorch import PyTorchBackend
    from debug_framework.services.validation.memory import estimate_memory

    model = load_model(stacks[8])
    params = sum(int(np.prod(model.weights.shape(n))) for n in model.weights)
    est = estimate_memory(model, reference=PythonReferenceBackend(), reference_dtype="float64",
                          alternative=PyTorchBackend(), alternative_dtype="float32", batch=2, length=16)
    assert est.parameters == params
    assert est.alternative == params * 4
    assert est.reference == _layer_bytes(model) + HEAD_BLOCK_BYTES  # float64, converted straight into the layer
    largest = max(int(np.prod(model.weights.shape(n))) for n in model.weights if n.startswith("model.layers.0."))
    half = estimate_memory(model, reference=PythonReferenceBackend(), reference_dtype="bfloat16",
                           alternative=PyTorchBackend(), alternative_dtype="float32", batch=2, length=16)
    assert half.reference == _layer_bytes(model) // 4 + largest * 8 + HEAD_BLOCK_BYTES  # + one tensor's float64
    assert est.file_pages == params * 4  # save_pretrained wrote float32
    assert est.total == est.runtime + est.alternative + est.reference + est.calibration + est.activations
    on_gpu = estimate_memory(model, reference=PythonReferenceBackend(), reference_dtype="float64",
                             alternative=PyTorchBackend(), alternative_dtype="float32", device="cuda")
    assert on_gpu.alternative == 0


def test_estimate_of_float64_eager_counts_one_layer_and_what_it_holds_whole(stacks, monkeypatch):
    """The generic tier's reference streams its layers and its large tables: the estimate counts one
    layer, the tensors it holds whole and a block of table rows, not the whole model."""
    from debug_framework.architectures.layout import HEAD_BLOCK_BYTES
    from debug_framework.backends.eager_reference import EagerReferenceBackend
    from debug_framework.backends.pytorch import PyTorchBackend
    from debug_framework.services.validation import memory

    model = load_model(stacks[8])
    sizes = {n: int(np.prod(model.weights.shape(n))) for n in model.weights}
    layers = sum(v for n, v in sizes.items() if n.startswith("model.layers."))
    outside = sum(sizes.values()) - layers
    kwargs = dict(reference=EagerReferenceBackend(), reference_dtype="float64", alternative=PyTorchBackend(),
                  alternative_dtype="float32", batch=2, length=16)
    est = memory.estimate_memory(model, **kwargs)
    assert est.reference == _layer_bytes(model) + outside * 8 + HEAD_BLOCK_BYTES  # tables too small to stream
    monkeypatch.setattr(memory, "STREAMED_TABLE_ELEMENTS", 1)  # every 2-D tensor outside the layers streams
    tables = sum(v for n, v in sizes.items() if not n.startswith("model.layers.") and len(model.weights.shape(n)) == 2)
    assert tables > 0
    est = memory.estimate_memory(model, **kwargs)
    assert est.reference == _layer_bytes(model) + (outside - tables) * 8 + HEAD_BLOCK_BYTES


def test_a_session_over_the_budget_is_df007_before_it_runs(stacks, tmp_path):
    from debug_framework import ValidationEngine

    engine = ValidationEngine(tmp_path / "db.sqlite", config={"memory_budget": 64 * 2**20})
    with pytest.raises(ResourceExhaustedError) as err:
        engine.create_session(stacks[2], {}, "auto", "pytorch")
    text = str(err.value)
    assert "DF007" in text and "would need about" in text and "budget of 0.06 GiB" in text
    assert "--reference-dtype float32" in text and "--layers" in text and "PIE_DEBUG_MEMORY_BUDGET" in text
    assert engine.list_sessions() == []  # nothing was created


def test_memory_budget_from_the_environment():
    assert from_environment({"PIE_DEBUG_MEMORY_BUDGET": "12G"}) == {"memory_budget": 12 * 2**30}
    assert from_environment({"PIE_DEBUG_MEMORY_BUDGET": "512MiB"}) == {"memory_budget": 512 * 2**20}
    assert from_environment({"PIE_DEBUG_MEMORY_BUDGET": "off"}) == {"memory_budget": "off"}
    with pytest.raises(FrameworkInitializationError, match="PIE_DEBUG_MEMORY_BUDGET"):
        from_environment({"PIE_DEBUG_MEMORY_BUDGET": "lots"})


def test_session_records_its_peak_memory_estimate_and_stage_times(stacks, tmp_path):
    from debug_framework import ValidationEngine

    engine = ValidationEngine(tmp_path / "db.sqlite", config={"memory_budget": "off"})
    sid = engine.create_session(stacks[2], {"isolate": False, "input_shape": [1, 8]}, "auto", "pytorch")
    engine.run(sid)
    perf = engine.get_performance_metrics(sid)
    memory = perf["memory"]
    assert memory["method"] == "rss_sampled_10ms"
    assert memory["peak_rss_bytes"] >= max(memory["stage_peak_rss_bytes"].values()) > 50 * 2**20
    assert {"load", "prepare", "reference", "alternative", "calibration", "compare"} <= set(perf["stage_s"])
    assert memory["estimate_bytes"]["total"] > memory["estimate_bytes"]["alternative"] > 0


def test_stored_tensors_convert_in_one_step_exactly_as_through_float32():
    import torch

    from debug_framework.modelio.weights import tensor_numpy

    src = torch.randn(64, 48, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    for stored in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        t = src.to(stored)
        for host in (np.float64, np.float32):
            old = np.asarray((t.to(torch.float32) if stored in (torch.bfloat16, torch.float16) else t).numpy(), host)
            new = tensor_numpy(t, host)
            assert new.dtype == host and np.array_equal(new, old)
    same = src.to(torch.float32)
    assert np.shares_memory(tensor_numpy(same, np.float32), same.numpy())  # no copy when the dtype matches


def test_the_pytorch_alternative_is_built_without_random_weights_and_owns_them(stacks):
    """Built on the meta device and given the file's weights: nothing left on meta, the computed
    buffers (rotary frequencies) as a model built the plain way has them, the same logits, and its
    weights its own (an in-place change does not reach the file's tensors)."""
    import torch

    from debug_framework.backends.pytorch import build_hf_model, hf_skeleton

    model = load_model(stacks[2])
    net = build_hf_model(model, torch.float32)
    plain, _ = hf_skeleton(model, torch.float32)
    plain.load_state_dict({n: model.weights[n] for n in plain.state_dict() if n in model.weights}, strict=False)
    plain.tie_weights()
    assert not any(t.is_meta for t in [*net.parameters(), *net.buffers()])
    for (name, a), (_, b) in zip(net.named_buffers(), plain.named_buffers()):
        assert torch.equal(a, b), name
    ids = torch.arange(8)[None] % 64
    with torch.no_grad():
        assert torch.equal(net(input_ids=ids).logits, plain.eval()(input_ids=ids).logits)
        net.model.embed_tokens.weight.mul_(2.0)
    assert not torch.equal(net.model.embed_tokens.weight, model.weights["model.embed_tokens.weight"])


def test_half_precision_references_read_narrow_weights_through_float32():
    """A bfloat16 reference reads float32-or-narrower tensors through float32 (half the float64
    host copy) and float64 tensors through float64, with the values torch's own conversion gives."""
    import torch

    from debug_framework.architectures.layout import _Converter
    from debug_framework.architectures.xp import torch_namespace

    class Stored(dict):
        def dtype_name(self, name: str) -> str:
            return {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16"}[self[name].dtype]

    wide = 1 + 2.0**-8 + torch.arange(1, 60, dtype=torch.float64) * 2.0**-30
    weights = Stored(f64=wide, f32=wide.to(torch.float32), bf16=wide.to(torch.bfloat16))
    convert = _Converter(weights, torch_namespace(), torch.bfloat16)
    for name, t in weights.items():
        assert torch.equal(convert(name), t.to(torch.bfloat16)), name
    assert convert._host_of("f32") == np.float32 and convert._host_of("f64") == np.float64


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
def test_the_runtime_counts_the_process_own_memory_not_the_file_pages_it_maps(tmp_path):
    import mmap

    from debug_framework.services.validation.memory import current_rss, own_memory

    path = tmp_path / "pages"
    path.write_bytes(b"\1" * (64 * 2**20))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        before_rss, before_own = current_rss(), own_memory()
        assert sum(pages[i] for i in range(0, len(pages), 4096)) == len(pages) // 4096  # touch every page
        assert current_rss() - before_rss > 48 * 2**20  # the mapped pages are resident
        assert own_memory() - before_own < 8 * 2**20  # but not the process's own


def _untimed(doc):
    """A result's JSON without its session id, performance and seconds (``*_s``)."""
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if k not in ("session_id", "performance") and not k.endswith("_s")}
    return [_untimed(v) for v in doc] if isinstance(doc, list) else doc


@pytest.mark.slow  # two whole sessions with isolation (about 2 s)
def test_a_session_spilling_its_checkpoints_judges_exactly_as_one_holding_them(stacks, tmp_path):
    """With a capture budget of one byte every captured checkpoint and layer input of the three runs
    goes to disk as it is produced (and the folder is gone after the run); the session's rows, its
    verdict and its isolation are those of the same session holding them in memory. Each capturing
    stage and the isolation report their layers as they get through them."""
    from debug_framework import ValidationEngine

    def session(budget: int | str, name: str) -> tuple[dict, list]:
        engine = ValidationEngine(tmp_path / f"{name}.sqlite",
                                  config={"memory_budget": "off", "capture_memory_budget": budget})
        sid = engine.create_session(stacks[2], {"input_shape": [2, 8]}, "auto", "pytorch")
        layers: list = []
        full = engine.run(sid, layer_progress=lambda *a: layers.append(a)).to_dict()
        captured = full["performance"]["memory"].get("capture_bytes")
        assert captured is None if budget == "off" else (captured["on_disk"] > 0 and captured["in_memory"] <= 1)
        result = _untimed(full)
        assert not (tmp_path / f"{name}_tensors" / "spill").exists() or \
            not any((tmp_path / f"{name}_tensors" / "spill").iterdir())
        return result, layers

    spilled, layers = session(1, "spilled")
    held, _ = session("off", "held")
    assert spilled == held
    assert spilled["isolation"] and spilled["results"]  # isolation ran, checkpoints were judged
    for stage in ("reference", "alternative", "calibration", "isolation"):
        seen = [done for name, done, total in layers if name == stage]
        assert seen and seen[-1] == 2 and sorted(seen) == seen, (stage, layers)


def test_spilled_tensors_come_back_with_their_dtype_shape_and_bits(tmp_path):
    """Over budget, each tensor goes to a file and comes back the same (a torch tensor as a torch
    tensor, bfloat16 and strided ones included); a folder that cannot be written keeps it in memory."""
    import torch

    values = {"bf16": torch.randn(4, 5).to(torch.bfloat16), "strided": torch.randn(4, 6)[:, ::2],
              "bool": torch.tensor([True, False]), "f16": np.arange(6, dtype=np.float16).reshape(2, 3),
              "scalar": np.full((), 3.0)}
    sink = CaptureSink(tmp_path / "spill", budget=0)
    assert type(checkpoint_dict()) is dict  # no sink active: a plain dict
    with capture_sink(sink):
        held = checkpoint_dict()
    for k, v in values.items():
        held[k] = v
    assert held.spilled() == len(values) and sink.resident == 0
    for k, v in values.items():
        got = held[k]
        assert type(got) is type(v) and got.dtype == v.dtype and tuple(got.shape) == tuple(v.shape), k
        assert (torch.equal(got, v) if isinstance(v, torch.Tensor) else np.array_equal(got, v)), k
    sink.close()
    assert not (tmp_path / "spill").exists()
    (tmp_path / "file").write_text("")
    stuck = CaptureSink(tmp_path / "file" / "spill", budget=0)
    with capture_sink(stuck):
        kept = checkpoint_dict()
    kept["x"] = np.ones(3)
    assert kept.spilled() == 0 and np.array_equal(kept["x"], np.ones(3))
