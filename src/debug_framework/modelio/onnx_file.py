"""An ONNX file as a model: ``load_model("model.onnx")`` (external data beside it included).

Nothing is converted: the graph itself is what every backend runs. What the framework needs from
it is found in the graph:

* the layers, from the node name scopes: a legacy export's node names (``/encoder/layer.0/...``,
  ``/model/layers.3/...``) or the dynamo exporter's ``pkg.torch.onnx.name_scopes`` metadata
  (``encoder.layer.0.attention``); a scope ``layer.N``, ``layers.N``, ``h.N`` or ``block(s).N``
  is layer N;
* the checkpoints, as graph tensors: ``post_mlp:i`` is the last output (topological order) of
  layer i's nodes; ``post_attention:i`` the last output of its attention sub-scope, or the
  residual ``Add`` right after it; ``post_embedding`` the floating-point tensor that layer 0 reads
  from an embedding scope; ``post_processing`` the graph's first output. Each key's tensor name is
  recorded (:attr:`OnnxGraphConfig.checkpoint_tensors`) as its module path;
* the vocabulary size, from the ``Gather`` that reads ``input_ids``.

The weights digest is the SHA-256 of the file and of its external data files.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelLoadingError

if TYPE_CHECKING:
    import onnx

    from .inputs import ModelInputs

__all__ = ["OnnxGraphConfig", "OnnxFileWeights", "load_onnx_file", "node_scope", "layer_of_scope", "ONNX_INPUTS"]

#: The graph inputs the session's inputs can feed (by name).
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
_LAYER = re.compile(r"(?:^|[./])(?:layers?|h|blocks?)[._](\d+)(?=[./_]|$)")
_ATTENTION = re.compile(r"(?:^|[./])(?:self_)?att(?:ention|n)(?=[./_]|$)", re.IGNORECASE)
_FLOAT_TYPES = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass(frozen=True)
class OnnxGraphConfig:
    """What the framework reads of an ONNX graph (the ``config`` of its :class:`LoadedModel`)."""

    num_hidden_layers: int
    vocab_size: int
    input_names: tuple[str, ...]
    input_types: dict[str, int]
    checkpoint_tensors: dict[str, str]  #: ``"post_mlp:0"`` -> graph tensor name
    output_types: dict[str, int] = field(default_factory=dict)  #: checkpoint tensor -> ONNX elem type
    max_position_embeddings: int = 1 << 30
    architecture: str = "onnx"

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers


class OnnxFileWeights:
    """The ONNX file's stand-in for a weight store: its content digest (file + external data)."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self._digest: str | None = None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, name: object) -> bool:
        return False

    @property
    def digest(self) -> str:
        if self._digest is None:
            h = hashlib.sha256()
            for f in self.files:
                h.update(f.name.encode() + b"\0")
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
            self._digest = h.hexdigest()
        return self._digest


def node_scope(node: onnx.NodeProto) -> str:
    """A node's module scope as a dotted path (``encoder.layer.0.attention``); ``""`` if it has none."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            if isinstance(scopes, list) and len(scopes) >= 2:
                return str(scopes[-2])  # the innermost module (the last entry is the op)
            break
    name = node.name or ""
    if name.startswith("/"):
        return ".".join(p for p in name.split("/")[1:-1] if p)
    return ""


def layer_of_scope(scope: str) -> int | None:
    """The layer index a scope names (``encoder.layer.3.output`` -> 3), else ``None``."""
    m = _LAYER.search(scope)
    return int(m.group(1)) if m else None


def _is_layer_scope(scope: str, i: int) -> bool:
    """Whether ``scope`` is layer ``i``'s own module (not one of its sub-modules)."""
    m = _LAYER.search(scope)
    return m is not None and int(m.group(1)) == i and m.end() == len(scope)


def _external_files(model: onnx.ModelProto, directory: Path) -> list[Path]:
    out: set[Path] = set()
    for init in model.graph.initializer:
        if init.data_location == 1:  # EXTERNAL
            for entry in init.external_data:
                if entry.key == "location":
                    p = (directory / entry.value).resolve()
                    if directory.resolve() not in p.parents:
                        raise ModelLoadingError(f"external data {entry.value!r} lies outside the model's directory",
                                                file=str(directory))
                    if not p.is_file():
                        raise ModelLoadingError("an external data file named by the graph is missing", file=str(p))
                    out.add(p)
    return sorted(out)


def _vocab_size(model: onnx.ModelProto) -> int | None:
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            dims = inits.get(node.input[0])
            if dims:
                return int(dims[0])
    return None


