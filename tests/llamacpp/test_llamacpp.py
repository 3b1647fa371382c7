"""The llamacpp engine end to end: tiny GGUFs written here (correct and with converter bugs) judged
at llama.cpp's precision, at float32, decoded through llama.cpp's KV cache, drilled to the ggml node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from debug_framework.backends.llamacpp.convert import write_gguf

from .conftest import validate

pytest.importorskip("xllamacpp")


@pytest.fixture(scope="module")
def files(hf_llama: Path, llama_gguf, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Llama as f32 / f16 / q8_0 / q4_0 GGUFs, and two converted with a bug."""
    out = tmp_path_factory.mktemp("gguf_files")

    def skip_permutation(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
        return original if name == "blk.1.attn_q.weight" else converted

    def gate_is_up(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
        if name == "blk.0.ffn_gate.weight":
            from safetensors.numpy import load_file

            return load_file(str(hf_llama / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"]
        return converted

    made = {t: llama_gguf(t) for t in ("f32", "f16", "q8_0", "q4_0")}
    made["no_permutation"] = write_gguf(hf_llama, out / "bug-perm.gguf", transform=skip_permutation)
    made["gate_is_up"] = write_gguf(hf_llama, out / "bug-gate.gguf", transform=gate_is_up)
    return made



@pytest.mark.parametrize("kind, conversion", [("f32", False), ("q8_0", False), ("f16", True), ("q4_0", True)])
def test_correct_files_pass_at_dtype_auto(engine, files, hf_llama, kind: str, conversion: bool) -> None:
    """--model-path FILE.gguf (llama.cpp against the file's own weights) and --model-path HF_DIR
    --alternative-model FILE.gguf (the conversion), at llama.cpp's defaults (F16 KV cache)."""
    if conversion:
        result = validate(engine, hf_llama, alternative_options={"model_file": str(files[kind])})
    else:
        result = validate(engine, files[kind])
    assert result.passed, [c.to_dict() for c in result.results if not c.passed]
    assert result.consistent_with is None


@pytest.mark.parametrize("kind, consistent", [("q8_0", "q8_0"), ("f32", "float16")])
def test_correct_files_at_float32_fail_consistent_with_their_precision(engine, files, kind: str,
                                                                       consistent: str) -> None:
    """q8_0: its quantization; f32 at llama.cpp's defaults: the F16 KV cache."""
    result = validate(engine, files[kind], dtype="float32")
    assert not result.passed and result.consistent_with == consistent


@pytest.mark.parametrize("bug, layer, block, node", [("no_permutation", 1, "attention", "Qcur-1"),
                                                    ("gate_is_up", 0, "mlp", "ffn_gate-0")])
def test_converter_bugs_at_their_layer_block_and_node(engine, files, hf_llama, bug: str, layer: int, block: str,
                                                      node: str) -> None:
    result = validate(engine, hf_llama, alternative_options={"model_file": str(files[bug])}, isolate=True,
                       drill_down=True)
    source = result.source
    assert not result.passed and source is not None
    assert (source.kind, source.layer, source.block) == ("layer", layer, block)
    drilled = {d.layer: d for d in result.drilldown or []}
    assert drilled[layer].method == "ggml" and drilled[layer].culprit is not None
    culprit = drilled[layer].culprit
    assert culprit.node == node
    # the node's standalone repro reproduces alone, and says fixed once the node computes the product
    from debug_framework.repro_format import verify

    assert culprit.verified and culprit.repro_dir is not None, drilled[layer].note
    repro = Path(culprit.repro_dir)
    x, w = (np.load(repro / f"{name}.npy") for name in ("input", "weight"))
    np.save(repro / "engine.npy", (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))
    assert verify(repro).verdict == "fixed"


def test_two_decode_steps_through_llamas_cache_pass(engine, files) -> None:
    result = validate(engine, files["q8_0"], decode_steps=2)
    assert result.passed
    steps = {c.to_dict().get("step") for c in result.results}
    assert {1, 2} <= steps
    assert [row.step for row in result.decoded.token_metrics] == [0, 1, 2]
    kv = result.decoded.kv_cache  # the keys and values llama.cpp writes, every layer, every pass
    assert {(row.step, row.layer) for row in kv} == {(s, i) for s in range(3) for i in range(2)}
    assert all(row.k.passed and row.v.passed for row in kv)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_families_match_the_reference_with_an_f32_cache(family: str, request, tmp_path: Path) -> None:
    """llama.cpp at an F32 KV cache with flash attention off is float32-exact against the reference."""
    from debug_framework.backends.llamacpp.runner import LlamaCppBackend
    from debug_framework.backends.python_reference import PythonReferenceBackend
    from debug_framework.modelio import ModelInputs, load_model

    model = load_model(write_gguf(request.getfixturevalue(f"hf_{family}"), tmp_path / "m.gguf"))
    inputs = ModelInputs.random(model.config.vocab_size, 2, 8, seed=1, pad_lengths=[0, 2])
    ref, alt = PythonReferenceBackend(), LlamaCppBackend(cache_type_k="f32", cache_type_v="f32", flash_attn="off")
    ref.prepare(model, "float64")
    alt.prepare(model, "float32")
    r, a = ref.run(inputs), alt.run(inputs)
    mask = inputs.attention_mask.astype(bool)
    for key, value in r.tensors.items():
        want = np.asarray(value, np.float64)[mask]
        err = np.abs(np.asarray(a.tensors[key], np.float64)[mask] - want).max() / np.abs(want).max()
        assert err < 5e-6, (key, err)


def test_the_reference_counts_windows_as_the_engine_declares(files) -> None:
    """llama.cpp runs each row as its own sequence (``window_counts: tokens``); a reference prepared
    for it counts so too, one prepared for an engine that declares nothing counts cache columns."""
    from debug_framework.backends import get_backend
    from debug_framework.backends.capabilities import capabilities, count_windows_as
    from debug_framework.modelio import load_model

    llama = get_backend("llamacpp")
    assert capabilities(llama).window_counts == "tokens"
    assert llama.version_info()["window_counts"] == "tokens"
    reference = get_backend("python_reference")
    reference.prepare(load_model(files["f32"]), "float64")
    assert count_windows_as(reference, llama) == "tokens" and reference.version_info()["window_counts"] == "tokens"
    assert count_windows_as(reference, get_backend("pytorch")) == "columns"


def test_settings_are_checked_and_recorded(files) -> None:
    from debug_framework.backends import get_backend
    from debug_framework.errors import BackendInitializationError
    from debug_framework.modelio import load_model

    with pytest.raises(BackendInitializationError, match="DF002.*flash_attn"):
        get_backend("llamacpp", flash_attn="sometimes")
    backend = get_backend("llamacpp", cache_type_k="q8_0")
    backend.prepare(load_model(files["q4_0"]), "float32")
    info = backend.version_info()
    assert info["cache_type_k"] == "q8_0" and info["binding_pinned_to"] and "Q4_0" in info["precision"]


def test_a_layout_that_does_not_match_is_a_df002(monkeypatch) -> None:
    from debug_framework.backends.llamacpp import binding
    from debug_framework.errors import BackendInitializationError

    lib = binding.library()
    context = lib.context_params()
    context.n_batch = 7  # what a shifted field would read
    with pytest.raises(BackendInitializationError, match="DF002.*n_batch"):
        binding._check_defaults(context, lib.model_params())


def test_a_session_without_a_gguf_or_with_another_models_is_a_df002(engine, files, hf_llama, hf_qwen2) -> None:
    from debug_framework.errors import BackendInitializationError

    with pytest.raises(BackendInitializationError, match="DF002.*runs a GGUF file"):
        engine.create_session(hf_llama, {"input_shape": [1, 4], "dtype": "auto"}, alternative_backend="llamacpp")
    with pytest.raises(BackendInitializationError, match="DF002.*is not this model"):
        validate(engine, hf_qwen2, alternative_options={"model_file": str(files["f32"])})
