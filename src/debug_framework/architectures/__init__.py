"""The models written from the math once, over an array namespace: NumPy (the reference, float64
or float32) or ``mlx.core`` (the ``mlx`` backend runs these same classes and step functions).

Each model exposes ``embed``, ``layer(i, h, attention_mask) -> (post_attention, post_mlp)`` and
``forward(input_ids, attention_mask, want, layer_inputs, token_type_ids)``; checkpoints are keyed by
plain ``(name, layer)`` tuples (equal to ``capture.CheckpointKey``). Modules: ``xp`` (the array
namespaces), ``layout`` (weight layouts), ``ops`` (shared steps), ``walk`` (the checkpoint walk and
the model base), ``llama`` and ``bert`` (the families, each with its ``LAYOUT``).
"""

from ..errors import ModelLoadingError
from ..modelio.configs import BertModelConfig, LlamaModelConfig
from .bert import BertReference
from .layout import WeightSource
from .llama import LlamaReference
from .xp import NUMPY, ArrayNamespace

__all__ = ["LlamaReference", "BertReference", "build_reference"]


def build_reference(config: LlamaModelConfig | BertModelConfig, weights: WeightSource, dtype: object,
                    xp: ArrayNamespace = NUMPY) -> LlamaReference | BertReference:
    """The model for ``config.architecture`` (``"llama"`` or ``"bert"``) in ``xp`` arrays of ``dtype``."""
    if config.architecture == "llama":
        return LlamaReference(config, weights, dtype, xp)
    if config.architecture == "bert":
        return BertReference(config, weights, dtype, xp)
    raise ModelLoadingError(f"unsupported architecture {config.architecture!r}")
