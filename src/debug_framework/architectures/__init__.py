"""Reference models written from the math in NumPy (float64 or float32).

Each model exposes ``embed``, ``layer(i, h, attention_mask) -> (post_attention, post_mlp)`` and
``forward(input_ids, attention_mask, want, layer_inputs, token_type_ids)``; checkpoints are keyed by
plain ``(name, layer)`` tuples (equal to ``capture.CheckpointKey``).
"""

from typing import Any

from ..errors import ModelLoadingError
from .bert import BertReference
from .llama import LlamaReference

__all__ = ["LlamaReference", "BertReference", "build_reference"]


def build_reference(config: Any, weights: Any, dtype: Any) -> LlamaReference | BertReference:
    """The reference model for ``config.architecture`` (``"llama"`` or ``"bert"``)."""
    if config.architecture == "llama":
        return LlamaReference(config, weights, dtype)
    if config.architecture == "bert":
        return BertReference(config, weights, dtype)
    raise ModelLoadingError(f"unsupported architecture {config.architecture!r}")
