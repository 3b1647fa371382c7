"""Load models from a path: weights (lazy), typed config, tokenizer, content digest.

Formats: a Hugging Face directory (``config.json`` + ``*.safetensors``, sharded with an index
too), a single ``.safetensors`` or ``.zt`` (ztensor 2.x) file with ``config.json`` beside it, and
``.bin``/``.pt`` state dicts read only through ``torch.load(weights_only=True)``.
"""

from .configs import (BertModelConfig, GemmaModelConfig, LlamaModelConfig, ModelConfig, MoeModelConfig, RopeScaling,
                      parse_config)
from .inputs import ModelInputs
from .loader import LoadedModel, expected_tensors, load_model
from .weights import WeightStore

__all__ = [
    "load_model",
    "LoadedModel",
    "ModelInputs",
    "LlamaModelConfig",
    "GemmaModelConfig",
    "MoeModelConfig",
    "BertModelConfig",
    "ModelConfig",
    "RopeScaling",
    "WeightStore",
    "expected_tensors",
    "parse_config",
]
