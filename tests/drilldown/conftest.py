"""Fixtures of the drill-down tests: tiny BERT and Llama models (benchmarks/models, the judgement
suite's), the injected-bug backends of benchmarks/injected_bugs.py, and a plugin whose Triton gelu
kernel computes the sigmoid approximation instead of the erf GELU (run by Triton's interpreter)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.models.tiny_transformers import make_model  # noqa: E402

BUGGY_GELU = '''"""A Triton gelu with the sigmoid approximation x * sigmoid(1.702 x): not the erf GELU of aten::gelu."""
import torch
import triton
import triton.language as tl


@triton.jit
def _gelu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x / (1.0 + tl.exp(-1.702 * x)), mask=mask)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    flat = x.contiguous().reshape(-1)
    out = torch.empty_like(flat)
    if flat.numel():
        _gelu[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024)
    return out.reshape(x.shape)
'''


@pytest.fixture(scope="session")
def buggy_gelu_plugin(tmp_path_factory) -> Path:
    """The manifest of a plugin whose only kernel replaces aten::gelu with a wrong one."""
    folder = tmp_path_factory.mktemp("buggy_gelu")
    (folder / "gelu.py").write_text(BUGGY_GELU, encoding="utf-8")
    manifest = {"id": "drill-buggy-gelu", "version": "1.0.0", "backend": "triton", "sources": ["gelu.py"],
                "kernels": [{"name": "gelu", "op": "aten::gelu", "entry": "gelu", "dtypes": ["float32"]}]}
    (folder / "plugin.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder / "plugin.json"


#: The layer the ONNX and Inductor strategy tests drill.
DRILLED_LAYER = 1


@pytest.fixture(scope="session")
def bert_layer(tmp_path_factory):
    """A tiny BERT, its inputs (one padded row) and the float64 reference's input to layer
    :data:`DRILLED_LAYER` (shared by the ONNX and Inductor strategy tests)."""
    import numpy as np

    from debug_framework.backends import get_backend
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.modelio.loader import load_model

    model = load_model(str(make_model("bert", tmp_path_factory.mktemp("bert") / "hf")))
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=6, seed=0, pad_lengths=[0, 2])
    reference = get_backend("pytorch")
    reference.prepare(model, "float64", "cpu")
    hidden = np.asarray(reference.run(inputs, capture_layer_inputs=True).layer_inputs[DRILLED_LAYER], dtype=np.float64)
    return model, inputs, hidden
