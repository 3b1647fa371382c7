"""The generic tier's configuration: any ``transformers`` model that loads offline from its directory.

Where no reference written from the math exists for a config (its ``model_type``, or a feature the
from-math reference does not implement such as sliding windows), the model is loaded as a
:class:`GenericModelConfig`: the model's own eager ``transformers`` code is then both the
reference (run in float64 on the CPU, the ``float64_eager`` backend) and the calibration (the same
code at the alternative's precision). Checkpoints are found from the module structure
(:mod:`debug_framework.capture.structure`).

This module reads ``config.json`` only; ``transformers`` is imported when a config is checked
(offline: ``AutoConfig.for_model``, never ``trust_remote_code``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

from ..errors import ModelLoadingError
from ..jsonio import JsonObject
from .files import short_repr

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from .inputs import ModelInputs

__all__ = ["GenericModelConfig", "generic_config", "hf_config_of", "auto_model_class", "MAP_YOURSELF",
           "INPUT_KINDS"]

#: How to run a model the generic tier cannot: the one hint every such DF004 carries.
MAP_YOURSELF = (
    "build the model yourself and map its modules to checkpoints: "
    "debug_framework.module_backend(name, builder, checkpoint_map={'model.layers.0': 'post_mlp:0', ...}, "
    "layer_modules={0: 'model.layers.0', ...}) (docs/models-and-backends.md, 'Map your own model')"
)

#: What a model's forward reads: token ids (decoders, encoders), pixels (ViT-like), or token ids
#: for an encoder and a decoder (T5-like encoder-decoders).
INPUT_KINDS = ("tokens", "pixels", "seq2seq")

#: The model's plain eager code: eager attention, and experts looped in eager PyTorch (transformers'
#: grouped matmul kernels do not run in float64).
EAGER_KWARGS: dict[str, str] = {"attn_implementation": "eager", "experts_implementation": "eager"}

#: Keys of config.json that only describe the file, not the model.
_FILE_KEYS = ("architectures", "_name_or_path", "transformers_version", "auto_map", "torch_dtype", "dtype")


@dataclass(frozen=True)
class GenericModelConfig:
    """A model run through its own eager ``transformers`` code (the generic tier).

    Attributes:
        model_type: ``config.json``'s ``model_type``.
        model_class: the ``transformers`` class that builds it (``architectures[0]`` when
            transformers has it, else the Auto class for its kind).
        num_hidden_layers: the number of layers checkpoints are numbered over (encoder and decoder
            layers together for an encoder-decoder: the decoder's follow the encoder's).
        vocab_size: the token vocabulary (0 for a model without token inputs).
        max_position_embeddings: the longest input its positions allow (a large bound when the
            config sets none).
        input_kind: one of :data:`INPUT_KINDS`.
        image_size, num_channels: a pixel model's input ``[batch, channels, size, size]``.
        why_generic: why no reference written from the math judges it.
        hidden_size: the width of the residual stream (0 when the config names none).
    """

    architecture: ClassVar[str] = "generic"
    model_type: str
    model_class: str
    num_hidden_layers: int
    vocab_size: int
    max_position_embeddings: int
    input_kind: str = "tokens"
    image_size: int = 0
    num_channels: int = 3
    hidden_size: int = 0
    why_generic: str = ""
    encoder_layers: int = 0
    #: the mixture-of-experts layers (their ``router_logits`` checkpoints) and the experts each token takes
    router_layers: tuple[int, ...] = ()
    experts_per_token: int = 0
    #: the files store names transformers converts on loading (fused experts, renamed modules), so
    #: transformers' own loader reads them
    weights_renamed: bool = False
    extra: JsonObject = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers


def _transformers(source: str) -> ModuleType:
    try:
        import transformers
    except ImportError as exc:
        raise ModelLoadingError("the generic tier needs transformers, which is not installed",
                                hint="pip install transformers, or " + MAP_YOURSELF, file=source) from exc
    return transformers


def hf_config_of(raw: JsonObject, source: str = "config.json") -> PretrainedConfig:
    """The ``transformers`` config of ``raw`` built offline (``AutoConfig.for_model``); DF004 naming
    what is missing for a config it cannot build (no ``model_type``, custom code, an unknown type)."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelLoadingError("config.json names no model_type, so no transformers class can build the model",
                                hint="add the model's model_type to config.json, or " + MAP_YOURSELF, file=source)
    if "auto_map" in raw:
        raise ModelLoadingError(
            f"model_type {short_repr(model_type)} needs custom code (auto_map / trust_remote_code), which is "
            "never run", hint=MAP_YOURSELF, file=source)
    transformers = _transformers(source)
    try:
        return transformers.AutoConfig.for_model(**{k: v for k, v in raw.items() if k not in _FILE_KEYS})
    except ValueError as exc:
        raise ModelLoadingError(f"transformers {transformers.__version__} has no model_type "
                                f"{short_repr(model_type)} offline: {str(exc).splitlines()[0][:200]}",
                                hint=MAP_YOURSELF, file=source) from exc
    except (TypeError, KeyError, AttributeError, ArithmeticError) as exc:
        raise ModelLoadingError(f"transformers cannot read this {model_type} config: {exc}",
                                hint=MAP_YOURSELF, file=source) from exc


