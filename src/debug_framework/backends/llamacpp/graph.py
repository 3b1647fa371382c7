"""One llama.cpp model and the passes the engine runs through it, every graph node seen through the
eval callback.

A pass (:meth:`LlamaGraph.decode`) feeds every real token of every row as its own sequence (padded
positions are not fed), asks for the logits of every token (so the last layer keeps every row), and
for the nodes asked for keeps a copy of each (``l_out-3``; a name computed twice, ``Qcur-0``, keeps
every occurrence, in order). A pass can also *replace* a node's value as soon as it is computed
(``embd`` or ``l_out-{i-1}``: layer ``i`` then runs on a given input; ``ffn_inp-i``: the MLP block
runs alone on a given post-attention state), which is how one layer or one block is replayed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BackendInitializationError, BackendRuntimeError
from .binding import (GGML_TYPES, LOG, Batch, EvalCallback, Library, ggml_tensor_array, ggml_tensor_name,
                      ggml_tensor_source, ggml_tensor_write, library)

__all__ = ["LlamaSettings", "LlamaGraph", "Pass", "Rows", "FLASH_ATTN", "UNNAMED_FFN_INP"]

#: llama.cpp architectures whose graph leaves the post-attention sum unnamed (Phi-3): ``ffn_inp-i``
#: is then the first source of the ``norm-i`` computed after ``kqv_out-i`` (the MLP's RMS norm), read
#: and replaced there, every unnamed node in between computed on its own so that it is there
UNNAMED_FFN_INP = frozenset({"phi3"})

#: ``flash_attn`` option -> ``llama_flash_attn_type``
FLASH_ATTN: dict[str, int] = {"auto": -1, "off": 0, "on": 1}


@dataclass(frozen=True)
class LlamaSettings:
    """llama.cpp's settings of a session (``--backend-option KEY=VALUE``), llama.cpp's defaults by default."""

    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    n_threads: int | None = None

    def check(self) -> LlamaSettings:
        """Self, or DF002 naming the bad option and the values it takes."""
        for key in ("cache_type_k", "cache_type_v"):
            if getattr(self, key) not in GGML_TYPES:
                raise BackendInitializationError(f"{key} {getattr(self, key)!r} is not a KV cache type",
                                                 hint="one of " + ", ".join(GGML_TYPES), backend="llamacpp")
        if self.flash_attn not in FLASH_ATTN:
            raise BackendInitializationError(f"flash_attn {self.flash_attn!r} is not on, off or auto",
                                             hint="--backend-option flash_attn=off", backend="llamacpp")
        if self.n_threads is not None and (not isinstance(self.n_threads, int) or self.n_threads < 1):
            raise BackendInitializationError(f"n_threads {self.n_threads!r} is not a positive integer",
                                             backend="llamacpp")
        return self


@dataclass(frozen=True)
class Rows:
    """Where each fed token comes from: the real positions of a ``[B, T]`` mask, in feeding order."""

    batch: np.ndarray  # row of each fed token
    time: np.ndarray  # column of each fed token
    shape: tuple[int, int]

    @classmethod
    def of(cls, mask: np.ndarray) -> Rows:
        b, t = np.nonzero(np.asarray(mask) != 0)
        return cls(b.astype(np.int64), t.astype(np.int64), (int(mask.shape[0]), int(mask.shape[1])))

    def scatter(self, flat: np.ndarray) -> np.ndarray:
        """``[tokens, ...]`` in feeding order -> ``[B, T, ...]`` (zeros where nothing was fed)."""
        out = np.zeros((*self.shape, *flat.shape[1:]), dtype=np.float32)
        out[self.batch, self.time] = flat
        return out

    def gather(self, full: np.ndarray) -> np.ndarray:
        """``[B, T, ...]`` -> ``[tokens, ...]`` in feeding order."""
        return np.asarray(full)[self.batch, self.time]


@dataclass
class Pass:
    """What one :meth:`LlamaGraph.decode` kept: node name -> every computed value of that name
    (``[tokens, ne0]`` for a 2-D node, ``[tokens, ne1, ne0]`` for a per-head one), and the logits."""

    nodes: dict[str, list[np.ndarray]] = field(default_factory=dict)
    logits: np.ndarray | None = None
    #: the nodes whose value was replaced
    replaced: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def last(self, name: str) -> np.ndarray:
        return self.nodes[name][-1]


def _rows_first(value: np.ndarray, tokens: int) -> np.ndarray | None:
    """A node's array ``[ne3, ne2, ne1, ne0]`` with its token axis first: ``[tokens, ne1, ne0]`` for a
    per-head node (tokens on ne2), ``[tokens, ne0]`` for a 2-D one (tokens on ne1); None where no axis
    is the token count. One token: a node with more than one row on ne1 is per-head (a 2-D node of
    one token has one row)."""
    if value.ndim != 4 or value.shape[0] != 1:
        return None
    _, ne2, ne1, ne0 = value.shape
    if ne2 == tokens and (ne2 > 1 or ne1 != tokens):  # [T, H, E]
        return value.reshape(ne2, ne1, ne0)
    if ne2 == 1 and ne1 == tokens:  # [T, D]
        return value.reshape(ne1, ne0)
    return None


class LlamaGraph:
    """A GGUF loaded in llama.cpp, and passes through it (one context per :meth:`open_context`)."""

    def __init__(self, path: Path, settings: LlamaSettings, architecture: str = "") -> None:
        self.lib: Library = library()
        self.derives_ffn_inp = architecture in UNNAMED_FFN_INP
        self.path, self.settings = path, settings.check()
        params = self.lib.model_params()
        LOG.clear()
        self.model = self.lib.so.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise BackendInitializationError(f"llama.cpp cannot load {path}: {_log_tail()}", backend="llamacpp",
                                             hint="check the file with --model-path FILE.gguf (our reader says what is wrong)")
        self.n_vocab = int(self.lib.so.llama_vocab_n_tokens(self.lib.so.llama_model_get_vocab(self.model)))
        self.n_embd = int(self.lib.so.llama_model_n_embd(self.model))
        self.ctx: int | None = None
        self._callback = EvalCallback(self._on_node)
        self._want: frozenset[str] = frozenset()
        self._replace: Mapping[str, np.ndarray] = {}
        self._kept: Pass | None = None
        self._stop: str | None = None
        self._tokens = 0
        self._error: BaseException | None = None
        self._window: str | None = None  # the layer whose kqv_out was seen and whose MLP norm was not
        self._stop_pending = False

    # -- contexts ---------------------------------------------------------------------------------
    def open_context(self, sequences: int, cells: int, batch: int, *, observed: bool = True) -> None:
        """A fresh context for ``sequences`` rows, ``cells`` cached positions and ``batch`` tokens per
        pass; ``observed`` False: without the eval callback (llama.cpp's own speed, nothing kept)."""
        self.close_context()
        cp = self.lib.context_params()
        cp.n_ctx = max(256, -(-cells // 256) * 256)
        cp.n_batch = cp.n_ubatch = max(batch, 1)
        cp.n_seq_max = max(sequences, 1)
        cp.kv_unified = True  # tokens keep the batch's order (one sequence per row)
        if observed:
            cp.cb_eval = self._callback
        cp.type_k, cp.type_v = GGML_TYPES[self.settings.cache_type_k], GGML_TYPES[self.settings.cache_type_v]
        cp.flash_attn_type = FLASH_ATTN[self.settings.flash_attn]
        if self.settings.n_threads is not None:
            cp.n_threads = cp.n_threads_batch = self.settings.n_threads
        LOG.clear()
        ctx = self.lib.so.llama_init_from_model(self.model, cp)
        if not ctx:
            raise BackendInitializationError(f"llama.cpp cannot create a context for {self.path}: {_log_tail()}",
                                             backend="llamacpp",
                                             hint="check cache_type_k/v and flash_attn (a quantized V cache needs "
                                                  "flash_attn=on, a quantized cache a head size its block divides)")
        self.ctx = ctx

    def close_context(self) -> None:
        if self.ctx:
            self.lib.so.llama_free(self.ctx)
        self.ctx = None

    def close(self) -> None:
        """Free the context and the model."""
        self.close_context()
        if self.model:
            self.lib.so.llama_model_free(self.model)
        self.model = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:
            pass

    # -- the eval callback ------------------------------------------------------------------------
    def _on_node(self, t: int, ask: bool, user: int) -> bool:
        try:
            name = ggml_tensor_name(self.lib, t)
            if self.derives_ffn_inp:
                derived = self._derived_ffn_inp(t, name, ask)
                if derived is not None:
                    return derived
            if ask:
                return name in self._want or name in self._replace
            self._at_node(t, name)
            return name != self._stop and not self._stop_pending  # False: llama.cpp computes nothing after
        except BaseException as exc:  # noqa: BLE001 - never unwinds through C: re-raised after the pass
            self._error = exc
            return False

    def _at_node(self, t: int, name: str) -> None:
        """A computed node ``t`` under ``name``: replaced where asked, kept where wanted."""
        if name in self._replace:
            if not ggml_tensor_write(self.lib, t, self._replace[name]):
                raise BackendRuntimeError(f"cannot replace llama.cpp node {name!r} with the given values",
                                          backend="llamacpp", call="run_layer()")
            if self._kept is not None:
                self._kept.replaced.append(name)
        if name in self._want and self._kept is not None:
            value = ggml_tensor_array(self.lib, t)
            if value is not None:
                rows = _rows_first(np.asarray(value), self._tokens)
                if rows is not None:
                    self._kept.nodes.setdefault(name, []).append(rows.copy())

    def _derived_ffn_inp(self, t: int, name: str, ask: bool) -> bool | None:
        """``ffn_inp-i`` of a graph that leaves it unnamed (:data:`UNNAMED_FFN_INP`): the first source of
        the ``norm-i`` after ``kqv_out-i``, read (and replaced) when that norm is asked for, before it is
        computed. What to answer llama.cpp, or None: the node is not part of it."""
        if not ask:
            return None
        if name.startswith("kqv_out-"):
            self._window = name[len("kqv_out-"):]
            return None
        if self._window is None:
            return None
        alias = f"ffn_inp-{self._window}"
        asked = alias in self._want or alias in self._replace or alias == self._stop
        if name.startswith("node_"):
            return True if asked else None  # computed on its own: its value is there when the norm is asked
        if name != f"norm-{self._window}":
            return None
        self._window = None
        if not asked:
            return None
        source = ggml_tensor_source(self.lib, t, 0)
        if source is None:
            raise BackendRuntimeError(f"cannot find the input of llama.cpp node {name!r} ({alias})",
                                      backend="llamacpp", call="llama_decode",
                                      hint="this llama.cpp build's ggml_tensor layout is not the pinned one")
        self._at_node(source, alias)
        self._stop_pending = alias == self._stop
        return True

    # -- a pass -----------------------------------------------------------------------------------
    def decode(self, tokens: np.ndarray, positions: np.ndarray, sequences: np.ndarray, want: frozenset[str],
               replace: Mapping[str, np.ndarray] | None = None, *, stop_after: str | None = None) -> Pass:
        """Feed ``tokens`` (at ``positions``, each in sequence ``sequences[k]``) in one pass; keep the
        nodes in ``want`` and every token's logits; replace the nodes of ``replace`` (``[tokens, D]``).
        ``stop_after``: a node computed once (``l_out-3``) after which llama.cpp stops the pass (a
        replay needs nothing later; the logits are then not kept)."""
        import time

        if not self.ctx:
            raise BackendRuntimeError("no llama.cpp context is open", backend="llamacpp", call="decode")
        n = int(len(tokens))
        tok = (ctypes.c_int32 * n)(*[int(x) for x in tokens])
        pos = (ctypes.c_int32 * n)(*[int(x) for x in positions])
        n_seq = (ctypes.c_int32 * n)(*([1] * n))
        seq_cells = [(ctypes.c_int32 * 1)(int(s)) for s in sequences]
        seq = (ctypes.POINTER(ctypes.c_int32) * n)(*[ctypes.cast(c, ctypes.POINTER(ctypes.c_int32)) for c in seq_cells])
        outputs = (ctypes.c_int8 * n)(*([1] * n))
        batch = Batch(n, tok, None, pos, n_seq, seq, outputs)
        self._want, self._replace, self._tokens, self._stop = want, dict(replace or {}), n, stop_after
        self._kept, self._error, self._window, self._stop_pending = Pass(), None, None, False
        start = time.perf_counter()
        try:
            code = self.lib.so.llama_decode(self.ctx, batch)
        finally:
            kept, self._kept, self._want, self._replace, self._stop = self._kept, None, frozenset(), {}, None
        kept.seconds = time.perf_counter() - start
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if code != 0:
            raise BackendRuntimeError(f"llama_decode returned {code}: {_log_tail()}", backend="llamacpp",
                                      call="llama_decode")
        missing = sorted(set(_names(replace)) - set(kept.replaced))
        if missing:
            raise BackendRuntimeError(f"llama.cpp's graph has no node {', '.join(missing)} to replace",
                                      backend="llamacpp", call="llama_decode",
                                      hint="this architecture's graph does not name the node a replay needs")
        if stop_after is None:
            logits = self.lib.so.llama_get_logits(self.ctx)
            kept.logits = np.ctypeslib.as_array(logits, shape=(n, self.n_vocab)).copy()
        elif stop_after not in kept.nodes:
            raise BackendRuntimeError(f"llama.cpp's graph has no node {stop_after!r}", backend="llamacpp",
                                      call="llama_decode")
        return kept


def _names(replace: Mapping[str, np.ndarray] | None) -> list[str]:
    return list(replace or {})


def _log_tail(lines: int = 6) -> str:
    """The last lines llama.cpp logged (its own words on what failed)."""
    text = "".join(list(LOG)[-40:]).strip().splitlines()
    return " | ".join(text[-lines:]) or "(llama.cpp logged nothing)"
