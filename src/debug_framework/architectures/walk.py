"""The whole-model walk every model shares, whatever array namespace it runs in.

A model reads its parameters through its family's :class:`~.layout.WeightLayout`, defines
``embed``, ``attention_block(i, h, attention_mask) -> post_attention``,
``mlp_block(i, post_attention) -> post_mlp`` and ``head``, and inherits ``layer`` (the two blocks
in turn) and ``forward``: the checkpoint walk with taps and layer-input capture. Each block can run
alone on its own input, which is what judging a block on the reference's input needs.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import ClassVar, Protocol

import numpy as np

from ..capture.spill import checkpoint_dict
from ..errors import ConfigurationError
from .kv_cache import KVCache
from .layout import LayerStream, ModelParameters, WeightLayout, WeightSource
from .xp import NUMPY, Array, ArrayNamespace

Key = tuple[str, int | None]

__all__ = ["walk_checkpoints", "Model", "ModelConfig"]


class ModelConfig(Protocol):
    """What the walk needs of a family's config (``modelio.configs``)."""

    @property
    def num_hidden_layers(self) -> int: ...


def walk_checkpoints(
    h: Array,
    num_layers: int,
    layer: Callable[[int, Array], tuple[Array, Array]],
    head: Callable[[Array], Array] | None,
    want: set[Key] | None,
    layer_inputs: MutableMapping[int, Array] | None,
) -> dict[Key, Array]:
    """Run the layers from the embedding output ``h`` and keep the checkpoints in ``want`` (all
    when ``None``): ``post_embedding``, per layer ``post_attention`` and ``post_mlp`` (``layer(i, h)``
    returns both), then ``post_processing`` = ``head(h)`` (``h`` itself when ``head`` is ``None``),
    computed only when wanted. Each layer's input goes into ``layer_inputs`` when it is a dict."""
    out: dict[Key, Array] = checkpoint_dict()  # type: ignore[assignment]  # spilled beyond the run's budget

    def keep(name: str, index: int | None, x: Array) -> None:
        if want is None or (name, index) in want:
            out[(name, index)] = x

    keep("post_embedding", None, h)
    for i in range(num_layers):
        if layer_inputs is not None:
            layer_inputs[i] = h
        a, h = layer(i, h)
        keep("post_attention", i, a)
        keep("post_mlp", i, h)
    if want is None or ("post_processing", None) in want:
        out[("post_processing", None)] = h if head is None else head(h)
    return out


#: The names of a layer's intermediate values (:meth:`Model.traced_layer`), in compute order, shared
#: with engines that report theirs (llama.cpp's graph names them alike): the attention's input norm,
#: the projected queries, keys and values, the rotated queries and keys, the heads' merged output
#: before the output projection, after it, then the MLP's input norm, (a mixture of experts) the
#: router's logits, gate, up, activation (the gated product) and output (before the residual).
TRACE_NAMES = ("attn_norm", "q", "k", "v", "q_rope", "k_rope", "attn", "attn_out", "post_attention",
               "ffn_norm", "router_logits", "ffn_gate", "ffn_up", "ffn_act", "ffn_out", "post_mlp")


