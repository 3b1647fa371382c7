"""``load_model(path)``: a Hugging Face directory, a ``.safetensors`` / ``.zt`` / ``.bin`` / ``.pt`` file.

Everything is checked before the model is returned: the config parses into a supported
architecture, every tensor the architecture needs is present, and every shape agrees with the
config (from file headers, without reading the data). Any failure is a ``ModelLoadingError``
(DF004) naming the file and, where it applies, the tensor.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ModelLoadingError
from ..jsonio import JsonObject
from .checks import check_index, check_layer_count, check_sizes_fit, check_tensors, stored_tensors
from .configs import (BertModelConfig, GemmaModelConfig, LlamaModelConfig, ModelConfig, MoeModelConfig,
                      UnsupportedByReference, parse_config, read_config_file)
from .files import model_path_exists, read_json, regular_file_size, short_repr
from .generic import GenericModelConfig, generic_config, generic_expected_tensors
from .weights import SafetensorsReader, TensorReader, TorchFileReader, WeightStore, ZTensorReader

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["LoadedModel", "load_model", "expected_tensors", "WEIGHT_SUFFIXES"]

#: The shard index of a sharded Hugging Face directory.
INDEX_NAME = "model.safetensors.index.json"

#: File suffix -> reader.
WEIGHT_SUFFIXES: dict[str, type] = {
    ".safetensors": SafetensorsReader,
    ".zt": ZTensorReader,
    ".bin": TorchFileReader,
    ".pt": TorchFileReader,
    ".pth": TorchFileReader,
}


@dataclass
class LoadedModel:
    """A model ready for any backend.

    Attributes:
        path: what was loaded (directory or file).
        format: ``"hf_dir"``, ``"safetensors"``, ``"zt"``, ``"torch"``, ``"onnx"`` (:mod:`.onnx_file`) or
            ``"gguf"`` (:mod:`.gguf_model`).
        config: the typed config (:class:`LlamaModelConfig`, :class:`BertModelConfig`, or
            :class:`~.generic.GenericModelConfig` for a model the generic tier runs).
        raw_config: ``config.json`` as read.
        weights: canonical tensor name -> tensor, lazy.
        tokenizer: a ``tokenizers.Tokenizer`` when ``tokenizer.json`` is present, else ``None``.
    """

    path: Path
    format: str
    config: ModelConfig | GenericModelConfig
    raw_config: JsonObject
    weights: WeightStore
    tokenizer: Tokenizer | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def architecture(self) -> str:
        """``"llama"``, ``"gemma"`` or ``"bert"`` (a reference written from the math: the layer
        structure, which module is which checkpoint), or ``"generic"``."""
        return self.config.architecture

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def router_layers(self) -> tuple[int, ...]:
        """The mixture-of-experts layers, whose router logits are checkpoints (generic tier)."""
        return tuple(getattr(self.config, "router_layers", ()))

    @property
    def digest(self) -> str:
        """Content digest of the weights (SHA-256, format independent, stable across runs)."""
        return self.weights.digest

    def fork(self) -> LoadedModel:
        """This model with weights of its own (:meth:`WeightStore.fork`: copy-on-write mappings, no
        copy made) and its own ``config.json`` dict: what a backend that may change its weights in
        place is given, so that nothing it writes reaches another backend. An ONNX file's weights
        are read by each runtime from the file itself and stay as they are."""
        fork = getattr(self.weights, "fork", None)
        return dataclasses.replace(self, weights=self.weights if fork is None else fork(),
                                   raw_config=copy.deepcopy(self.raw_config), files=list(self.files))


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape of every tensor the architecture reads."""
    out: dict[str, tuple[int, ...]] = {}
    if isinstance(config, LlamaModelConfig):
        return _decoder_tensors(config)
    assert isinstance(config, BertModelConfig)
    d, f = config.hidden_size, config.intermediate_size
    out["embeddings.word_embeddings.weight"] = (config.vocab_size, d)
    out["embeddings.position_embeddings.weight"] = (config.max_position_embeddings, d)
    out["embeddings.token_type_embeddings.weight"] = (config.type_vocab_size, d)
    out["embeddings.LayerNorm.weight"] = (d,)
    out["embeddings.LayerNorm.bias"] = (d,)
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            out[p + f"attention.self.{proj}.weight"] = (d, d)
            out[p + f"attention.self.{proj}.bias"] = (d,)
        out[p + "attention.output.dense.weight"] = (d, d)
        out[p + "attention.output.dense.bias"] = (d,)
        out[p + "attention.output.LayerNorm.weight"] = (d,)
        out[p + "attention.output.LayerNorm.bias"] = (d,)
        out[p + "intermediate.dense.weight"] = (f, d)
        out[p + "intermediate.dense.bias"] = (f,)
        out[p + "output.dense.weight"] = (d, f)
        out[p + "output.dense.bias"] = (d,)
        out[p + "output.LayerNorm.weight"] = (d,)
        out[p + "output.LayerNorm.bias"] = (d,)
    return out


