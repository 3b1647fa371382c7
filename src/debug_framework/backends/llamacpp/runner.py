"""``llamacpp``: a GGUF run in llama.cpp (the ``xllamacpp`` wheel's build, through :mod:`.binding`),
the canonical checkpoints read from its graph nodes through the eval callback, every token row.

=====================  ===============================================
checkpoint             llama.cpp node
=====================  ===============================================
``post_embedding``     ``embd`` (Gemma: ``inp_scaled``; GPT-2: ``inpL``, with the learned positions)
``post_attention:i``   ``ffn_inp-i`` (attention and its residual; Gemma: ``sa_out-i``; Phi-3: unnamed, the first source of the MLP's ``norm-i``)
``router_logits:i``    ``ffn_moe_logits-i`` (a mixture of experts' router, ``[tokens, experts]``)
``post_mlp:i``         ``l_out-i`` (the layer's output)
``post_processing``    the logits of every token (``result_output``)
=====================  ===============================================

GPT-2, StarCoder2, StableLM and Phi-2 files run against the generic tier (:data:`GENERIC_RUNS`); a
checkpoint a file's graph has no node of (:data:`NOT_IN_GRAPH`) is not produced, so not compared.

Which file: ``model_file`` (``--alternative-model FILE.gguf``: a conversion checked against the
Hugging Face model of ``--model-path``), else the session's model itself (``--model-path FILE.gguf``:
llama.cpp checked against the file's own weights, dequantized). llama.cpp's settings are options
(``--backend-option cache_type_k=f32`` ...), llama.cpp's defaults by default, recorded with the
session in ``version_info``. One layer or one block replays by replacing its input node's value as
soon as llama.cpp computes it (:mod:`.graph`); decode steps go through llama.cpp's own KV cache,
and one layer replays (or is traced) at a decode step after the prompt and the steps before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...architectures.walk import TRACE_NAMES
from ...capture.keys import Capture, CheckpointKey
from ...errors import BackendInitializationError, ConfigurationError
from ...modelio.gguf_model import MOE_ARCHS
from ...modelio.inputs import ModelInputs
from ...modelio.loader import LoadedModel
from ..base import BaseBackend, HiddenState, Taps, cpu_name, installed_version
from ..decode import DecodeRun, runner_decode
from .binding import PINNED_XLLAMACPP, library
from .chain import ChainNodes, ReplayChain
from .graph import LlamaGraph, LlamaSettings, Pass, Rows
from .precision import LlamaPrecision, llama_precision

if TYPE_CHECKING:
    from ...jsonio import JsonObject
    from ...modelio.gguf_read import GgufFile

__all__ = ["LlamaCppBackend", "TRACE_NODES", "CHECKPOINT_NODES", "RUNS", "GENERIC_RUNS", "NOT_IN_GRAPH", "ROUTER_NODE",
           "llamacpp_availability", "trace_nodes"]

#: the llama.cpp architectures whose graphs hold every canonical checkpoint (Phi-3's ``ffn_inp-i`` is
#: unnamed: found as the input of the MLP's norm, :data:`~.graph.UNNAMED_FFN_INP`)
RUNS: tuple[str, ...] = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", *MOE_ARCHS)

#: a mixture of experts' router logits in llama.cpp's graph (``build_moe_ffn``): ``ffn_moe_logits-i``,
#: ``[tokens, experts]`` (``router_logits:i``)
ROUTER_NODE = "ffn_moe_logits"

#: llama.cpp architecture -> its graph's nodes of ``post_embedding`` and ``post_attention`` where
#: they are not ``embd`` and ``ffn_inp-i`` (Gemma scales the embeddings, then adds the post-normed
#: attention in ``sa_out-i``; GPT-2 adds the learned positions in ``inpL``)
CHECKPOINT_NODES: dict[str, tuple[str, str]] = {"gemma2": ("inp_scaled", "sa_out"), "gemma3": ("inp_scaled", "sa_out"),
                                                "gpt2": ("inpL", "ffn_inp")}

#: the llama.cpp architectures run against the generic tier (the model's own eager ``transformers``
#: code; :mod:`debug_framework.modelio.gguf_generic`), each checked with the eval callback on a real
#: file: their graphs name ``post_embedding`` (:data:`CHECKPOINT_NODES`), ``ffn_inp-i`` (the
#: residual stream after attention), ``l_out-i``, ``result_norm`` and ``result_output``. An
#: architecture whose graph has no node of a checkpoint lists it in :data:`NOT_IN_GRAPH`.
GENERIC_RUNS: tuple[str, ...] = ("gpt2", "starcoder2", "stablelm", "phi2")

#: llama.cpp architecture -> the checkpoint names a file's graph has no node of, reported as not
#: compared (:meth:`LlamaCppBackend.checkpoints`). A parallel attention+MLP block's
#: ``post_attention:i`` on the generic tier is the attention block's output alone, which these graphs
#: leave unnamed: Phi-2's always; StableLM's where the file has no ``ffn_norm`` (llama.cpp's own rule),
#: whose ``ffn_inp-i`` is then the layer's input plus the attention, another value
NOT_IN_GRAPH: dict[str, Callable[[GgufFile], frozenset[str]]] = {
    "stablelm": lambda f: frozenset() if "blk.0.ffn_norm.weight" in f.tensors else frozenset({"post_attention"}),
    "phi2": lambda f: frozenset({"post_attention"})}

#: names of :data:`~debug_framework.architectures.walk.TRACE_NAMES` -> (llama.cpp node, which
#: occurrence: ``"proj"`` the last before the rotation, ``"rope"`` the rotation, ``"one"`` the only)
TRACE_NODES: dict[str, tuple[str, str]] = {
    "attn_norm": ("attn_norm", "one"), "q": ("Qcur", "proj"), "k": ("Kcur", "proj"), "v": ("Vcur", "proj"),
    "q_rope": ("Qcur", "rope"), "k_rope": ("Kcur", "rope"), "attn": ("kqv_out", "one"),
    "attn_out": ("attn_out", "one"), "post_attention": ("ffn_inp", "one"), "ffn_norm": ("ffn_norm", "one"),
    "ffn_gate": ("ffn_gate", "one"), "ffn_up": ("ffn_up", "one"), "ffn_act": ("ffn_swiglu", "one"),
    "ffn_out": ("ffn_out", "one"), "post_mlp": ("l_out", "one"),
}
#: llama.cpp architecture -> its trace nodes where they differ from :data:`TRACE_NODES` (None: not named)
_TRACE_OVERRIDES: dict[str, dict[str, tuple[str, str] | None]] = {
    "gemma2": {"post_attention": ("sa_out", "one"), "ffn_act": ("ffn_geglu", "one"), "attn_out": None},
    "gemma3": {"post_attention": ("sa_out", "one"), "ffn_act": ("ffn_geglu", "one"), "attn_out": None},
    # Phi-3: q/k/v are views of the fused projection, Qcur-i's last value is scaled by head_dim ** -0.5,
    # the output projection is unnamed and ffn_up-i is the fused gate|up
    "phi3": {"q": None, "k": None, "v": None, "q_rope": None, "attn_out": None, "ffn_gate": None, "ffn_up": None},
}
#: the trace nodes of a mixture of experts' graph (:data:`~debug_framework.modelio.gguf_model.MOE_ARCHS`,
#: ``build_moe_ffn``): the router's logits, then the chosen experts' gate/up/activation per (token,
#: slot) (``ffn_moe_gate-i`` ...: no dense value to compare), their weighted sum
_MOE_TRACE: dict[str, tuple[str, str] | None] = {"router_logits": (ROUTER_NODE, "one"), "ffn_gate": None,
                                                 "ffn_up": None, "ffn_act": None, "ffn_out": ("ffn_moe_out", "one")}


def trace_nodes(architecture: str) -> dict[str, tuple[str, str]]:
    """:data:`TRACE_NODES` of the graph of a llama.cpp ``architecture``."""
    changed = _TRACE_OVERRIDES.get(architecture, _MOE_TRACE if architecture in MOE_ARCHS else {})
    out: dict[str, tuple[str, str]] = {}
    for trace in TRACE_NAMES:
        mine = changed[trace] if trace in changed else TRACE_NODES.get(trace)
        if mine is not None:
            out[trace] = mine
    return out


def llamacpp_availability() -> tuple[bool, str]:
    """Whether the pinned llama.cpp binding loads here."""
    try:
        library()
    except BackendInitializationError as exc:
        return False, exc.message + (f" ({exc.hint})" if exc.hint else "")
    return True, ""


def _gguf_of(model: LoadedModel, model_file: str | Path | None) -> Path:
    """The GGUF llama.cpp runs: ``model_file``, else the session's model where it is a GGUF."""
    if model_file is not None:
        p = Path(model_file).expanduser()
        if p.suffix.lower() != ".gguf" or not p.is_file():
            raise BackendInitializationError(f"the alternative model {str(p)!r} is not an existing .gguf file",
                                             backend="llamacpp", hint="--alternative-model FILE.gguf")
        return p
    if getattr(model, "format", None) == "gguf":
        return Path(model.path)
    raise BackendInitializationError(
        "llamacpp runs a GGUF file, and the session's model is not one", backend="llamacpp",
        hint="give the converted file: --alternative-model FILE.gguf, or validate the file itself: --model-path FILE.gguf")


