"""Tiny random models with small activations (hidden states ~0.02: the regime where fixed absolute
tolerances hide bugs), saved as Hugging Face directories."""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("llama", "qwen2", "bert")
_DECODER = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6)
_BERT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             max_position_embeddings=64, type_vocab_size=2)


#: weight scales by name fragment (first match): sharp attention (query/key), BERT's MLP in GELU's
#: curved range; the decoders' residual stream stays small (~0.02) from the 0.02 default.
_SCALES = {"decoder": (("q_proj", 0.25), ("k_proj", 0.25)),
           "bert": (("query", 0.25), ("key", 0.25), ("intermediate", 0.25), ("", 0.1))}


def _scale(family: str, name: str) -> float:
    for fragment, scale in _SCALES["bert" if family == "bert" else "decoder"]:
        if fragment in name:
            return scale
    return 0.02


def make_model(family: str, directory: Path, seed: int = 0) -> Path:
    """``family`` in :data:`FAMILIES`: weights N(0, 0.02) (transformers' own initialisation scale;
    see :data:`_SCALES` for the exceptions), norm weights 1 + N(0, 0.1) and biases N(0, scale) so
    that dropping either changes something."""
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if family == "bert":
        net = BertModel(BertConfig(**_BERT), add_pooling_layer=False)
    elif family == "qwen2":
        net = Qwen2ForCausalLM(Qwen2Config(**_DECODER))
    else:
        net = LlamaForCausalLM(LlamaConfig(**_DECODER))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            norm = "norm" in name.lower()
            base, scale = (1.0, 0.1) if norm and name.endswith("weight") else (0.0, _scale(family, name))
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    net.save_pretrained(str(directory))
    return directory