def _decoder_tensors(config: LlamaModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors of a Llama-family or Gemma decoder (Hugging Face names, as saved on disk)."""
    out: dict[str, tuple[int, ...]] = {}
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    hd, nh, nkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    out["model.embed_tokens.weight"] = (v, d)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if isinstance(config, GemmaModelConfig):
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for norm in norms:
            out[p + norm + ".weight"] = (d,)
        if config.fused_projections:
            out[p + "self_attn.qkv_proj.weight"] = ((nh + 2 * nkv) * hd, d)
        else:
            for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
                out[p + f"self_attn.{proj}.weight"] = (rows, d)
                if config.qkv_bias:
                    out[p + f"self_attn.{proj}.bias"] = (rows,)
        if config.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "self_attn.o_proj.weight"] = (d, nh * hd)
        if config.o_bias:
            out[p + "self_attn.o_proj.bias"] = (d,)
        if isinstance(config, MoeModelConfig):
            out[p + "mlp.gate.weight"] = (config.num_experts, d)
            fe = config.moe_intermediate_size
            for e in range(config.num_experts):
                q = f"{p}mlp.experts.{e}."
                out[q + "gate_proj.weight"], out[q + "up_proj.weight"], out[q + "down_proj.weight"] = (fe, d), (fe, d), (d, fe)
            continue
        if config.fused_projections:
            out[p + "mlp.gate_up_proj.weight"] = (2 * f, d)
        else:
            out[p + "mlp.gate_proj.weight"] = (f, d)
            out[p + "mlp.up_proj.weight"] = (f, d)
        out[p + "mlp.down_proj.weight"] = (d, f)
        if config.mlp_bias:
            out[p + "mlp.gate_proj.bias"] = (f,)
            out[p + "mlp.up_proj.bias"] = (f,)
            out[p + "mlp.down_proj.bias"] = (d,)
    out["model.norm.weight"] = (d,)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (v, d)
    return out


def _canonical_prefix(config: ModelConfig, names: set[str]) -> tuple[str, str]:
    """(prefix to strip, prefix to add) so that stored names become canonical names."""
    if isinstance(config, BertModelConfig):
        if "bert.embeddings.word_embeddings.weight" in names:
            return "bert.", ""
        return "", ""
    if "model.embed_tokens.weight" not in names and "embed_tokens.weight" in names:
        return "", "model."
    return "", ""


def _locations(config: ModelConfig, stored: dict[str, TensorReader]) -> dict[str, tuple[TensorReader, str]]:
    """Canonical name -> (reader, stored name); two stored names for one canonical name are refused."""
    strip, add = ("", "") if isinstance(config, GenericModelConfig) else _canonical_prefix(config, set(stored))
    locations: dict[str, tuple[TensorReader, str]] = {}
    for name, reader in stored.items():
        canonical = add + (name[len(strip):] if strip and name.startswith(strip) else name)
        if canonical in locations:
            raise ModelLoadingError(
                f"the weights hold the tensor twice, as {locations[canonical][1]!r} and {name!r}",
                file=str(reader.path), tensor=canonical,
            )
        locations[canonical] = (reader, name)
    return locations


def _open_reader(path: Path) -> TensorReader:
    if not path.exists():
        raise ModelLoadingError("weights file not found", file=str(path))
    reader_cls = WEIGHT_SUFFIXES.get(path.suffix.lower())
    if reader_cls is None:
        raise ModelLoadingError(
            f"unknown weights format {path.suffix or '(no suffix)'!r}",
            hint="use .safetensors, .zt, or a .bin/.pt state dict (read with weights_only=True)",
            file=str(path),
        )
    return reader_cls(path)


def _plain_file_name(name: object, index: Path) -> str:
    """A shard name of the index: a file name in the model's directory, never a path elsewhere."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
            or Path(name).is_absolute()):
        raise ModelLoadingError(
            f"the shard index names {short_repr(name)}, which is not a file name in the model's directory",
            file=str(index),
        )
    return name