def _checkpoints(model: onnx.ModelProto) -> tuple[dict[str, str], int]:
    """Checkpoint key -> tensor name, and the layer count."""
    last_of_layer: dict[int, str] = {}
    last_attention: dict[int, str] = {}
    producer_scope: dict[str, str] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    order: list[tuple[onnx.NodeProto, str, int | None]] = []
    for node in model.graph.node:
        scope = node_scope(node)
        layer = layer_of_scope(scope)
        order.append((node, scope, layer))
        for x in node.input:
            consumers.setdefault(x, []).append(node)
        if node.op_type == "Constant" or not node.output:
            continue
        for out in node.output:
            producer_scope[out] = scope
        if layer is not None:
            last_of_layer[layer] = node.output[0]
            if _ATTENTION.search(scope):
                last_attention[layer] = node.output[0]
    if not last_of_layer:
        return {}, 0
    layers = sorted(last_of_layer)
    if layers != list(range(len(layers))):
        raise ModelLoadingError(f"the graph's layer scopes are not numbered 0..n-1: {layers}")
    keys: dict[str, str] = {}
    first_layer0 = [n for n, _s, lay in order if lay == 0]
    for node in first_layer0:
        for x in node.input:
            s = producer_scope.get(x)
            if s is not None and layer_of_scope(s) is None and "embed" in s.lower():
                keys.setdefault("post_embedding", x)
    for i in layers:
        att = last_attention.get(i)
        if att is not None and att != last_of_layer[i]:
            after = [c for c in consumers.get(att, []) if c.op_type == "Add" and _is_layer_scope(node_scope(c), i)]
            keys[f"post_attention:{i}"] = after[0].output[0] if after else att
        keys[f"post_mlp:{i}"] = last_of_layer[i]
    keys["post_processing"] = model.graph.output[0].name
    return keys, len(layers)


def load_onnx_file(path: Path) -> tuple[OnnxGraphConfig, OnnxFileWeights, list[Path]]:
    """The config, weights digest and files of the ONNX file ``path`` (DF004 when it cannot be used)."""
    try:
        import onnx
    except ImportError as exc:
        raise ModelLoadingError("reading an ONNX file needs the onnx package", file=str(path),
                                hint="pip install onnx") from exc
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends for a corrupt file
        raise ModelLoadingError(f"not a readable ONNX file: {exc}", file=str(path)) from exc
    if not model.graph.node or not model.graph.output:
        raise ModelLoadingError("the ONNX graph has no nodes or no outputs", file=str(path))
    files = [path, *_external_files(model, path.parent)]
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    unknown = [n for n in inputs if n not in ONNX_INPUTS]
    if unknown or "input_ids" not in inputs:
        raise ModelLoadingError(
            f"the graph's inputs are {sorted(inputs)}; token models with inputs among {', '.join(ONNX_INPUTS)} "
            "(input_ids required) are supported", file=str(path))
    keys, layers = _checkpoints(model)
    if layers == 0:
        raise ModelLoadingError(
            "no layer found in the graph's node name scopes (looked for layer.N, layers.N, h.N, blocks.N)",
            file=str(path), hint="export with node names or name-scope metadata (torch.onnx.export keeps them)")
    vocab = _vocab_size(model)
    if vocab is None:
        raise ModelLoadingError("the vocabulary size cannot be read: no Gather reads input_ids from an initializer",
                                file=str(path))
    config = OnnxGraphConfig(num_hidden_layers=layers, vocab_size=vocab, input_names=tuple(inputs),
                             input_types=inputs, checkpoint_tensors=keys)
    return config, OnnxFileWeights(files), files


def onnx_feeds(config: OnnxGraphConfig, inputs: ModelInputs) -> dict[str, np.ndarray]:
    """The session's inputs as the graph's feeds, each in the graph's integer type."""
    ids = np.asarray(inputs.input_ids)
    values = {
        "input_ids": ids,
        "attention_mask": np.asarray(inputs.attention_mask),
        "token_type_ids": (np.asarray(inputs.token_type_ids) if getattr(inputs, "token_type_ids", None) is not None
                           else np.zeros_like(ids)),
        "position_ids": np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy(),
    }
    kinds = {6: np.int32, 7: np.int64, 9: np.bool_, 1: np.float32, 10: np.float16, 11: np.float64}
    return {n: values[n].astype(kinds.get(config.input_types.get(n, 7), np.int64)) for n in config.input_names}
