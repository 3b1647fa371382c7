"""Fixtures of the llama.cpp / GGUF tests: tiny random decoders written with ``save_pretrained``
(one per family, once per session), and the tiny Llama's GGUFs (one per tensor type, once per session)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # no network, ever, in these tests
os.environ["TRANSFORMERS_OFFLINE"] = "1"

#: The shape every tiny test model has: 2 layers, GQA 4/2 heads of 16, rows of 64 (two Q8/Q4 blocks).
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6)


def make_hf(kind: str, directory: Path, seed: int = 0, **overrides: object) -> Path:
    """A tiny random ``llama`` / ``mistral`` / ``qwen2`` / ``qwen3`` / ``phi3`` / ``gemma2`` /
    ``gemma3_text`` / ``qwen3_moe`` decoder saved as a Hugging Face directory."""
    import torch
    import transformers

    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
               "phi3": ("Phi3Config", "Phi3ForCausalLM"), "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
               "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
               "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}
    config_class, model_class = (getattr(transformers, name) for name in classes[kind])
    torch.manual_seed(seed)
    extra = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2} if kind == "phi3" else {}
    if kind.startswith("gemma"):  # llama.cpp's Gemma scales queries by head_dim ** -0.5; a window of 4 slides in 8 tokens
        extra = {"query_pre_attn_scalar": TINY["head_dim"], "sliding_window": 4, "tie_word_embeddings": True}
    model = model_class(config_class(**{"tie_word_embeddings": False, **TINY, **extra, **overrides}))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale, base = (0.1, 1.0) if "norm" in name else (0.08, 0.0)
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Llama (GQA 4/2 heads), Hugging Face directory."""
    return make_hf("llama", tmp_path_factory.mktemp("gguf_llama") / "hf")


@pytest.fixture(scope="session")
def llama_gguf(hf_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``llama_gguf(tensor_type)``: the tiny Llama as a GGUF of ``tensor_type`` (``"f32"``, ``"q8_0"``
    ...), written once per session and only read by the tests."""
    from debug_framework.backends.llamacpp.convert import write_gguf

    out, made = tmp_path_factory.mktemp("gguf_llama_files"), {}

    def written(tensor_type: str) -> Path:
        if tensor_type not in made:
            made[tensor_type] = write_gguf(hf_llama, out / f"{tensor_type}.gguf", tensor_type=tensor_type)
        return made[tensor_type]
    return written


@pytest.fixture(scope="session")
def hf_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Qwen2 (q/k/v biases), Hugging Face directory."""
    return make_hf("qwen2", tmp_path_factory.mktemp("gguf_qwen2") / "hf", seed=3)


@pytest.fixture(scope="session")
def hf_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Qwen3 (q/k norms), Hugging Face directory."""
    return make_hf("qwen3", tmp_path_factory.mktemp("gguf_qwen3") / "hf", seed=5)


@pytest.fixture(scope="session")
def hf_mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Mistral (written as llama.cpp's ``llama``), Hugging Face directory."""
    return make_hf("mistral", tmp_path_factory.mktemp("gguf_mistral") / "hf", seed=7)


@pytest.fixture(scope="session")
def hf_phi3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Phi-3 (fused qkv and gate/up projections), Hugging Face directory."""
    return make_hf("phi3", tmp_path_factory.mktemp("gguf_phi3") / "hf", seed=9)


@pytest.fixture(scope="session")
def hf_gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Gemma 2 (soft-caps, a sliding window of 4 in layer 0, tied head), Hugging Face directory."""
    return make_hf("gemma2", tmp_path_factory.mktemp("gguf_gemma2") / "hf", seed=11)


@pytest.fixture(scope="session")
def hf_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer Gemma 3 text decoder (q/k norms, both layers sliding), Hugging Face directory."""
    return make_hf("gemma3_text", tmp_path_factory.mktemp("gguf_gemma3") / "hf", seed=13)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    """One validation engine (and database) per test module."""
    from debug_framework.services.validation_engine import ValidationEngine

    return ValidationEngine(tmp_path_factory.mktemp("llamacpp_db") / "db.sqlite")


def validate(engine, model: Path, **config: object):
    """A llama.cpp session on ``model`` (2 x 8 tokens, ``--dtype auto``; llama.cpp at its defaults,
    F16 KV cache and flash attention auto, unless ``config`` says otherwise), run."""
    cfg = {"input_shape": [2, 8], "dtype": "auto", **config}
    return engine.run(engine.create_session(model, cfg, alternative_backend="llamacpp"))