def _read_index(index: Path) -> dict[str, str]:
    """The ``weight_map`` of ``model.safetensors.index.json``: tensor name -> shard file name."""
    data = read_json(index, "the shard index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadingError(
            f"the shard index's weight_map must be a non-empty JSON object, got {short_repr(weight_map)}",
            file=str(index),
        )
    return {name: _plain_file_name(shard, index) for name, shard in weight_map.items()}


def _weight_files(directory: Path) -> tuple[list[Path], dict[str, str]]:
    """The weights files of a directory, and the shard index's weight_map (empty without an index)."""
    index = directory / INDEX_NAME
    if index.exists() or index.is_symlink():
        weight_map = _read_index(index)
        shards = sorted({directory / s for s in weight_map.values()})
        for shard in shards:
            if not shard.exists():
                raise ModelLoadingError("a shard named in the index is missing", file=str(shard))
        return shards, weight_map
    for pattern in ("model.safetensors", "*.safetensors", "model.zt", "*.zt", "pytorch_model.bin", "*.bin", "*.pt"):
        found = sorted(directory.glob(pattern))
        if found:
            return found, {}
    raise ModelLoadingError(
        "no weights in the directory (looked for *.safetensors, *.zt, pytorch_model.bin)", file=str(directory)
    )


def _load_tokenizer(directory: Path) -> Tokenizer | None:
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:  # tokenizers is optional; a model without a tokenizer still runs on ids
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for bad JSON
        raise ModelLoadingError(f"tokenizer.json cannot be read: {exc}", file=str(path)) from exc


def _load_onnx(path: Path) -> LoadedModel:
    """An ONNX file (:mod:`.onnx_file`): the graph is the model; its tokenizer.json beside it, if any."""
    from .onnx_file import load_onnx_file

    regular_file_size(path)
    config, weights, files = load_onnx_file(path)
    return LoadedModel(path=path, format="onnx", config=config, raw_config={}, weights=weights,  # type: ignore[arg-type]
                       tokenizer=_load_tokenizer(path.parent), files=files)


def _load_gguf(path: Path) -> LoadedModel:
    """A GGUF file (:mod:`.gguf_model`): config from its metadata, tensors dequantized under Hugging
    Face's names, every tensor the family needs checked present and shaped as the config says."""
    from .gguf_model import gguf_model_parts

    config, raw, locations, generic = gguf_model_parts(path)
    shapes = [reader.shape(name) for reader, name in locations.values()]
    check_sizes_fit(config, shapes, str(path))  # type: ignore[arg-type]
    expected = expected_tensors(config) if generic is None else generic  # type: ignore[arg-type]
    check_tensors(expected, locations, config, str(path))  # type: ignore[arg-type]
    if generic is None:  # the generic tier's layers are the transformers model's own
        check_layer_count(config, locations)  # type: ignore[arg-type]
    return LoadedModel(path=path, format="gguf", config=config, raw_config=raw, weights=WeightStore(locations),
                       files=[path])


#: The tiers a model can load on: ``"auto"`` (a reference written from the math where one exists,
#: else the generic tier) or ``"generic"`` (the model's own eager code, even where one exists).
MODEL_TIERS = ("auto", "generic")


