"""What ``load_model`` checks in the weights files' headers before a model is returned.

Each tensor is stored once (in the shard the index names, when there is one); the config's sizes
fit within what the files hold (so a config declaring a billion layers is refused before a name
is built); every tensor the architecture reads is present with the shape the config implies and
a floating-point dtype; and no layer is stored beyond ``num_hidden_layers``. Any failure is a
``ModelLoadingError`` (DF004) naming the file and, where it applies, the tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelLoadingError
from .configs import BertModelConfig, ModelConfig
from .weights import FLOAT_DTYPES, TensorReader

__all__ = ["stored_tensors", "check_index", "check_sizes_fit", "check_tensors", "check_layer_count"]

_HINT = "check that config.json belongs to these weights"
#: The config's sizes that every tensor dimension bounds, per family.
_SIZE_KEYS = {
    "llama": ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim"),
    "bert": ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "max_position_embeddings",
             "type_vocab_size"),
    "generic": ("vocab_size", "hidden_size"),  # the rest is checked against the transformers model's own shapes
}
_SIZE_KEYS["gemma"] = _SIZE_KEYS["llama"]
_LAYER_NAME = {"llama": re.compile(r"model\.layers\.(\d+)\."), "bert": re.compile(r"encoder\.layer\.(\d+)\.")}


def stored_tensors(readers: list[TensorReader]) -> dict[str, TensorReader]:
    """Stored name -> the reader holding it; a name stored in two files is refused."""
    stored: dict[str, TensorReader] = {}
    for reader in readers:
        for name in reader.names():
            if name in stored:
                raise ModelLoadingError(
                    "the tensor is stored in more than one file", file=f"{stored[name].path}, {reader.path}",
                    tensor=name, hint="remove the stray weights file from the model's directory",
                )
            stored[name] = reader
    return stored


def check_index(stored: dict[str, TensorReader], weight_map: dict[str, str], index: Path) -> None:
    """Every tensor the shard index names is in the shard it names."""
    for name, shard in weight_map.items():
        holder = stored.get(name)
        if holder is None or holder.path.name != shard:
            where = "no shard holds it" if holder is None else f"it is in {holder.path.name}"
            raise ModelLoadingError(f"the shard index places the tensor in {shard}, but {where}",
                                    file=str(index), tensor=name, hint="the index does not belong to these shards")


def check_sizes_fit(config: ModelConfig, shapes: list[tuple[int, ...]], where: str) -> None:
    """The config's sizes are bounded by what the files hold: no more layers than tensors, no size
    beyond the largest tensor dimension. Checked before any name or shape is derived from them."""
    if config.num_hidden_layers > len(shapes):
        raise ModelLoadingError(
            f"num_hidden_layers={config.num_hidden_layers} is more than the weights can hold "
            f"({len(shapes)} tensors in all)", file=where, hint=_HINT,
        )
    largest = max((max(s) for s in shapes if s), default=0)
    for key in _SIZE_KEYS[config.architecture]:
        value = getattr(config, key)
        if value > largest:
            raise ModelLoadingError(
                f"{key}={value} is larger than any dimension of the weights (the largest is {largest})",
                file=where, hint=_HINT,
            )


def check_tensors(expected: dict[str, tuple[int, ...]], locations: dict[str, tuple[TensorReader, str]],
                  config: ModelConfig, files: str) -> None:
    """Every tensor the architecture reads is present, of the implied shape, in a floating-point dtype."""
    for name, shape in expected.items():
        if name not in locations:
            raise ModelLoadingError(f"tensor missing: the {config.model_type} config needs {name!r}",
                                    file=files, tensor=name)
        reader, stored_name = locations[name]
        actual = reader.shape(stored_name)
        if actual != shape:
            raise ModelLoadingError(
                f"shape {list(actual)} contradicts the config, which implies {list(shape)}",
                hint=_HINT, file=str(reader.path), tensor=stored_name,
            )
        dtype = reader.dtype(stored_name)
        if dtype not in FLOAT_DTYPES:
            raise ModelLoadingError(
                f"the tensor has dtype {dtype}; weights must be floating point ({', '.join(sorted(FLOAT_DTYPES))})",
                file=str(reader.path), tensor=stored_name,
            )


def check_layer_count(config: ModelConfig, locations: dict[str, tuple[TensorReader, str]]) -> None:
    """No layer is stored beyond ``num_hidden_layers`` (a config declaring fewer layers than the file holds)."""
    n = config.num_hidden_layers
    pattern = _LAYER_NAME["bert" if isinstance(config, BertModelConfig) else "llama"]
    for name, (reader, stored_name) in locations.items():
        match = pattern.match(name)
        if match and (len(match[1]) > len(str(n)) or int(match[1]) >= n):
            raise ModelLoadingError(
                f"the weights hold layer {match[1]}, but config.json declares num_hidden_layers={n}",
                file=str(reader.path), tensor=stored_name, hint=_HINT,
            )