def _unpermute_heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    """llama.cpp's interleaved rotary pairs ``[x0 y0 x1 y1 ...]`` of each head back in Hugging
    Face's half-split order ``[x0 x1 ... y0 y1 ...]``: ``x`` is ``[..., heads * E]`` or ``[..., E]``."""
    shape = x.shape
    h = x.reshape(*shape[:-1], -1, head_dim // 2, 2)
    return np.swapaxes(h, -1, -2).reshape(shape)


class LlamaCppBackend(BaseBackend):
    """llama.cpp on the CPU.

    Args:
        model_file: the GGUF to run (``--alternative-model``); None: the session's model, a GGUF.
        cache_type_k, cache_type_v: the KV cache types (``f16``, llama.cpp's default; ``f32``, ``q8_0`` ...).
        flash_attn: ``auto`` (llama.cpp's default), ``on`` or ``off``.
        n_threads: llama.cpp's threads (None: its default).
    """

    name = "llamacpp"
    supported_dtypes = ("float32", "float16", "bfloat16")
    default_dtype = "float32"
    runs_onnx_files = False
    #: each row runs as a sequence of its own (its padding never enters llama.cpp): a sliding window
    #: counts the row's tokens (``backends.capabilities.WINDOW_COUNTS``)
    window_counts = "tokens"

    def __init__(self, model_file: str | None = None, cache_type_k: str = "f16", cache_type_v: str = "f16",
                 flash_attn: str = "auto", n_threads: int | None = None) -> None:
        super().__init__()
        self.model_file = model_file
        self.settings = LlamaSettings(str(cache_type_k), str(cache_type_v), str(flash_attn), n_threads).check()
        self.graph: LlamaGraph | None = None
        self.gguf: GgufFile | None = None
        #: the llama.cpp node of each value of the last :meth:`run_layer_traced` (trace name -> node)
        self.trace_nodes: dict[str, str] = {}
        #: the last layer replay (layer, input digest, capture): an attention-block replay on the
        #: same input is that pass's first half
        self._last_layer: tuple[int, str, Capture] | None = None
        #: the layer and MLP-block replays, each resumed along one pass (:mod:`.chain`)
        self._chains: dict[str, ReplayChain] = {}
        #: what the calibration's emulation of this file cannot reproduce (generic tier; in words)
        self.not_reproduced: list[str] = []

    def availability(self) -> tuple[bool, str]:
        return llamacpp_availability()

    # -- preparation ------------------------------------------------------------------------------
    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        """Load the GGUF in llama.cpp and check it is the session's model (family, sizes)."""
        if device not in ("cpu", None):
            raise BackendInitializationError(f"this llama.cpp build runs on the CPU, not {device!r}", backend=self.name)
        from ...modelio.gguf_read import read_gguf

        dtype = self._check_prepare(model, dtype, "cpu")
        path = _gguf_of(model, self.model_file)
        self.gguf = read_gguf(path)  # malformed: DF004 here, before llama.cpp reads it
        self._check_same_model(model)
        self.not_reproduced = _generic_limits(model, self.gguf, self.precision) if model.architecture == "generic" \
            else []
        self.release_replays()
        if self.graph is not None:
            self.graph.close()
        self.graph = LlamaGraph(path, self.settings, self.gguf.architecture)

    def _check_same_model(self, model: LoadedModel) -> None:
        from ...modelio.gguf_model import gguf_config

        assert self.gguf is not None
        if model.architecture == "generic" and self.gguf.architecture in GENERIC_RUNS:
            _check_same_generic_model(self.gguf, model)
            return
        if model.architecture == "generic" or self.gguf.architecture not in RUNS:
            raise BackendInitializationError(
                f"llamacpp checks GGUF files of {', '.join(RUNS + GENERIC_RUNS)} (llama.cpp's graph names their "
                f"checkpoints; {', '.join(GENERIC_RUNS)} against the generic tier); "
                f"this is {self.gguf.architecture!r} / {model.config.model_type!r}", backend=self.name,
                hint="validate the Hugging Face model it was converted from with another engine")
        mine = gguf_config(self.gguf)
        family = {"mistral": "llama"}.get(model.config.model_type, model.config.model_type)  # written as llama
        if mine["model_type"] != family:
            raise BackendInitializationError(
                f"the GGUF {self.gguf.path} is not this model: a {self.gguf.architecture} file for a "
                f"{model.config.model_type} model", backend=self.name, hint="give the file converted from --model-path")
        keys = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"]
        # a mixture of experts: its experts, how many a token takes, their width and whether their
        # weights are renormalised (llama.cpp's graph always does) must be the file's too
        keys += [k for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob") if k in mine]
        for key in keys:
            if mine[key] != getattr(model.config, key, None):
                raise BackendInitializationError(
                    f"the GGUF {self.gguf.path} is not this model: {key} {mine[key]} where the model has "
                    f"{getattr(model.config, key)}", backend=self.name, hint="give the file converted from --model-path")

    @property
    def precision(self) -> LlamaPrecision:
        """What llama.cpp computes this file at (weights, activations, KV cache)."""
        assert self.gguf is not None
        return llama_precision(self.gguf, self.settings)

    def checkpoints(self, model: LoadedModel) -> list[str] | None:
        """The checkpoints llama.cpp's graph of this file has nodes of, in model order, where it lacks
        some (:data:`NOT_IN_GRAPH`): the others are not compared; None where it has every one."""
        from ...capture.keys import all_checkpoints
        from ...modelio.gguf_read import read_gguf

        gguf = self.gguf if self.gguf is not None else read_gguf(_gguf_of(model, self.model_file))
        missing = _not_in_graph(gguf)
        if not missing:
            return None
        return [str(k) for k in all_checkpoints(model.num_layers, model.router_layers) if k.name not in missing]

    def declared_dtype(self, model: LoadedModel) -> tuple[str, str] | None:
        """``--dtype auto``: float32 activations, judged against the calibration's emulation of the
        file's weight types, llama.cpp's activation quantization and the KV cache type."""
        if self.gguf is None:
            from ...modelio.gguf_read import read_gguf

            self.gguf = read_gguf(_gguf_of(model, self.model_file))
        return "float32", f"llama.cpp runs {self.precision.describe()}"

    def emulated_precision(self, model: LoadedModel) -> LlamaPrecision:
        """The precision the calibration reproduces in a trusted implementation (:mod:`.precision`;
        on the generic tier the model's own eager code at it, :mod:`.generic_precision`)."""
        self.declared_dtype(model)
        if model.architecture == "generic":
            from .generic_precision import GenericLlamaPrecision

            assert self.gguf is not None
            return GenericLlamaPrecision.of(self.precision, self.gguf.architecture)
        return self.precision

    def version_info(self) -> JsonObject:
        info: JsonObject = {**super().version_info(), "runtime": "llama.cpp (xllamacpp)",
                            "xllamacpp": installed_version("xllamacpp"), "binding_pinned_to": PINNED_XLLAMACPP,
                            "device_name": cpu_name(), "cache_type_k": self.settings.cache_type_k,
                            "cache_type_v": self.settings.cache_type_v, "flash_attn": self.settings.flash_attn,
                            "n_threads": self.settings.n_threads, "window_counts": self.window_counts}
        if self.gguf is not None:
            info["model_file"] = str(self.gguf.path)
            info["precision"] = self.precision.describe()
        if self.not_reproduced:
            info["not_reproduced"] = list(self.not_reproduced)  # type: ignore[assignment]
        return info

    # -- passes -----------------------------------------------------------------------------------
    def _graph(self) -> LlamaGraph:
        self._prepared()
        assert self.graph is not None
        return self.graph

    def _feed(self, inputs: ModelInputs, want: frozenset[str], replace: dict[str, np.ndarray] | None = None,
              steps: int = 0, stop_after: str | None = None) -> tuple[Pass, Rows]:
        """One prefill pass of every row's real tokens in a fresh context."""
        g = self._graph()
        rows = Rows.of(inputs.attention_mask)
        ids = np.asarray(inputs.input_ids, np.int64)
        pos = inputs.position_ids()
        pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape) if pos is None else np.asarray(pos)
        g.open_context(ids.shape[0], len(rows.batch) + ids.shape[0] * (steps + 1), max(len(rows.batch), ids.shape[0]))
        return g.decode(rows.gather(ids), rows.gather(pos), rows.batch, want, replace, stop_after=stop_after), rows

    def _checkpoint_nodes(self) -> tuple[str, str]:
        """This file's graph's nodes of ``post_embedding`` and (less ``-i``) ``post_attention``."""
        arch = self.gguf.architecture if self.gguf is not None else ""
        return CHECKPOINT_NODES.get(arch, ("embd", "ffn_inp"))

    def _node(self, key: CheckpointKey) -> str:
        embd, attn = self._checkpoint_nodes()
        return {"post_embedding": embd, "post_attention": f"{attn}-{key.layer}", "post_mlp": f"l_out-{key.layer}",
                "router_logits": f"{ROUTER_NODE}-{key.layer}"}.get(key.name, "result_output")

    def can_run_block(self) -> tuple[bool, str]:
        """Whether an MLP block replays alone: not where the file's graph has no post-attention
        state to replace (:data:`NOT_IN_GRAPH`: a parallel attention+MLP block)."""
        if self.gguf is not None and "post_attention" in _not_in_graph(self.gguf):
            return False, (f"cannot run the MLP block alone: llama.cpp's {self.gguf.architecture} graph of this file "
                           "has no post-attention state (a parallel attention+MLP block); the layer is replayed whole")
        return True, ""

    def _capture(self, kept: Pass, rows: Rows, keys: Sequence[CheckpointKey], seconds: float,
                 layer_inputs: dict[int, np.ndarray] | None = None) -> Capture:
        tensors: dict[CheckpointKey, np.ndarray] = {}
        absent = _not_in_graph(self.gguf) if self.gguf is not None else frozenset()
        for key in keys:
            if key.name in absent:  # a node of another value under the checkpoint's usual name
                continue
            if key.name == "post_processing":
                tensors[key] = rows.scatter(kept.logits)
            elif key.name == "router_logits" and self._node(key) in kept.nodes:
                routed = rows.scatter(kept.last(self._node(key)))
                tensors[key] = routed.reshape(-1, routed.shape[-1])  # [tokens, experts], as a router returns them
            elif self._node(key) in kept.nodes:
                tensors[key] = rows.scatter(kept.last(self._node(key)))
        return Capture(tensors=tensors, backend=self.name, dtype=self.dtype, elapsed_s=seconds,
                       layer_inputs=layer_inputs or {}, meta={"engine": "llama.cpp", **self.settings.__dict__})

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        keys = self._keys(taps)
        self._check_inputs(inputs)
        n = self._prepared().num_layers
        want = {self._node(k) for k in keys}
        if capture_layer_inputs:
            want |= {self._input_node(i) for i in range(n)}
        kept, rows = self._feed(inputs, frozenset(want))
        layer_inputs = None
        if capture_layer_inputs:
            layer_inputs = {i: rows.scatter(kept.last(self._input_node(i))) for i in range(n)}
        return self._capture(kept, rows, keys, kept.seconds, layer_inputs)

    def _input_node(self, i: int) -> str:
        return self._checkpoint_nodes()[0] if i == 0 else f"l_out-{i - 1}"

    def _replayed(self, inputs: ModelInputs, node: str, hidden_in: HiddenState, want: set[str],
                  last: str) -> tuple[Pass, Rows]:
        """A pass with ``node`` replaced by ``hidden_in``, stopped once ``last`` is computed."""
        from ...comparison import float64_array

        rows = Rows.of(inputs.attention_mask)
        given = rows.gather(float64_array(hidden_in).astype(np.float32))
        return self._feed(inputs, frozenset(want | {last}), {node: given}, stop_after=last)

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Layer ``i`` on ``hidden_in`` ``[B, T, D]``: its input node replaced by it as llama.cpp computes it."""
        keys = [CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)]
        kept, rows = self._chained("layer", i, hidden_in, inputs)
        cap = self._capture(kept, rows, keys, kept.seconds)
        self._last_layer = (i, _fingerprint(hidden_in, inputs), cap)
        return cap

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` of layer ``i`` alone: ``"attention"`` on the layer's input (its input node
        replaced), ``"mlp"`` on the post-attention state (``ffn_inp-i`` replaced)."""
        if block not in ("attention", "mlp"):
            raise ConfigurationError(f"unknown block {block!r}", hint="use 'attention' or 'mlp'")
        key = CheckpointKey("post_attention" if block == "attention" else "post_mlp", i)
        last = getattr(self, "_last_layer", None)
        if block == "attention" and last is not None and last[0] == i and last[1] == _fingerprint(hidden_in, inputs):
            # the same pass as the layer replay just run on this very input (its first half): reused
            cap = last[2]
            return Capture(tensors={key: cap.tensors[key]}, backend=self.name, dtype=self.dtype,
                           elapsed_s=cap.elapsed_s, meta=cap.meta)
        if block == "mlp":
            kept, rows = self._chained("mlp", i, hidden_in, inputs)
        else:
            kept, rows = self._replayed(inputs, self._input_node(i), hidden_in, {self._node(key)}, self._node(key))
        return self._capture(kept, rows, [key], kept.seconds)

    def _chained(self, which: str, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> tuple[Pass, Rows]:
        """Replay ``i`` of the layer (``which`` ``"layer"``) or MLP-block (``"mlp"``) replays, resumed
        along one pass while they come in order (:mod:`.chain`)."""
        from ...comparison import float64_array

        graph, model = self._graph(), self._prepared()
        chain = self._chains.get(which)
        if chain is None:
            attn = self._checkpoint_nodes()[1]
            nodes = ChainNodes(self._input_node, lambda k: (f"{attn}-{k}", f"l_out-{k}")) if which == "layer" \
                else ChainNodes(lambda k: f"{attn}-{k}", lambda k: (f"l_out-{k}",))
            arch = self.gguf.architecture if self.gguf is not None else ""
            chain = self._chains[which] = ReplayChain(ReplayChain.graph_for(graph.path, self.settings, arch, nodes,
                                                                            model.num_layers))
        rows = Rows.of(inputs.attention_mask)
        ids = np.asarray(inputs.input_ids, np.int64)
        pos = inputs.position_ids()
        pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape) if pos is None else np.asarray(pos)
        value = rows.gather(float64_array(hidden_in).astype(np.float32))
        kept = chain.replay(i, _fingerprint(np.zeros(0), inputs), rows, rows.gather(ids), rows.gather(pos), value)
        return kept, rows

    def release_replays(self) -> None:
        """End the replay passes and free their contexts and models (after isolation)."""
        chains, self._chains = self._chains, {}
        for chain in chains.values():
            chain.close()

    def run_layer_traced(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> list[tuple[str, np.ndarray]]:
        """Layer ``i`` on ``hidden_in`` with its named intermediate values (trace names, in llama.cpp's
        order), each ``[B, T, ...]``; :attr:`trace_nodes` says which llama.cpp node each came from."""
        names = {f"{node}-{i}" for node, _ in self._trace_nodes().values()}
        kept, rows = self._replayed(inputs, self._input_node(i), hidden_in, names, f"l_out-{i}")
        return self._traced(i, kept, rows)

    def run_decode_layer_traced(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, step: int,
                                tokens: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """:meth:`run_layer_traced` at decode ``step`` (>= 1) (:meth:`_step_replayed`); each value ``[B, 1, ...]``."""
        names = {f"{node}-{i}" for node, _ in self._trace_nodes().values()}
        kept, rows = self._step_replayed(i, hidden_in, inputs, step, tokens, names)
        return self._traced(i, kept, rows)

    def run_decode_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, step: int,
                         tokens: np.ndarray) -> Capture:
        """Layer ``i`` alone at decode ``step`` on ``hidden_in`` ``[B, 1, D]`` (:meth:`_step_replayed`):
        its post_attention and post_mlp, ``[B, 1, D]`` each."""
        keys = [CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)]
        kept, rows = self._step_replayed(i, hidden_in, inputs, step, tokens, {self._node(k) for k in keys})
        return self._capture(kept, rows, keys, kept.seconds)

    def _step_replayed(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, step: int, tokens: np.ndarray,
                       want: set[str]) -> tuple[Pass, Rows]:
        """The prompt and the steps before ``step`` (``tokens`` ``[B, >= step]``) through llama.cpp's own
        KV cache in a fresh context, then the step's tokens with layer ``i``'s input node replaced by
        ``hidden_in`` ``[B, 1, D]``, stopped once ``l_out-i`` is computed (``want`` kept)."""
        from ...comparison import float64_array
        from ..decode import decode_positions

        if step < 1:
            raise ConfigurationError(f"a decode step is >= 1, got {step}")
        self._check_inputs(inputs)
        decoder = _Decoder(self, step)
        decoder.prefill(inputs, [])
        mask, offset = np.asarray(inputs.attention_mask, np.int64), int(inputs.meta.get("position_offset", 0) or 0)
        tokens = np.asarray(tokens, np.int64)
        for s in range(step):
            positions = decode_positions(mask, offset)[:, 0]
            mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
            if s < step - 1:
                decoder.decode_step(tokens[:, s], positions, [])
        b = tokens.shape[0]
        given = float64_array(hidden_in).astype(np.float32).reshape(b, -1)
        kept = self._graph().decode(tokens[:, step - 1], positions, np.arange(b), frozenset(want | {f"l_out-{i}"}),
                                    {self._input_node(i): given}, stop_after=f"l_out-{i}")
        return kept, Rows(np.arange(b), np.zeros(b, np.int64), (b, 1))

    def _trace_nodes(self) -> dict[str, tuple[str, str]]:
        return trace_nodes(self.gguf.architecture if self.gguf is not None else "")

    def _traced(self, i: int, kept: Pass, rows: Rows) -> list[tuple[str, np.ndarray]]:
        """Layer ``i``'s traced values of a pass, in Hugging Face's layout, each ``[B, T, ...]``."""
        nodes = self._trace_nodes()
        model = self._prepared()
        permuted = self.gguf is not None and self.gguf.architecture == "llama"
        head_dim = int(getattr(model.config, "head_dim", 0))
        out: list[tuple[str, np.ndarray]] = []
        self.trace_nodes = {}
        for trace, (node, which) in nodes.items():
            values = kept.nodes.get(f"{node}-{i}", [])
            value = _occurrence(values, which)
            if value is None:
                continue
            if permuted and trace in ("q", "k", "q_rope", "k_rope"):
                value = _unpermute_heads(value, head_dim)
            if value.ndim == 3 and trace in ("q", "k", "v"):
                value = value.reshape(value.shape[0], -1)
            self.trace_nodes[trace] = f"{node}-{i}"
            out.append((trace, rows.scatter(value)))
        return out

    # -- decode -----------------------------------------------------------------------------------
    def can_decode(self) -> tuple[bool, str]:
        return True, ""

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None) -> DecodeRun:
        """The prefill, then ``steps`` tokens, one pass each, through llama.cpp's own KV cache."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        decoder = _Decoder(self, steps)

        def wrap(tensors: dict[CheckpointKey, np.ndarray], seconds: float) -> Capture:
            return Capture(tensors=tensors, backend=self.name, dtype=self.dtype, elapsed_s=seconds)

        return runner_decode(self.name, decoder, inputs, steps, keys, tokens, wrap)

    def release_session(self) -> None:
        """Free llama.cpp's context (the model stays loaded)."""
        if self.graph is not None:
            self.graph.close_context()