def load_model(path: str | Path, *, config_path: str | Path | None = None, tier: str = "auto") -> LoadedModel:
    """Load a model from a Hugging Face directory or a single weights file with ``config.json`` beside it.

    Args:
        path: a directory (``config.json`` + ``*.safetensors``, sharded with an index too, or
            ``*.zt`` / ``pytorch_model.bin``), or a ``.safetensors`` / ``.zt`` / ``.bin`` / ``.pt`` file.
        config_path: the config to use instead of ``config.json`` beside the weights.
        tier: ``"auto"`` or ``"generic"`` (:data:`MODEL_TIERS`): ``"generic"`` loads a family that
            has a reference written from the math on the generic tier too (to judge it by its own
            eager code, or to compare the two references).

    Raises:
        ModelLoadingError: (DF004) missing path, a path that is not a regular file (FIFO, device),
            unknown format, truncated or corrupt file, wrong magic, a config key of the wrong type
            or out of bounds, a config the reference would read differently from transformers, an
            unsupported architecture, a shard index that is not a map of file names or places a
            tensor in the wrong shard, a tensor stored twice, a size larger than the weights can
            hold, a missing tensor, one whose shape the config contradicts or whose dtype is not
            floating point, a layer beyond ``num_hidden_layers``, a state dict with non-string
            keys or sparse/quantized tensors. Nothing is returned half-checked.
    """
    path = Path(path).expanduser()
    if not model_path_exists(path):
        raise ModelLoadingError("model path does not exist", file=str(path))
    if path.suffix.lower() == ".onnx" and not path.is_dir():
        return _load_onnx(path)
    if path.suffix.lower() == ".gguf" and not path.is_dir():
        return _load_gguf(path)
    directory = path if path.is_dir() else path.parent
    weight_map: dict[str, str] = {}
    if path.is_dir():
        fmt = "hf_dir"
        files, weight_map = _weight_files(path)
    else:
        files = [path]
        fmt = {".safetensors": "safetensors", ".zt": "zt"}.get(path.suffix.lower(), "torch")
        regular_file_size(path)  # a FIFO or device is refused before anything is opened
        if path.suffix.lower() not in WEIGHT_SUFFIXES:
            _open_reader(path)  # raises the unknown-format error before the config is looked at
    cfg_file = Path(config_path) if config_path is not None else directory / "config.json"
    raw = read_config_file(cfg_file)
    config: ModelConfig | GenericModelConfig
    if tier not in MODEL_TIERS:
        raise ModelLoadingError(f"unknown model tier {short_repr(tier)}", hint=f"use one of {', '.join(MODEL_TIERS)}")
    try:
        if tier == "generic":
            raise UnsupportedByReference("the generic tier was asked for (model_tier: generic)")
        if "auto_map" in raw:  # custom code: not the family's standard maths (the generic tier refuses it by name)
            raise UnsupportedByReference("the config maps to custom code (auto_map)")
        config = parse_config(raw, source=str(cfg_file))
    except UnsupportedByReference as exc:  # no reference from the math: the model's own eager code judges
        config = generic_config(raw, source=str(cfg_file), why=exc.message)

    stored = stored_tensors([_open_reader(f) for f in files])
    if weight_map:
        check_index(stored, weight_map, directory / INDEX_NAME)
    where = ", ".join(str(f) for f in files)
    check_sizes_fit(config, [r.shape(n) for n, r in stored.items()], where)  # type: ignore[arg-type]
    if isinstance(config, GenericModelConfig):
        locations = _locations(config, stored)  # type: ignore[arg-type]
        expected, routed = generic_expected_tensors(raw, str(cfg_file), config.num_layers)
        # stored under names transformers converts on loading (fused experts, renamed modules):
        # transformers' own loader reads and checks them; weights sharing no name are refused here
        renamed = fmt == "hf_dir" and not set(expected) <= set(locations) and bool(set(expected) & set(locations))
        config = dataclasses.replace(config, router_layers=routed, weights_renamed=renamed)
        if not renamed:  # stored under the model's own names: checked here
            check_tensors(expected, locations, config, where)  # type: ignore[arg-type]
    else:
        locations = _locations(config, stored)
        check_tensors(expected_tensors(config), locations, config, where)
        check_layer_count(config, locations)
    return LoadedModel(
        path=path,
        format=fmt,
        config=config,
        raw_config=raw,
        weights=WeightStore(locations),
        tokenizer=_load_tokenizer(directory),
        files=files,
    )