def auto_model_class(raw: JsonObject, hf_config: PretrainedConfig, source: str = "config.json") -> type:
    """The ``transformers`` class that builds the model: ``architectures[0]`` when transformers
    defines it, else ``AutoModelForSeq2SeqLM`` / ``AutoModelForCausalLM`` (a decoder) / ``AutoModel``."""
    transformers = _transformers(source)
    names = raw.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        cls = getattr(transformers, names[0], None)
        own_type = getattr(getattr(cls, "config_class", None), "model_type", None)
        if cls is not None and hasattr(cls, "_from_config") and own_type == hf_config.model_type:
            return cls
    from transformers.models.auto import modeling_auto as ma

    model_type = hf_config.model_type
    if getattr(hf_config, "is_encoder_decoder", False) and model_type in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return transformers.AutoModelForSeq2SeqLM
    if (model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and model_type not in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES):
        return transformers.AutoModelForCausalLM
    return transformers.AutoModel


def _class_name(cls: type, hf_config: PretrainedConfig) -> str:
    if cls.__name__.startswith("AutoModel"):
        from transformers.models.auto.auto_factory import _get_model_class

        return str(_get_model_class(hf_config, cls._model_mapping).__name__)
    return str(cls.__name__)


def generic_config(raw: JsonObject, source: str = "config.json", why: str = "") -> GenericModelConfig:
    """The generic tier's config of ``raw`` (checked by building its transformers config offline).

    Raises:
        ModelLoadingError: (DF004) what is missing (no model_type, custom code, a type transformers
            does not know, no layer count) and how to map the model yourself.
    """
    hf = hf_config_of(raw, source)
    cls = auto_model_class(raw, hf, source)
    try:
        class_name = _class_name(cls, hf)
    except (ValueError, KeyError) as exc:
        raise ModelLoadingError(f"transformers has no model class for model_type {hf.model_type!r}: {exc}",
                                hint=MAP_YOURSELF, file=source) from exc
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    encoder_decoder = bool(getattr(hf, "is_encoder_decoder", False))
    layers = getattr(text, "num_hidden_layers", None)
    if layers is None:
        layers = getattr(text, "num_layers", None)
    if not isinstance(layers, int) or layers < 1:
        raise ModelLoadingError(f"the {hf.model_type} config names no layer count (num_hidden_layers)",
                                hint=MAP_YOURSELF, file=source)
    encoder_layers = 0
    if encoder_decoder:
        encoder_layers = layers
        decoder = getattr(text, "num_decoder_layers", None) or layers
        layers = layers + int(decoder)
    pixels = "pixel_values" in _forward_inputs(cls, class_name)
    kind = "seq2seq" if encoder_decoder else ("pixels" if pixels else "tokens")
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or 1 << 20
    return GenericModelConfig(
        model_type=str(hf.model_type), model_class=class_name, num_hidden_layers=int(layers),
        vocab_size=int(getattr(text, "vocab_size", 0) or 0) if kind != "pixels" else 0,
        max_position_embeddings=int(positions), input_kind=kind,
        image_size=int(getattr(hf, "image_size", 0) or 0), num_channels=int(getattr(hf, "num_channels", 3) or 3),
        hidden_size=int(getattr(text, "hidden_size", 0) or getattr(text, "d_model", 0) or 0),
        why_generic=why, encoder_layers=encoder_layers,
        experts_per_token=int(getattr(text, "num_experts_per_tok", 0) or getattr(text, "moe_top_k", 0) or 0),
    )


