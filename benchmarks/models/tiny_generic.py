"""Tiny random models of many ``transformers`` families, built offline from their config classes
and saved as Hugging Face directories (``config.json`` + ``model.safetensors``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: model_type -> (model class name, config overrides). Hidden 32, 2 layers, vocab 100.
_DEC = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 64}
_ENC = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 100, "max_position_embeddings": 64}

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("MistralForCausalLM", {**_DEC, "sliding_window": 4}),
    "qwen3": ("Qwen3ForCausalLM", {**_DEC, "head_dim": 8}),
    "gemma2": ("Gemma2ForCausalLM", {**_DEC, "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8}),
    "gemma3_text": ("Gemma3ForCausalLM", {**_DEC, "head_dim": 8, "sliding_window": 4,
                                          "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": ("Phi3ForCausalLM", {**_DEC, "pad_token_id": 0}),
    "gpt2": ("GPT2LMHeadModel", {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 64}),
    "mixtral": ("MixtralForCausalLM", {**_DEC, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeForCausalLM", {**_DEC, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 32}),
    "roberta": ("RobertaModel", {**_ENC, "pad_token_id": 1, "max_position_embeddings": 80}),
    "distilbert": ("DistilBertModel", {"dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 4,
                                       "vocab_size": 100, "max_position_embeddings": 64}),
    "gpt_neox": ("GPTNeoXForCausalLM", {**_ENC, "use_parallel_residual": True}),
    "olmo2": ("Olmo2ForCausalLM", _DEC),
    "falcon": ("FalconForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                     "vocab_size": 100, "parallel_attn": True, "new_decoder_architecture": False,
                                     "multi_query": True}),
    "t5": ("T5ForConditionalGeneration", {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
                                          "num_decoder_layers": 2, "num_heads": 4, "vocab_size": 100,
                                          "decoder_start_token_id": 0}),
    "vit": ("ViTModel", {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "image_size": 16, "patch_size": 8, "num_channels": 3}),
    "starcoder2": ("Starcoder2ForCausalLM", _DEC),
    "stablelm": ("StableLmForCausalLM", {**_DEC, "num_key_value_heads": 4}),
}


FAMILIES["phi"] = ("PhiForCausalLM", dict(_ENC))
#: families of the breadth sweep (docs/models-and-backends.md): an MLP written inline in the layer
#: (OPT, BART), a flattened post-attention state (OPT), a bottlenecked encoder whose MLP is judged
#: with the whole layer (MobileBERT), a parallel block (Cohere), experts in one module (GraniteMoE), ALiBi (BLOOM)
_BART = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 100,
         "max_position_embeddings": 64, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
         "decoder_start_token_id": 2}
FAMILIES.update({
    "opt": ("OPTForCausalLM", {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "vocab_size": 100, "max_position_embeddings": 64, "word_embed_proj_dim": 32,
                               "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}),
    "bart": ("BartForConditionalGeneration", _BART),
    "mobilebert": ("MobileBertModel", {**_ENC, "embedding_size": 16, "intra_bottleneck_size": 16,
                                       "true_hidden_size": 16, "num_feedforward_networks": 2}),
    "cohere": ("CohereForCausalLM", {**_DEC, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "granitemoe": ("GraniteMoeForCausalLM", {**_DEC, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "bloom": ("BloomForCausalLM", {"hidden_size": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100}),
})


def build(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """The tiny random ``transformers`` model of ``model_type`` (seeded, float32, eval mode)."""
    import torch
    import transformers

    cls_name, kwargs = FAMILIES[model_type]
    config = transformers.AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    net = getattr(transformers, cls_name)._from_config(config, attn_implementation="eager")
    return net.eval()


def save(model_type: str, directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save the tiny model of ``model_type`` under ``directory/model_type`` and return that path."""
    out = directory / model_type
    build(model_type, seed, **overrides).save_pretrained(out)
    return out