def _generic_limits(model: LoadedModel, gguf: GgufFile, precision: LlamaPrecision) -> list[str]:
    """What the generic tier's emulation cannot reproduce of llama.cpp's precision on ``model``
    (:func:`~.generic_precision.emulation_limits`, on the model built on the ``meta`` device)."""
    from ...modelio.generic import build_skeleton
    from .generic_precision import emulation_limits, generic_gguf_names

    net = build_skeleton(model.raw_config, meta=True, source=str(model.path))
    return emulation_limits(net, generic_gguf_names(model, gguf.architecture), precision)


def _not_in_graph(gguf: GgufFile) -> frozenset[str]:
    """The checkpoint names ``gguf``'s graph has no node of (:data:`NOT_IN_GRAPH`)."""
    rule = NOT_IN_GRAPH.get(gguf.architecture)
    return rule(gguf) if rule is not None else frozenset()


def _check_same_generic_model(gguf: GgufFile, model: LoadedModel) -> None:
    """DF002 where the generic-tier file is not the session's model (its ``model_type``, layers,
    width, vocabulary, heads, key/value heads or MLP width differ)."""
    from ...modelio.generic import hf_config_of
    from ...modelio.gguf_generic import GENERIC_GGUF_ARCHITECTURES

    family = GENERIC_GGUF_ARCHITECTURES[gguf.architecture].model_type
    hint = "give the file converted from --model-path"
    if family != model.config.model_type:
        raise BackendInitializationError(f"the GGUF {gguf.path} is not this model: a {gguf.architecture} file for a "
                                         f"{model.config.model_type} model", backend="llamacpp", hint=hint)
    embd = gguf.tensors.get("token_embd.weight")
    mine: dict[str, object] = {"num_hidden_layers": gguf.key("block_count"), "hidden_size": gguf.key("embedding_length"),
                               "vocab_size": embd.shape[0] if embd is not None else None}
    theirs: dict[str, object] = {key: getattr(model.config, key, None) for key in mine}
    hf = hf_config_of(model.raw_config, str(model.path))  # transformers' defaults filled in
    for key, attr in (("attention.head_count", "num_attention_heads"), ("attention.head_count_kv", "num_key_value_heads"),
                      ("feed_forward_length", "intermediate_size")):  # the attention's geometry, the MLP's width
        if gguf.key(key) is not None and getattr(hf, attr, None) is not None:
            mine[attr], theirs[attr] = gguf.key(key), getattr(hf, attr)
    for key, value in mine.items():
        if value != theirs[key]:
            raise BackendInitializationError(f"the GGUF {gguf.path} is not this model: {key} {value} where the "
                                             f"model has {theirs[key]}", backend="llamacpp", hint=hint)


