"""``ModelInputs``: the token ids and masks every backend of a comparison receives.

Build them from text with the model's tokenizer, or as seeded random ids; save and replay them
as a ``.safetensors`` file whose header metadata carries the JSON description (no pickle).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigurationError, ModelLoadingError
from ..jsonio import JsonObject

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

__all__ = ["ModelInputs", "PADDING_SIDES"]

#: Where a batch's shorter rows are padded (``padding_side``).
PADDING_SIDES = ("right", "left")


def _check_side(padding_side: str) -> None:
    if padding_side not in PADDING_SIDES:
        raise ConfigurationError(f"padding_side must be 'right' or 'left', got {padding_side!r}")


@dataclass
class ModelInputs:
    """Token ids ``[batch, length]`` (int64) with a padding mask (1 = token, 0 = padding).

    Attributes:
        input_ids: int64 array ``[batch, length]``.
        attention_mask: int64 array ``[batch, length]``; padding on the right (the default) or on
            the left (``padding_side="left"``), rows of any length (a ragged batch).
        token_type_ids: int64 array ``[batch, length]`` (BERT segment ids); zeros when ``None``.
        meta: how the inputs were made (``{"source": "text", "texts": [...]}`` or
            ``{"source": "random", "seed": 0}``), saved with them.
        extra: other named inputs of the model's forward (``pixel_values`` of a ViT-like encoder,
            ``decoder_input_ids`` of an encoder-decoder, ``position_ids`` where tokens do not sit at
            ``0 .. length-1``: :meth:`with_positions`, any tensor a ``--inputs`` file names);
            a model without token inputs has ``input_ids`` of length 0.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray | None = None
    meta: JsonObject = field(default_factory=dict)
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.input_ids = np.ascontiguousarray(self.input_ids, dtype=np.int64)
        if self.input_ids.ndim != 2:
            raise ConfigurationError(f"input_ids must be [batch, length], got shape {self.input_ids.shape}")
        self.attention_mask = np.ascontiguousarray(self.attention_mask, dtype=np.int64)
        if self.attention_mask.shape != self.input_ids.shape:
            raise ConfigurationError("attention_mask must have the shape of input_ids")
        if self.token_type_ids is not None:
            self.token_type_ids = np.ascontiguousarray(self.token_type_ids, dtype=np.int64)
            if self.token_type_ids.shape != self.input_ids.shape:
                raise ConfigurationError("token_type_ids must have the shape of input_ids")

    def copy(self) -> ModelInputs:
        """These inputs with arrays of their own (what each backend is given: nothing it writes
        reaches another's)."""
        return ModelInputs(self.input_ids.copy(), self.attention_mask.copy(),
                           None if self.token_type_ids is None else self.token_type_ids.copy(),
                           meta=copy.deepcopy(self.meta), extra={k: np.array(v, copy=True) for k, v in self.extra.items()})

    def position_ids(self) -> np.ndarray | None:
        """Each token's position ``[batch, length]`` where it is not ``0 .. length-1`` (left
        padding, a start position: :meth:`with_positions`), else None."""
        pos = self.extra.get("position_ids")
        return None if pos is None else np.asarray(pos, np.int64)

    def with_positions(self, offset: int = 0) -> ModelInputs:
        """These inputs with each token at its place in its own sequence, from ``offset`` on:
        ``position_ids = offset + (number of tokens before it in its row)``, as an engine places a
        left-padded or continued sequence. Where that is ``0 .. length-1`` at every token (right
        padding, no offset) nothing is added. Padded positions get ``offset``.

        Raises:
            ConfigurationError: (DF005) a negative ``offset``.
        """
        if offset < 0:
            raise ConfigurationError(f"position_offset must be >= 0, got {offset}")
        tokens = self.attention_mask != 0
        pos = offset + np.maximum(np.cumsum(tokens, axis=1) - 1, 0)
        plain = np.broadcast_to(np.arange(self.input_ids.shape[1]), pos.shape)
        extra = dict(self.extra)
        if self.input_ids.shape[1] and (offset or bool(np.any((pos != plain) & tokens))):
            extra["position_ids"] = np.where(tokens, pos, offset).astype(np.int64)
        else:
            extra.pop("position_ids", None)
        meta = {**self.meta, "position_offset": int(offset)} if offset else dict(self.meta)
        return ModelInputs(self.input_ids, self.attention_mask, self.token_type_ids, meta=meta, extra=extra)

    def positions(self) -> np.ndarray | None:
        """The model positions ``[batch, length]`` (True = a token) the comparison judges, or None
        when there is no padding to leave out (or the mask is not the checkpoints' sequence: an
        encoder-decoder's decoder runs over ``decoder_input_ids``). Padded positions are not model
        outputs (docs/comparison.md, "Padded positions")."""
        from ..comparison.positions import position_mask

        if "decoder_input_ids" in self.extra:
            return None
        return position_mask(self.attention_mask)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    @classmethod
    def from_text(
        cls, tokenizer: Tokenizer, texts: str | list[str], *, max_length: int | None = None, pad_id: int = 0,
        padding_side: str = "right",
    ) -> ModelInputs:
        """Tokenize ``texts`` with a ``tokenizers.Tokenizer`` (e.g. ``LoadedModel.tokenizer``).

        Rows are padded with ``pad_id`` on ``padding_side`` (``"right"`` or ``"left"``) to the
        longest row (or truncated to ``max_length``).
        """
        _check_side(padding_side)
        if tokenizer is None:
            raise ModelLoadingError("the model has no tokenizer", hint="use ModelInputs.random(...) or load a directory with tokenizer.json")
        texts = [texts] if isinstance(texts, str) else list(texts)
        # A private copy without the file's own padding/truncation settings: padding is ours.
        tok = type(tokenizer).from_str(tokenizer.to_str())
        tok.no_padding()
        tok.no_truncation()
        encs = tok.encode_batch(texts)
        rows = [list(e.ids)[:max_length] if max_length else list(e.ids) for e in encs]
        types = [list(e.type_ids)[: len(r)] for e, r in zip(encs, rows)]
        length = max(len(r) for r in rows)
        ids = np.full((len(rows), length), pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        tt = np.zeros((len(rows), length), dtype=np.int64)
        for b, (r, t) in enumerate(zip(rows, types)):
            at = slice(length - len(r), length) if padding_side == "left" else slice(0, len(r))
            ids[b, at] = r
            mask[b, at] = 1
            tt[b, at] = t
        meta = {"source": "text", "texts": texts, "max_length": max_length}
        if padding_side != "right":
            meta["padding_side"] = padding_side
        return cls(ids, mask, tt, meta=meta)

    @classmethod
    def random(
        cls,
        vocab_size: int,
        batch: int,
        length: int,
        *,
        seed: int = 0,
        pad_lengths: list[int] | None = None,
        pad_id: int = 0,
        padding_side: str = "right",
    ) -> ModelInputs:
        """Seeded random ids in ``[0, vocab_size)``; ``pad_lengths[b]`` positions of row b are
        padding, trailing (``padding_side="right"``) or leading (``"left"``)."""
        _check_side(padding_side)
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, vocab_size, size=(batch, length), dtype=np.int64)
        mask = np.ones((batch, length), dtype=np.int64)
        for b, n in enumerate(pad_lengths or []):
            if n:
                at = slice(0, n) if padding_side == "left" else slice(length - n, length)
                ids[b, at] = pad_id
                mask[b, at] = 0
        meta: JsonObject = {"source": "random", "seed": seed, "pad_lengths": list(pad_lengths or [])}
        if padding_side != "right":
            meta["padding_side"] = padding_side
        return cls(ids, mask, None, meta=meta)

    def torch(self, device: str = "cpu") -> dict[str, torch.Tensor]:
        """The inputs as torch tensors, keyword arguments of a Hugging Face forward."""
        import torch

        out = {
            "input_ids": torch.from_numpy(self.input_ids).to(device),
            "attention_mask": torch.from_numpy(self.attention_mask).to(device),
        }
        if self.token_type_ids is not None:
            out["token_type_ids"] = torch.from_numpy(self.token_type_ids).to(device)
        if self.extra and self.input_ids.shape[1] == 0:  # no token inputs (pixels only)
            out = {}
        for name, value in self.extra.items():
            out[name] = torch.from_numpy(np.ascontiguousarray(value)).to(device)
        return out

    @classmethod
    def from_file(cls, path: str | Path) -> ModelInputs:
        """Named inputs of any model from a ``.safetensors`` file (``--inputs``): ``input_ids``,
        ``attention_mask`` (ones when absent) and ``token_type_ids`` as usual, and every other tensor
        (``pixel_values``, ``decoder_input_ids`` ...) passed to the model's forward by its name. A
        file without ``input_ids`` feeds a model that reads no tokens (ids of length 0).

        Raises:
            ConfigurationError: (DF005) the file is missing, not safetensors, empty, or its tensors
                disagree on the batch size.
        """
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise ConfigurationError("inputs file not found", hint="give a .safetensors file of named tensors",
                                     file=str(path))
        try:
            with safe_open(str(path), framework="numpy") as fh:
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except (SafetensorError, OSError, ValueError) as exc:
            raise ConfigurationError(f"inputs file is not a safetensors file: {exc}", file=str(path)) from exc
        if not tensors:
            raise ConfigurationError("inputs file holds no tensor", file=str(path))
        batches = {k: int(v.shape[0]) if v.ndim else -1 for k, v in tensors.items()}
        if len(set(batches.values())) != 1 or -1 in batches.values():
            raise ConfigurationError(f"the inputs' first dimension (the batch) must agree: {batches}", file=str(path))
        batch = next(iter(batches.values()))
        ids = tensors.pop("input_ids", np.zeros((batch, 0), dtype=np.int64))
        mask = tensors.pop("attention_mask", np.ones(np.shape(ids), dtype=np.int64))
        types = tensors.pop("token_type_ids", None)
        return cls(ids, mask, types, meta={"source": "file", "file": str(path)}, extra=tensors)

    def save(self, path: str | Path) -> Path:
        """Write the inputs to a ``.safetensors`` file; the metadata holds ``meta`` as JSON.

        Serialised in memory and written by Python, so a failed write is an ``OSError`` with its
        ``errno`` (a full disk is ``ENOSPC``), never safetensors' opaque error."""
        from safetensors.numpy import save

        path = Path(path)
        tensors = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            tensors["token_type_ids"] = self.token_type_ids
        tensors.update(self.extra)
        path.write_bytes(save(tensors, metadata={"debug_framework.inputs": json.dumps(self.meta, sort_keys=True)}))
        return path

    @classmethod
    def load(cls, path: str | Path) -> ModelInputs:
        """Read inputs written by :meth:`save`."""
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise ModelLoadingError("inputs file not found", file=str(path))
        try:
            with safe_open(str(path), framework="numpy") as fh:
                meta = json.loads((fh.metadata() or {}).get("debug_framework.inputs", "{}"))
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadingError(f"inputs file is corrupt: {exc}", file=str(path)) from exc
        for key in ("input_ids", "attention_mask"):
            if key not in tensors:
                raise ModelLoadingError("inputs file lacks a tensor", file=str(path), tensor=key)
        extra = {k: v for k, v in tensors.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
        return cls(tensors["input_ids"], tensors["attention_mask"], tensors.get("token_type_ids"), meta=meta,
                   extra=extra)
