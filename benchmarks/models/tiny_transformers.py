"""Tiny random models with small activations (hidden states ~0.02: the regime where fixed absolute
tolerances hide bugs), saved as Hugging Face directories."""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("llama", "qwen2", "bert", "mistral", "qwen3", "gemma2", "gemma3_text", "phi3", "qwen3_moe")
#: what the newer decoder families set beside the shared sizes: sliding windows shorter than the
#: sessions' sequences, local and global layers alternating, soft-caps that bite, experts.
WINDOW = 4
_FAMILY = {
    "mistral": dict(sliding_window=WINDOW),
    "qwen3": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "gemma2": dict(sliding_window=WINDOW, query_pre_attn_scalar=16, attn_logit_softcapping=0.5,
                   final_logit_softcapping=0.05),
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        query_pre_attn_scalar=16, final_logit_softcapping=0.05),
    "phi3": dict(sliding_window=WINDOW, pad_token_id=0),
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True),
}
_DECODER = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6)
_BERT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             max_position_embeddings=64, type_vocab_size=2)


#: weight scales by name fragment (first match): sharp attention (query/key), a router whose expert
#: choices are clear (no near-ties), BERT's MLP in GELU's curved range; the decoders' residual stream stays small (~0.02) from the 0.02 default.
_SCALES = {"decoder": (("q_proj", 0.25), ("k_proj", 0.25), ("qkv_proj", 0.25), ("mlp.gate.weight", 0.5)),
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
    elif family in _FAMILY:
        from transformers import AutoConfig, AutoModelForCausalLM

        kw = {k: v for k, v in _DECODER.items() if not (family == "phi3" and k == "head_dim")}
        net = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **kw, **_FAMILY[family]))
    elif family == "qwen2":
        net = Qwen2ForCausalLM(Qwen2Config(**_DECODER))
    else:
        net = LlamaForCausalLM(LlamaConfig(**_DECODER))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            norm = "norm" in name.lower()
            gemma = family.startswith("gemma")  # Gemma stores its norm weights less one
            base, scale = ((0.0 if gemma else 1.0), 0.1) if norm and name.endswith("weight") else (0.0, _scale(family, name))
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    net.save_pretrained(str(directory))
    return directory
