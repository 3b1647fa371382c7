"""The models written from the math once, over an array namespace: NumPy (the reference, float64
or float32), ``torch`` (``torch_reference``) or an engine's own arrays (a namespace it registers,
:func:`.xp.register_namespace`) run these same classes and step functions.

Each model exposes ``embed``, ``layer(i, h, attention_mask) -> (post_attention, post_mlp)`` and
``forward(input_ids, attention_mask, want, layer_inputs, token_type_ids)``; checkpoints are keyed by
plain ``(name, layer)`` tuples (equal to ``capture.CheckpointKey``). Modules: ``xp`` (the array
namespaces), ``layout`` (weight layouts), ``ops`` (shared steps), ``walk`` (the checkpoint walk and
the model base), the families: ``llama`` (Llama, Qwen2), ``decoder`` (Mistral, Qwen3, Phi-3),
``gemma`` (Gemma 2, Gemma 3 text), ``moe`` (Qwen3-MoE) and ``bert``.
"""

from ..errors import ModelLoadingError
from ..modelio.configs import BertModelConfig, GemmaModelConfig, LlamaModelConfig, MoeModelConfig
from .bert import BertReference
from .decoder import DecoderReference
from .gemma import GemmaReference
from .layout import WeightSource
from .llama import LlamaReference
from .moe import MoeReference
from .xp import NUMPY, ArrayNamespace

__all__ = ["LlamaReference", "DecoderReference", "GemmaReference", "MoeReference", "BertReference",
           "ReferenceModel", "build_reference"]

#: any model of this package.
ReferenceModel = LlamaReference | BertReference

#: model types whose layers are Llama's exactly (the others take :class:`DecoderReference` and its subclasses).
_PLAIN_LLAMA = frozenset({"llama", "qwen2"})


def build_reference(config: LlamaModelConfig | BertModelConfig, weights: WeightSource, dtype: object,
                    xp: ArrayNamespace = NUMPY, *, stream: bool | None = None) -> ReferenceModel:
    """The model of ``config``'s family in ``xp`` arrays of ``dtype``, its weights streamed layer by
    layer or resident (``stream``; default: streamed over NumPy and torch, see ``walk.Model``)."""
    if isinstance(config, GemmaModelConfig):
        return GemmaReference(config, weights, dtype, xp, stream=stream)
    if isinstance(config, MoeModelConfig):
        return MoeReference(config, weights, dtype, xp, stream=stream)
    if isinstance(config, LlamaModelConfig):
        if config.model_type in _PLAIN_LLAMA:
            return LlamaReference(config, weights, dtype, xp, stream=stream)
        return DecoderReference(config, weights, dtype, xp, stream=stream)
    if config.architecture == "bert":
        return BertReference(config, weights, dtype, xp, stream=stream)
    raise ModelLoadingError(f"unsupported architecture {config.architecture!r}")