def _fingerprint(hidden_in: HiddenState, inputs: ModelInputs) -> str:
    """A digest of a replay's input state and inputs (ids, mask, positions): equal digests, equal passes."""
    import hashlib

    from ...comparison import float64_array

    digest = hashlib.sha256(np.ascontiguousarray(float64_array(hidden_in)).tobytes())
    for part in (inputs.input_ids, inputs.attention_mask, inputs.position_ids()):
        if part is not None:
            digest.update(np.ascontiguousarray(np.asarray(part, np.int64)).tobytes())
    return digest.hexdigest()


def _occurrence(values: list[np.ndarray], which: str) -> np.ndarray | None:
    """The value of a node name computed more than once: the rotation (``rope``: the last 3-D one),
    the projection before it (``proj``: the last 2-D one), else the last."""
    if not values:
        return None
    if which == "rope":
        three = [v for v in values if v.ndim == 3]
        return three[-1] if three else None
    if which == "proj":
        two = [v for v in values if v.ndim == 2]
        return two[-1] if two else values[0]
    return values[-1]


class _Decoder:
    """The runner protocol of :func:`~debug_framework.backends.decode.runner_decode` over one
    llama.cpp context: the prefill, then one token per row per step (each row its own sequence).

    ``kv_cache()`` is what llama.cpp writes into its cache, read from the graph as it is written:
    each layer's rotated keys (``Kcur-i``, in Hugging Face's rotary order) and values (``Vcur-i``)
    of every pass so far, ``[batch, length, kv_heads, head_dim]``, in float32 as computed (the
    cache then stores them at its type; the cache cells themselves are not read back). Phi-3's are
    views of its fused q/k/v projection, read along their strides (``binding.ggml_tensor_array``)."""

    def __init__(self, backend: LlamaCppBackend, steps: int) -> None:
        self.backend, self.steps = backend, steps
        model = backend._prepared()
        self.layers = model.num_layers
        self.kv_heads = int(getattr(model.config, "num_key_value_heads", 0))
        self.head_dim = int(getattr(model.config, "head_dim", 0))
        if model.architecture == "generic" and backend.gguf is not None:  # the file's own heads
            key = backend.gguf.key
            heads = int(key("attention.head_count", 1) or 1)  # type: ignore[call-overload]
            self.kv_heads = int(key("attention.head_count_kv", heads) or heads)  # type: ignore[call-overload]
            self.head_dim = int(key("embedding_length", 0) or 0) // max(heads, 1)  # type: ignore[call-overload]
        self._kv: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {i: ([], []) for i in range(self.layers)}
        self._unread: set[int] = set()

    def _want(self, keys: list[CheckpointKey]) -> frozenset[str]:
        nodes = {f"{n}-{i}" for i in range(self.layers) for n in ("Kcur", "Vcur")}
        return frozenset({self.backend._node(k) for k in keys} | nodes)

    def _keep_kv(self, kept: Pass, rows: Rows) -> None:
        permuted = self.backend.gguf is not None and self.backend.gguf.architecture == "llama"
        for i, (ks, vs) in self._kv.items():
            k = _occurrence(kept.nodes.get(f"Kcur-{i}", []), "rope")
            v = _occurrence(kept.nodes.get(f"Vcur-{i}", []), "proj")
            if k is None or v is None or i in self._unread:
                # a pass without them (a node this build's graph does not name, or one not
                # readable as float32): the layer's cache is not read at all, never in part
                self._unread.add(i)
                ks.clear()
                vs.clear()
                continue
            k = _unpermute_heads(k, self.head_dim) if permuted else k
            ks.append(rows.scatter(k.reshape(k.shape[0], self.kv_heads, self.head_dim)))
            vs.append(rows.scatter(v.reshape(v.shape[0], self.kv_heads, self.head_dim)))

    def _tensors(self, kept: Pass, rows: Rows, keys: list[CheckpointKey]) -> dict[str, np.ndarray]:
        self._keep_kv(kept, rows)
        cap = self.backend._capture(kept, rows, keys, kept.seconds)
        return {f"{k.name}:{k.layer}" if k.layer is not None else k.name: v for k, v in cap.tensors.items()}

    def prefill(self, inputs: ModelInputs, keys: list[CheckpointKey]) -> dict[str, np.ndarray]:
        kept, rows = self.backend._feed(inputs, self._want(keys), steps=self.steps)
        return self._tensors(kept, rows, keys)

    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, keys: list[CheckpointKey]) -> dict[str, np.ndarray]:
        g = self.backend._graph()
        b = len(tokens)
        kept = g.decode(np.asarray(tokens), np.asarray(positions), np.arange(b), self._want(keys))
        rows = Rows(np.arange(b), np.zeros(b, np.int64), (b, 1))
        return self._tensors(kept, rows, keys)

    def kv_cache(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Every layer's keys and values written so far (see the class)."""
        return {i: (np.concatenate(ks, axis=1), np.concatenate(vs, axis=1))
                for i, (ks, vs) in self._kv.items() if ks}
