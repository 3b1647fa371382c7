"""Decode inside an ExecuTorch program: the model exported with a static KV cache that the program
itself holds and writes.

:class:`StaticCacheSteps` wraps the Hugging Face model (with its checkpoint hooks,
:class:`~debug_framework.backends._graph_capture.CheckpointOutputs`) over a ``transformers``
``StaticCache`` whose keys, values and write offsets are the wrapper's own buffers: ``torch.export``
sees them as mutable state of the program (``transformers``' own ``TorchExportableModuleWithStaticCache``
keeps the cache's tensors outside the module, which torch 2.13's export lifts twice and then cannot
decompose: ``expected compiled_fn to be GraphModule``). It is exported twice, at the prefill's shape
``[batch, length]`` (method ``prefill``) and at one token per row (method ``decode``), and lowered as
one program whose two methods share the cache (``share_mutable_buffers``,
:func:`~.lowering.lower_methods_to_file`): the prefill writes every layer's keys and values, each
decode step reads them and writes its own. Each method takes ``(input_ids, attention_mask,
position_ids, cache_position)`` and returns every checkpoint, then each layer's keys and values as
the cache holds them after the pass (so the cache the program wrote is compared too).

The batch is decoded as the session gives it: ``attention_mask`` is ``[batch, length + steps]``
over the whole static cache (the session's mask, then ones for the decoded tokens: slots not yet
written are hidden by causality), ``position_ids`` each row's own positions (left padding) and
``cache_position`` the cache slots written, the same for every row. :class:`ProgramDecoder` drives
the program through the engine protocol of :func:`~debug_framework.backends.decode.iter_runner_decode`
(``prefill``, ``decode_step``, ``kv_cache``), teacher-forced by the decode stage as every engine is.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers.cache_utils import StaticCache, StaticLayer

from ...capture.keys import CheckpointKey
from ...modelio.inputs import ModelInputs
from ...modelio.loader import LoadedModel
from ..decode import LayerKV

if TYPE_CHECKING:
    from .._graph_capture import CheckpointOutputs
    from .program import LoadedMethods

__all__ = ["StaticCacheSteps", "ProgramDecoder", "static_cache_support", "decode_feeds"]


class _OwnedLayer(StaticLayer):
    """A ``StaticLayer`` whose keys, values and write offset are buffers of ``owner`` (read through
    the module on every use, so ``torch.export`` traces them as the module's mutable state)."""

    def __init__(self, owner: torch.nn.Module, index: int, max_cache_len: int) -> None:  # noqa: D107
        # not StaticLayer.__init__: it would allocate tensors of its own
        self.owner, self.index, self.max_cache_len, self.is_initialized = owner, index, max_cache_len, True
        self.device = torch.device("cpu")

    def _buffer(self, what: str) -> torch.Tensor:
        return self.owner.get_buffer(f"{what}_{self.index}")

    keys = property(lambda self: self._buffer("key_cache"), lambda self, value: None)  # type: ignore[assignment]
    values = property(lambda self: self._buffer("value_cache"), lambda self, value: None)  # type: ignore[assignment]
    cumulative_length = property(lambda self: self._buffer("cumulative_length"),  # type: ignore[assignment]
                                 lambda self, value: None)


def _head_shape(config: object) -> tuple[int, int]:
    """``(kv_heads, head_dim)`` of a decoder's attention."""
    heads = int(getattr(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(getattr(config, "hidden_size")) // heads)
    return kv_heads, head_dim


def static_cache_support(model: LoadedModel, net: torch.nn.Module | None) -> tuple[bool, str]:
    """Whether the model's own export can decode through a static cache: a decoder whose every
    layer ``transformers`` caches as a plain ``StaticLayer`` (no sliding window, no linear attention)."""
    if model.architecture == "bert":
        return False, "exports an encoder (BERT): it has no causal decode"
    if net is None:
        return False, "is not prepared"
    config = net.config.get_text_config() if hasattr(net.config, "get_text_config") else net.config
    try:
        layers = StaticCache(max_cache_len=2, config=config).layers
    except Exception as exc:  # a config transformers cannot cache statically
        return False, f"cannot give the model a static KV cache ({type(exc).__name__}: {exc})"
    other = sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})
    if other:
        return False, (f"caches some layers as {', '.join(other)} (a sliding window or another state), which the "
                       "static-cache export does not write")
    return True, ""


class StaticCacheSteps(torch.nn.Module):
    """``forward(input_ids [B, t], attention_mask [B, M], position_ids [B, t], cache_position [t])``
    -> ``(*checkpoints, keys_0, values_0, keys_1, ...)``: one pass of the model over its static
    cache of ``M`` = ``max_cache_len`` slots (its buffers), the checkpoints in ``wrapper.keys``' order,
    each layer's cache ``[B, kv_heads, M, head_dim]`` after the pass.

    Args:
        wrapper: the model with its checkpoint hooks (their tensors go to ``sink``).
        sink: the list the hooks append to.
        batch: the rows decoded together.
        max_cache_len: the prefill's length plus the decode steps.
    """

    def __init__(self, wrapper: CheckpointOutputs, sink: list[torch.Tensor], batch: int, max_cache_len: int) -> None:
        super().__init__()
        self.wrapper = wrapper
        # the hooks' own list, behind a function: ``torch.export`` copies a module's list attributes
        self._hooked = lambda: sink
        net = wrapper.net
        config = net.config.get_text_config() if hasattr(net.config, "get_text_config") else net.config
        kv_heads, head_dim = _head_shape(config)
        dtype = next(net.parameters()).dtype
        self.layers = int(config.num_hidden_layers)
        for i in range(self.layers):
            self.register_buffer(f"key_cache_{i}", torch.zeros(batch, kv_heads, max_cache_len, head_dim, dtype=dtype),
                                 persistent=False)
            self.register_buffer(f"value_cache_{i}", torch.zeros(batch, kv_heads, max_cache_len, head_dim,
                                                                 dtype=dtype), persistent=False)
            self.register_buffer(f"cumulative_length_{i}", torch.tensor(0, dtype=torch.long), persistent=False)
        self.cache = StaticCache(max_cache_len=max_cache_len, config=config)
        self.cache.layers = [_OwnedLayer(self, i, max_cache_len) for i in range(self.layers)]
        try:
            params = inspect.signature(net.forward).parameters
        except (TypeError, ValueError):
            params = {}
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x: cache
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                cache_position: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for i in range(self.layers):  # each layer writes from the pass's first slot
            self.get_buffer(f"cumulative_length_{i}").copy_(cache_position[0])
        sink = self._hooked()
        sink.clear()
        self.wrapper.net(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache_position=cache_position, use_cache=True, **{self._cache_arg: self.cache})
        out = list(sink)
        sink.clear()
        for i in range(self.layers):
            out += [self.get_buffer(f"key_cache_{i}").clone(), self.get_buffer(f"value_cache_{i}").clone()]
        return tuple(out)


def decode_feeds(inputs: ModelInputs, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill's ``(input_ids, attention_mask, position_ids, cache_position)``: the mask over the
    whole static cache (the session's, then ones for the ``steps`` tokens to come), each row's positions."""
    ids = np.ascontiguousarray(inputs.input_ids, np.int64)
    batch, length = ids.shape
    mask = np.concatenate([np.asarray(inputs.attention_mask, np.int64), np.ones((batch, steps), np.int64)], axis=1)
    given = inputs.position_ids()
    positions = np.broadcast_to(np.arange(length, dtype=np.int64), (batch, length)) if given is None else given
    return (torch.from_numpy(ids), torch.from_numpy(np.ascontiguousarray(mask)),
            torch.from_numpy(np.ascontiguousarray(positions, np.int64)), torch.arange(length, dtype=torch.long))


class ProgramDecoder:
    """The engine protocol (``prefill``, ``decode_step``, ``kv_cache``) over a static-cache program
    of :class:`StaticCacheSteps` (methods ``prefill`` and ``decode``): its outputs are ``keys``
    (every checkpoint), then each of ``layers`` layers' keys and values.

    Args:
        program: the loaded program.
        keys: the checkpoint each leading output is.
        layers: the model's layers (the cache outputs that follow).
        steps: the decode steps the program's cache was sized for.
    """

    def __init__(self, program: LoadedMethods, keys: Sequence[CheckpointKey], layers: int, steps: int) -> None:
        self.program, self.keys, self.layers, self.steps = program, list(keys), layers, steps
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._length = 0  #: the slots written so far
        self._cache: list[torch.Tensor] = []
        #: the program's own seconds per call (``prefill`` first, then each step)
        self.seconds: list[float] = []

    def _call(self, method: str, feeds: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        import time

        start = time.perf_counter()
        outs = self.program.run(method, feeds)
        self.seconds.append(time.perf_counter() - start)
        n = len(self.keys)
        self._cache = outs[n:n + 2 * self.layers]
        return {str(k): v for k, v in zip(self.keys, outs[:n])}

    def prefill(self, inputs: ModelInputs, keys: Sequence[CheckpointKey]) -> dict[str, torch.Tensor]:
        """The session's rows through method ``prefill``: the cache's first slots written."""
        ids, self._mask, positions, slots = decode_feeds(inputs, self.steps)
        self._length = ids.shape[1]
        return self._call("prefill", [ids, self._mask, positions, slots])

    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, keys: Sequence[CheckpointKey]) -> dict[str, torch.Tensor]:
        """One token per row at its position through method ``decode``, written at the next slot."""
        if self._length >= self._mask.shape[1]:
            from ...errors import BackendRuntimeError

            raise BackendRuntimeError(f"the program's static cache holds {self._mask.shape[1]} positions, all written",
                                      backend="executorch", call="decode_step()")
        feeds = [torch.from_numpy(np.asarray(tokens, np.int64).reshape(-1, 1).copy()), self._mask,
                 torch.from_numpy(np.asarray(positions, np.int64).reshape(-1, 1).copy()),
                 torch.tensor([self._length], dtype=torch.long)]
        self._length += 1
        return self._call("decode", feeds)

    def kv_cache(self) -> dict[int, LayerKV]:
        """Each layer's keys and values as the program holds them, ``[B, length, kv_heads, head_dim]``
        over the slots written so far."""
        n = self._length
        return {i: (self._cache[2 * i][:, :, :n].transpose(1, 2), self._cache[2 * i + 1][:, :, :n].transpose(1, 2))
                for i in range(len(self._cache) // 2)}
