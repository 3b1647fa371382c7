"""The workloads the runner knows, at two sizes: ``full`` (the benchmark) and ``tiny`` (quick mode, CI)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Workload", "WORKLOADS", "ALIASES", "get_workload", "param_count", "resolve_names"]


def param_count(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@dataclass(frozen=True)
class Workload:
    name: str
    display: str
    family: str  # "transformer" | "cnn" | "ssm"
    description: str
    build_fn: Callable[[str], tuple[nn.Module, tuple[Any, ...]]]

    def build(self, size: str = "full") -> tuple[nn.Module, tuple[Any, ...]]:
        """(model in eval mode, example positional inputs); seeded, so two builds are identical."""
        if size not in ("full", "tiny"):
            raise ValueError("size must be 'full' or 'tiny'")
        torch.manual_seed(0)
        model, inputs = self.build_fn(size)
        return model.eval(), inputs


def _bert_minilm(size: str) -> tuple[nn.Module, tuple[Any, ...]]:
    from . import bert

    if size == "tiny":  # no tiny MiniLM exists: a tiny random BERT with the same code path
        model = bert.bert_random(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64)
        enc = bert.tokenize(1, 16)
        return model, (enc["input_ids"] % 1000, enc["attention_mask"])
    enc = bert.tokenize(1, 128)
    return bert.minilm(), (enc["input_ids"], enc["attention_mask"])


def _bert_base(size: str) -> tuple[nn.Module, tuple[Any, ...]]:
    from . import bert

    if size == "tiny":
        model = bert.bert_random(vocab_size=1000, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=96, max_position_embeddings=64)
        enc = bert.tokenize(1, 16)
        return model, (enc["input_ids"] % 1000, enc["attention_mask"])
    enc = bert.tokenize(1, 128)
    return bert.bert_random(), (enc["input_ids"], enc["attention_mask"])


def _resnet18(size: str) -> tuple[nn.Module, tuple[Any, ...]]:
    from .resnet import ResNet18

    if size == "tiny":
        return ResNet18(num_classes=10, widths=(4, 8, 16, 32)), (torch.randn(1, 3, 32, 32),)
    return ResNet18(), (torch.randn(1, 3, 224, 224),)


def _ssm(size: str) -> tuple[nn.Module, tuple[Any, ...]]:
    from .mamba import MambaLM

    if size == "tiny":
        return MambaLM(vocab_size=256, d_model=32, n_layers=2, d_state=8, chunk=8), (torch.randint(0, 256, (1, 16)),)
    return MambaLM(chunk=8), (torch.randint(0, 6144, (1, 64)),)


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("bert-minilm", "BERT all-MiniLM-L6-v2", "transformer",
             "real all-MiniLM-L6-v2 weights (6 layers, hidden 384), batch 1 x 128 tokens", _bert_minilm),
    Workload("bert-base", "BERT-base (random)", "transformer",
             "BertConfig() defaults with random weights (12 layers, hidden 768), batch 1 x 128 tokens", _bert_base),
    Workload("resnet18", "ResNet-18", "cnn", "standard ResNet-18 layout, random weights, batch 1 x 3 x 224 x 224",
             _resnet18),
    Workload("ssm", "SSM (Mamba-style)", "ssm",
             "14 Mamba blocks (d_model 512, d_state 16, chunked selective scan T=8), vocab 6144, batch 1 x 64 tokens", _ssm),
]}

#: Names the spec's README uses (``--model bert --model resnet``).
ALIASES: dict[str, list[str]] = {"bert": ["bert-minilm", "bert-base"], "resnet": ["resnet18"], "mamba": ["ssm"]}


def resolve_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        for m in ALIASES.get(n, [n]):
            if m not in WORKLOADS:
                raise KeyError(n)
            if m not in out:
                out.append(m)
    return out


def get_workload(name: str) -> Workload:
    return WORKLOADS[name]