class Model:
    """A model of one family in one array namespace and compute dtype.

    Args:
        config: the family's typed config (``modelio.configs``).
        weights: canonical tensor name -> tensor (a ``WeightStore`` or any mapping of array-likes).
        dtype: the compute dtype or its name (NumPy: float64, float32; another namespace: the dtypes it has).
        xp: the array namespace (``xp.NUMPY``, the default, ``xp.torch_namespace()``, or a registered one).
        stream: read the weights layer by layer (:mod:`.layout`: about one layer converted at a
            time); default: streamed over host arrays (NumPy, torch), resident over another namespace.
    """

    #: the array namespaces whose models stream their weights by default.
    STREAMED_NAMESPACES: ClassVar[frozenset[str]] = frozenset({"numpy", "torch"})

    #: the family's weight layout.
    layout: ClassVar[WeightLayout]

    #: the position of each token ``[B, T]`` (int) where it is not ``0 .. T-1`` (left padding, a
    #: start position: ``ModelInputs.position_ids()``); set by the backend before each call, None
    #: for ``0 .. T-1``
    positions: np.ndarray | None = None

    #: the KV cache of a decode (:class:`~.kv_cache.KVCache`): each layer's keys and values are
    #: appended to it and attention reads them all; set by the decoding backend, None for one pass
    cache: KVCache | None = None

    #: where a :meth:`traced_layer` call records each named intermediate value (None: not tracing)
    trace: dict[str, Array] | None = None

    def __init__(self, config: ModelConfig, weights: WeightSource, dtype: object = np.float64,
                 xp: ArrayNamespace = NUMPY, *, stream: bool | None = None) -> None:
        self.config, self.xp, self.dtype = config, xp, xp.dtype(dtype)
        if stream is None:
            stream = xp.name in self.STREAMED_NAMESPACES
        self.params: ModelParameters
        self.layers: LayerStream
        self.params, self.layers = self.layout.read(weights, config.num_hidden_layers, xp, self.dtype, stream=stream)

    def embed(self, input_ids: Array, token_type_ids: Array | None = None) -> Array:
        """``[B, T]`` ids -> ``[B, T, D]``, the post_embedding checkpoint."""
        raise NotImplementedError

    def attention_block(self, i: int, h: Array, attention_mask: Array) -> Array:
        """Layer i's attention block on the layer's input ``h``: the post_attention state."""
        raise NotImplementedError

    def mlp_block(self, i: int, a: Array) -> Array:
        """Layer i's MLP block on the post-attention state ``a``: the layer's output (post_mlp)."""
        raise NotImplementedError

    def cached(self, i: int, k: Array, v: Array) -> tuple[Array, Array]:
        """Layer i's keys and values over every position so far (appended to :attr:`cache`), or
        ``k`` and ``v`` themselves where no cache is kept."""
        return (k, v) if self.cache is None else self.cache.append(i, k, v)

    def block(self, i: int, block: str, x: Array, attention_mask: Array) -> tuple[Key, Array]:
        """Block ``block`` of layer ``i`` alone on its own input: ``"attention"`` on the layer's
        input (-> ``("post_attention", i)``) or ``"mlp"`` on the post-attention state (->
        ``("post_mlp", i)``)."""
        if block == "attention":
            return ("post_attention", i), self.attention_block(i, x, attention_mask)
        if block == "mlp":
            return ("post_mlp", i), self.mlp_block(i, x)
        raise ConfigurationError(f"unknown block {block!r}", hint="use 'attention' or 'mlp'")

    def layer(self, i: int, h: Array, attention_mask: Array) -> tuple[Array, Array]:
        """Layer i on its input ``h``: (post_attention, post_mlp), one block after the other."""
        a = self.tap("post_attention", self.attention_block(i, h, attention_mask))
        return a, self.tap("post_mlp", self.mlp_block(i, a))

    def tap(self, name: str, value: Array) -> Array:
        """``value``, recorded under ``name`` while a :meth:`traced_layer` call runs."""
        if self.trace is not None:
            self.trace[name] = value
        return value

    def traced_layer(self, i: int, h: Array, attention_mask: Array) -> dict[str, Array]:
        """Layer i on ``h`` with its named intermediate values, in the order computed (the names of
        :data:`TRACE_NAMES`; a family records those its steps have), ending with ``post_attention``
        and ``post_mlp``: what a drill-down by named intermediates compares an engine's with."""
        self.trace = {}
        try:
            self.layer(i, h, attention_mask)
            return self.trace
        finally:
            self.trace = None

    def head(self, h: Array) -> Array:
        """The last layer's output -> post_processing (here: itself)."""
        return h

    def forward(
        self,
        input_ids: Array,
        attention_mask: Array,
        want: set[Key] | None = None,
        layer_inputs: MutableMapping[int, Array] | None = None,
        token_type_ids: Array | None = None,
    ) -> dict[Key, Array]:
        """Run the model; return the checkpoints in ``want`` (all when ``None``) keyed ``(name, layer)``.
        When ``layer_inputs`` is a dict, each layer's input hidden state is stored in it."""
        return walk_checkpoints(self.embed(input_ids, token_type_ids), self.config.num_hidden_layers,
                                lambda i, h: self.layer(i, h, attention_mask), self.head, want, layer_inputs)

    def parameters(self) -> list[Array]:
        """Every parameter array (for ``mx.eval`` after loading a resident model; a streamed model
        converts every layer in turn to list them)."""
        return [v for group in (self.params, *self.layers) for v in group.values() if v is not None]
