"""Which checkpoint each output of an ExecuTorch program is, and what its inputs are fed.

A program exported by :mod:`.runner` returns every checkpoint of the model, in the order its taps
fire, and says so in the sidecar it writes beside itself (``<program>.pte.json``). A program of the
user's own (``--alternative-model FILE.pte``) is read one of three ways:

- **logits alone**: one output, ``post_processing``;
- **logits and the hidden states**: ``1 + L + 1`` outputs, the logits followed by the
  ``hidden_states`` tuple as transformers returns it with ``output_hidden_states=True``: ``[0]`` the
  embeddings (``post_embedding``), ``[i + 1]`` layer i's output (``post_mlp:i``), the last one after
  the final norm (of a causal LM: no checkpoint of ours, so the last layer is judged at the logits);
- **a sidecar** (``--backend-option outputs=FILE.json``, or ``<program>.pte.json`` beside it):
  ``{"outputs": ["post_processing", "post_mlp:0", null, ...]}``, one entry per output, ``null`` for
  an output not compared.

Inputs are fed positionally: ``input_ids``, ``attention_mask``, then ``token_type_ids`` (BERT), as
many as the program takes, each at the program's own integer type.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...capture.keys import CheckpointKey
from ...errors import ConfigurationError
from ...modelio.inputs import ModelInputs
from ...modelio.loader import LoadedModel
from ...safefiles import read_strict_json
from .program import ProgramSignature

if TYPE_CHECKING:
    import torch

__all__ = ["SIDECAR_SUFFIX", "OutputMap", "sidecar_path", "read_sidecar", "sidecar_json", "output_map",
           "program_feeds", "INPUT_ORDER"]

#: The sidecar beside a program: ``model.pte`` -> ``model.pte.json``.
SIDECAR_SUFFIX = ".json"
#: The order a program's inputs are fed in.
INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")

#: One entry per program output: the checkpoint it is, or None (not compared).
OutputMap = list[CheckpointKey | None]

_SIDECAR_HINT = ('write {"outputs": ["post_processing", "post_embedding", "post_mlp:0", null, ...]}: one '
                 "checkpoint id (or null) per output of the program, in order")


def sidecar_path(program: Path) -> Path:
    """The sidecar beside ``program`` (``model.pte.json``)."""
    return program.with_name(program.name + SIDECAR_SUFFIX)


def read_sidecar(path: Path) -> list[str | None]:
    """The output names a sidecar lists (``{"outputs": [...]}``), checked (DF005 naming the file)."""
    data = read_strict_json(path, "outputs sidecar", hint=_SIDECAR_HINT)
    outputs = data.get("outputs") if isinstance(data, dict) else None
    if not isinstance(outputs, list) or not all(o is None or isinstance(o, str) for o in outputs):
        raise ConfigurationError("the outputs sidecar must hold an \"outputs\" list of checkpoint ids or nulls",
                                 hint=_SIDECAR_HINT, file=str(path))
    return outputs


def sidecar_json(keys: list[CheckpointKey]) -> dict[str, list[str]]:
    """The sidecar of a program whose outputs are ``keys``, in order."""
    return {"outputs": [str(k) for k in keys]}


def output_map(signature: ProgramSignature, model: LoadedModel, named: list[str | None] | None,
               source: str) -> tuple[OutputMap, str]:
    """Each output of a program -> its checkpoint, and how that was decided (``"sidecar"``,
    ``"logits"``, ``"hidden_states"``). ``named``: a sidecar's list (``source`` names its file).

    Raises:
        ConfigurationError: the sidecar does not fit the program or the model, or the outputs are
            none of the shapes above (DF005, saying how to name them).
    """
    n, layers = len(signature.outputs), model.num_layers
    if named is not None:
        if len(named) != n:
            raise ConfigurationError(f"the outputs sidecar names {len(named)} outputs, the program has {n}",
                                     hint=_SIDECAR_HINT, file=source)
        keys: OutputMap = []
        for name in named:
            key = None if name is None else CheckpointKey.parse(name)
            if key is not None and key.layer is not None and not 0 <= key.layer < layers:
                raise ConfigurationError(f"the outputs sidecar names {key}, the model has {layers} layers",
                                         hint=_SIDECAR_HINT, file=source)
            keys.append(key)
        return keys, "sidecar"
    if n == 1:
        return [CheckpointKey("post_processing")], "logits"
    if n == layers + 2:
        hidden: OutputMap = [CheckpointKey("post_embedding")]
        hidden += [CheckpointKey("post_mlp", i) for i in range(layers - 1)]
        # the last hidden state: after the final norm in a causal LM (no checkpoint), the last layer's in BERT
        hidden.append(CheckpointKey("post_mlp", layers - 1) if model.architecture == "bert" else None)
        return [CheckpointKey("post_processing"), *hidden], "hidden_states"
    raise ConfigurationError(
        f"the program has {n} outputs: 1 (the logits) or {layers + 2} (the logits and the {layers + 1} hidden "
        f"states) are read without a sidecar", hint=_SIDECAR_HINT, file=source)


def program_feeds(signature: ProgramSignature, model: LoadedModel, inputs: ModelInputs,
                  source: str) -> list[torch.Tensor]:
    """The tensors a program's ``forward`` is fed for ``inputs``, in its input order and types.

    Raises:
        ConfigurationError: the program takes more inputs than a model's tokens give, or was
            exported for another shape (DF005, naming the shape).
    """
    import numpy as np
    import torch

    arrays = {"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask,
              "token_type_ids": inputs.token_type_ids if inputs.token_type_ids is not None
              else np.zeros_like(inputs.input_ids)}
    if len(signature.inputs) > len(INPUT_ORDER):
        raise ConfigurationError(f"the program takes {len(signature.inputs)} inputs; it is fed "
                                 f"{', '.join(INPUT_ORDER)} in this order, at most",
                                 hint="export the model's forward over (input_ids, attention_mask)", file=source)
    feeds = []
    for name, spec in zip(INPUT_ORDER, signature.inputs):
        array = arrays[name]
        if tuple(array.shape) != spec.shape:
            shape = "x".join(str(d) for d in spec.shape)
            raise ConfigurationError(
                f"the program was exported for {name} of shape {shape}, the session's inputs are "
                f"{'x'.join(str(d) for d in array.shape)}", file=source,
                hint=f"set input_shape [{', '.join(str(d) for d in spec.shape)}] in the session's configuration "
                     "or pass --inputs FILE.safetensors of that shape")
        dtype = getattr(torch, spec.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigurationError(f"the program's input {name} is {spec.dtype}, not a type tokens are fed as",
                                     file=source)
        feeds.append(torch.from_numpy(np.ascontiguousarray(array)).to(dtype))
    return feeds
