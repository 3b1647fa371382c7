"""Fixtures of the ExecuTorch tests: a tiny Llama (3 layers, hidden 32, no grouped-query attention, so
ExecuTorch's Inspector runs on it too) and programs exported from it the way a user exports them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

#: the layer the broken programs scale the MLP output of (the tests read it through ``broken_layer``)
BROKEN_LAYER = 1


@pytest.fixture(scope="session")
def broken_layer() -> int:
    return BROKEN_LAYER


def _config(layers: int = 3):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=64)


@pytest.fixture(scope="session")
def tiny_et_llama(tmp_path_factory) -> Path:
    """A 3-layer Llama with random weights saved with save_pretrained."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config()).eval()
    out = tmp_path_factory.mktemp("tiny_et_llama") / "hf"
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def one_layer_llama(tmp_path_factory) -> Path:
    """The same Llama with one layer: the XNNPACK case (its lowering is the slowest step)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("one_layer_llama") / "hf"
    LlamaForCausalLM(_config(1)).eval().save_pretrained(str(out))
    return out


class _LogitsAndHidden(torch.nn.Module):
    """What a user exports to see the hidden states: ``(logits, *hidden_states)``."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.net(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        return (out.logits, *out.hidden_states)


class _Logits(torch.nn.Module):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


@pytest.fixture(scope="session")
def user_program_exporter():
    """:func:`export_user_program`, for the test modules (tests are not a package)."""
    return export_user_program


def export_user_program(model_dir: Path, path: Path, *, hidden_states: bool, broken: bool,
                        shape: tuple[int, int] = (2, 16)) -> Path:
    """Export the model as a user does (``torch.export``, portable kernels, ``write_to_file``), with
    the hidden states as outputs or the logits alone; ``broken``: layer :data:`BROKEN_LAYER`'s MLP
    output scaled by 1.01 first (a wrong kernel in that layer)."""
    from executorch.exir import to_edge_transform_and_lower
    from transformers import LlamaForCausalLM

    net = LlamaForCausalLM.from_pretrained(str(model_dir)).eval()
    if broken:
        with torch.no_grad():
            net.model.layers[BROKEN_LAYER].mlp.down_proj.weight.mul_(1.01)
    module = _LogitsAndHidden(net) if hidden_states else _Logits(net)
    ids = torch.randint(0, 128, shape)
    mask = torch.ones(shape, dtype=torch.long)
    with torch.no_grad():
        exported = torch.export.export(module, (ids, mask), strict=False)
    program = to_edge_transform_and_lower(exported).to_executorch()
    with open(path, "wb") as fh:
        program.write_to_file(fh)
    return path