def _forward_inputs(cls: type, class_name: str) -> set[str]:
    """The parameter names of the model class's ``forward``."""
    import inspect

    import transformers

    real = getattr(transformers, class_name, cls)
    try:
        return set(inspect.signature(real.forward).parameters)
    except (TypeError, ValueError):
        return set()


def build_skeleton(raw: JsonObject, dtype: torch.dtype | None = None, *, meta: bool = False,
                   source: str = "config.json") -> torch.nn.Module:
    """The ``transformers`` eager model of ``raw`` without its weights (on the ``meta`` device with
    ``meta``: no memory), built offline with the eager attention (the reference's semantics)."""
    import contextlib

    import torch

    hf = hf_config_of(raw, source)
    cls = auto_model_class(raw, hf, source)
    kwargs: dict[str, object] = dict(EAGER_KWARGS)
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        with torch.device("meta") if meta else contextlib.nullcontext():
            return cls.from_config(hf, **kwargs) if cls.__name__.startswith("AutoModel") else \
                cls._from_config(hf, **kwargs)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError, NotImplementedError, ArithmeticError) as exc:
        raise ModelLoadingError(f"transformers cannot build the {hf.model_type} model from config.json: "
                                f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}",
                                hint=MAP_YOURSELF, file=source) from exc


def tied_names(net: torch.nn.Module) -> set[str]:
    """The parameter names the model ties to another (``lm_head.weight`` to the embeddings ...):
    a checkpoint may leave them out."""
    tied = getattr(net, "all_tied_weights_keys", None)
    if tied is None:
        tied = getattr(net, "_tied_weights_keys", None) or {}
    return set(tied) if isinstance(tied, (dict, list, set, tuple)) else set()


def generic_expected_tensors(raw: JsonObject, source: str = "config.json",
                             num_layers: int | None = None) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """Name -> shape of every parameter the transformers model reads (less the tied ones), and the
    layers that route tokens to experts (a router child in their MLP block), from a model built on
    the ``meta`` device (no memory). DF004 when ``num_layers`` layers cannot be found in it."""
    from ..capture.structure import layer_stacks, static_router

    net = build_skeleton(raw, meta=True, source=source)
    tied = tied_names(net)
    params = {n for n, _ in net.named_parameters(remove_duplicate=False)}
    expected = {n: tuple(t.shape) for n, t in net.state_dict().items() if n in params and n not in tied}
    routed: tuple[int, ...] = ()
    if num_layers is not None:
        modules = dict(net.named_modules())
        names = layer_stacks(net, num_layers)
        routed = tuple(i for i, name in enumerate(names) if static_router(modules[name]) is not None)
    return expected, routed


def random_inputs(config: GenericModelConfig, batch: int, length: int, *, seed: int = 0,
                  pad_lengths: list[int] | None = None, padding_side: str = "right") -> ModelInputs:
    """Seeded random inputs of the kind the model reads: token ids (with a decoder's for an
    encoder-decoder) or pixel values ``[batch, channels, size, size]`` (float32, standard normal)."""
    import numpy as np

    from .inputs import ModelInputs

    if config.input_kind == "pixels":
        rng = np.random.default_rng(seed)
        size = config.image_size or 32
        pixels = rng.standard_normal((batch, config.num_channels, size, size)).astype(np.float32)
        empty = np.zeros((batch, 0), dtype=np.int64)
        return ModelInputs(empty, empty, None, meta={"source": "random", "seed": seed, "kind": "pixels"},
                           extra={"pixel_values": pixels})
    inputs = ModelInputs.random(max(config.vocab_size, 1), batch, length, seed=seed, pad_lengths=pad_lengths,
                                padding_side=padding_side)
    if config.input_kind == "seq2seq":
        rng = np.random.default_rng(seed + 1)
        inputs.extra["decoder_input_ids"] = rng.integers(0, max(config.vocab_size, 1), size=(batch, length),
                                                         dtype=np.int64)
    return inputs
