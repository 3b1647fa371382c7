"""Decode steps: a prefill, then one token at a time through the model's own KV cache.

A backend that can decode implements :class:`DecodeBackend.run_decode`: the prefill pass over the
session's inputs, then ``steps`` single-token passes, each token appended to every row (after its
padding, as an engine appends to its own sequence) and placed at the row's next position. The tokens
are the caller's (``tokens``, teacher forcing: both sides of a comparison see the same sequence) or,
where none are given, the backend's own greedy choice (the argmax of its logits at the row's last
token). Each pass's checkpoints come back as one :class:`Capture`, the KV cache after it (per layer,
``[batch, length, kv_heads, head_dim]`` so the comparison core can leave padded positions out) in
:attr:`DecodeRun.kv_cache`: whole after the prefill, on the sampled audits (:func:`kv_audited`:
every :data:`KV_AUDIT_EVERY`-th step, further apart as the cache grows) and after the last step, and where a layer's cache did not grow by exactly one position (the engine
rewrote it: a sliding window's eviction, a paged cache's move); on any other step only each layer's
new entries (its last :data:`KV_TAIL` positions), so what a step keeps and compares does not grow with the steps
taken (:class:`KVRecorder`; :meth:`DecodeRun.cache_at` rebuilds a whole cache).

:func:`module_decode` drives any ``transformers``-style ``nn.Module`` (``past_key_values``,
``use_cache``): the ``pytorch`` and ``float64_eager`` backends and module backends decode through
it. :func:`runner_decode` drives a user engine (``user_backend``) through its runner's ``prefill``,
``decode_step`` and optional ``kv_cache``; the references written from the math
(``python_reference``, ``torch_reference``) decode through it too, their model wrapped in a
:class:`ReferenceDecoder` (its own :class:`~debug_framework.architectures.kv_cache.KVCache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ContextManager, Protocol, runtime_checkable

import numpy as np

from ..capture.keys import Capture, CheckpointKey
from ..errors import BackendInitializationError, BackendRuntimeError, ConfigurationError
from ..modelio.inputs import ModelInputs

if TYPE_CHECKING:
    import torch

    from ..architectures.walk import Model
    from ..architectures.xp import Array
    from ._decode_draft import TokenFeed
    from .base import Tensor

#: One layer's cached ``(keys, values)``, each ``[batch, length, kv_heads, head_dim]``.
LayerKV = tuple["Tensor | Array", "Tensor | Array"]

__all__ = ["DecodeRun", "DecodePass", "DecodeBackend", "collect_run", "decode_passes", "iter_module_decode",
           "iter_runner_decode", "greedy_choice", "KVRecorder", "KV_AUDIT_EVERY", "CHUNK_STEPS", "DECODE_HOLD_BYTES", "hold_weights", "KV_TAIL", "concat_positions", "streams_decode", "kv_audited", "decode_support", "module_decode", "runner_decode", "decode_positions",
           "last_token_index", "ReferenceDecoder", "reference_can_decode", "reference_decode", "reference_decode_layer"]


@dataclass
class DecodeRun:
    """What one decode produced.

    Attributes:
        captures: one per pass: ``captures[0]`` the prefill, ``captures[s]`` decode step ``s``.
        tokens: ``[batch, steps]`` int64, the token fed at each decode step.
        kv_cache: per pass, ``{layer: (keys, values)}`` each ``[batch, length, kv_heads, head_dim]``
            (empty where the backend does not expose its cache): the whole cache where
            ``kv_span[s][layer]`` is not ``"new"``, else only the pass's new entries (its last
            :data:`KV_TAIL` positions: the new token's and the one before, where an off-by-one write lands).
        attention_masks: per pass, the mask ``[batch, length]`` over the cached positions.
        kv_span: per pass, per layer, what ``kv_cache`` kept: ``"prefill"``, ``"audit"`` (a sampled
            step, the last one included), ``"rewrite"`` (the cache did not grow by exactly one
            position) -- the whole cache -- or ``"new"`` (the new entries only). Empty: every pass whole.
    """

    captures: list[Capture]
    tokens: np.ndarray
    kv_cache: list[dict[int, LayerKV]] = field(default_factory=list)
    attention_masks: list[np.ndarray] = field(default_factory=list)
    kv_span: list[dict[int, str]] = field(default_factory=list)

    def cache_at(self, step: int) -> dict[int, LayerKV]:
        """Every layer's whole cache after pass ``step`` (0: the prefill): the last whole one kept at
        or before it, the new entries of the passes after it appended. Empty where none was kept."""
        if step >= len(self.kv_cache):
            return {}
        out: dict[int, LayerKV] = {}
        for layer in self.kv_cache[step]:
            start = step
            while start > 0 and self.span(start, layer) == "new":
                start -= 1
            parts = [self.kv_cache[t][layer] if t == start else _last(self.kv_cache[t][layer])
                     for t in range(start, step + 1) if layer in self.kv_cache[t]]
            out[layer] = (concat_positions([p[0] for p in parts]), concat_positions([p[1] for p in parts]))
        return out

    def span(self, step: int, layer: int) -> str:
        """What pass ``step`` kept of ``layer``'s cache (:attr:`kv_span`; ``"audit"`` where not recorded)."""
        return self.kv_span[step].get(layer, "audit") if step < len(self.kv_span) else "audit"


#: the decode keeps (and the decode stage compares) every layer's whole cache after every this
#: many steps (further apart from step 512: :func:`kv_audited`), and after the last; between them,
#: each step's new entries only
KV_AUDIT_EVERY = 64
#: the most bytes of converted weights a streamed reference keeps for a whole decode (its layers,
#: then its tables): Llama 3.2 1B is 9.9 GB in float64 (its 16 layers 7.7 GB), the 'small' model 33 MB
DECODE_HOLD_BYTES = 2 * 2**30
#: the most decode steps a greedy reference computes in one pass (:mod:`._decode_draft`)
CHUNK_STEPS = 8
#: the positions a step keeps as its "new entries": the new token's and the one before it, where a
#: write off by one lands
KV_TAIL = 2


def kv_audited(step: int, steps: int) -> bool:
    """Whether decode ``step`` (>= 1) of ``steps`` is a sampled audit of the whole cache: every
    :data:`KV_AUDIT_EVERY`-th step up to step 511, then every step that is a multiple of a quarter
    of the largest power of two not above it (every 128th from 512, every 256th from 1024, ...),
    and the last. An audit reads every position, so with the spacing growing as the cache does,
    what the audits cost a step stays the same however long the decode (at most eight positions'
    worth a step)."""
    if step == steps:
        return True
    every = max(KV_AUDIT_EVERY, (1 << (max(step, 1).bit_length() - 1)) // 4)
    return step % every == 0


def concat_positions(parts: list[Tensor | Array]) -> Tensor | Array:
    """Tensors ``[batch, length, ...]`` joined along ``length`` (torch or NumPy-like)."""
    if len(parts) == 1:
        return parts[0]
    if hasattr(parts[0], "detach"):
        import torch

        return torch.cat(list(parts), dim=1)  # type: ignore[arg-type]
    return np.concatenate([np.asarray(p) for p in parts], axis=1)


def _last(kv: LayerKV) -> LayerKV:
    """A step's new entries cut to its own position (the last)."""
    return kv[0][:, -1:], kv[1][:, -1:]


def _own_tail(t: Tensor | Array) -> Tensor | Array:
    """The last :data:`KV_TAIL` positions of ``t`` ``[batch, length, ...]``, copied (no view of the whole)."""
    tail = t[:, -KV_TAIL:]
    if hasattr(tail, "clone"):
        return tail.clone()
    return tail.copy() if hasattr(tail, "copy") else np.array(tail)


class KVRecorder:
    """Builds :attr:`DecodeRun.kv_cache` and :attr:`DecodeRun.kv_span` pass by pass: the whole cache
    after the prefill, on audited steps (:func:`kv_audited`) and for a layer whose cache did not grow
    by exactly one position since the pass before; each other layer's last :data:`KV_TAIL` positions."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.kv: list[dict[int, LayerKV]] = []
        self.spans: list[dict[int, str]] = []
        self._lengths: dict[int, int] = {}
        self._passes = 0  #: the passes asked about so far (0: the next is the prefill)

    def spans_for(self, lengths: dict[int, int]) -> dict[int, str]:
        """What the next pass keeps of each layer, given each layer's cached length after it."""
        step, self._passes = self._passes, self._passes + 1
        if step == 0:
            spans = {i: "prefill" for i in lengths}
        elif kv_audited(step, self.steps):
            spans = {i: "audit" for i in lengths}
        else:
            spans = {i: "new" if self._lengths.get(i, -2) + 1 == n else "rewrite" for i, n in lengths.items()}
        self._lengths = dict(lengths)
        return spans

    @staticmethod
    def cut(whole: dict[int, LayerKV], spans: dict[int, str]) -> dict[int, LayerKV]:
        """What one pass keeps of ``whole`` (every layer's cache): a layer kept new only cut to its
        last :data:`KV_TAIL` positions (copied), the others as given."""
        return {i: kv if spans.get(i) != "new" else (_own_tail(kv[0]), _own_tail(kv[1])) for i, kv in whole.items()}

    def add(self, whole: dict[int, LayerKV], spans: dict[int, str]) -> None:
        """Keep one pass: ``whole`` every layer's cache (the new layers cut to their last position)."""
        self.kv.append(self.cut(whole, spans))
        self.spans.append(spans)


@runtime_checkable
class DecodeBackend(Protocol):
    """A backend that decodes (``prefill`` then ``decode_step`` for a user engine: docs/validation.md)."""

    name: str

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Sequence[CheckpointKey],
                   tokens: np.ndarray | None = None) -> DecodeRun:
        ...


def decode_support(backend: object) -> tuple[bool, str]:
    """Whether a prepared backend can decode; ``(False, why)`` when it cannot: its
    :func:`~.capabilities.capabilities`' ``decode``."""
    from .capabilities import capabilities

    return tuple(capabilities(backend).decode)  # type: ignore[return-value]


def last_token_index(mask: np.ndarray) -> np.ndarray:
    """Per row, the index of its last token (the last non-zero of its mask)."""
    length = mask.shape[1]
    return (length - 1 - np.argmax(mask[:, ::-1] != 0, axis=1)).astype(np.int64)


def decode_positions(mask: np.ndarray, offset: int) -> np.ndarray:
    """``[batch, 1]``: the position of the next token of each row, ``offset`` + its tokens so far."""
    return (offset + (mask != 0).sum(axis=1, keepdims=True)).astype(np.int64)


def _cache_of(out: object) -> object:
    """The cache a ``transformers`` output returns (``cache``, formerly ``past_key_values``)."""
    for name in ("cache", "past_key_values"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return None


def greedy_choice(logits: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``[batch]``: each row's greedy choice after a pass, as a greedy decode chooses it: its logits
    ``[batch, positions, vocab]`` at the row's position ``last[row]``, compared in float32."""
    import torch

    with torch.inference_mode():
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, last.to(logits.device)].float().argmax(-1)


def _choice_meta(logits: torch.Tensor | None, last: torch.Tensor) -> list[int] | None:
    """:func:`greedy_choice` as ``Capture.meta["choice"]`` (one int per row); None without logits."""
    return None if logits is None else [int(t) for t in greedy_choice(logits, last).cpu()]


def _cache_layers(cache: object) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (keys, values)}`` of a ``transformers`` cache as it holds them, ``[batch, heads, length, dim]``."""
    layers = getattr(cache, "layers", None)
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    if layers is not None:
        for i, layer in enumerate(layers):
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if k is not None and v is not None and hasattr(k, "transpose"):
                out[i] = (k, v)
    elif getattr(cache, "key_cache", None) is not None:
        out = dict(enumerate(zip(cache.key_cache, cache.value_cache)))
    return out


def _kept_kv(cache: object, recorder: KVRecorder, length: int | None = None
             ) -> tuple[dict[int, LayerKV], dict[int, str]]:
    """What one pass keeps of a ``transformers`` cache, ``[batch, length, heads, dim]``, and its
    spans: a layer kept whole is copied whole, one kept new only (its last positions) is copied
    alone. ``length``: the cache as it was after a step whose pass went further (its first
    ``length`` positions; a plain cache, :mod:`._decode_draft`)."""
    held = _cache_layers(cache)
    if length is not None:
        held = {i: (k[:, :, :length], v[:, :, :length]) for i, (k, v) in held.items()}
    spans = recorder.spans_for({i: int(k.shape[2]) for i, (k, _) in held.items()})

    def own(t: torch.Tensor, whole: bool) -> torch.Tensor:
        return (t if whole else t[:, :, -KV_TAIL:]).detach().transpose(1, 2).clone()
    return {i: (own(k, spans[i] != "new"), own(v, spans[i] != "new")) for i, (k, v) in held.items()}, spans


@dataclass
class DecodePass:
    """One pass of a decode as it is produced (:func:`iter_module_decode`, :func:`iter_runner_decode`).

    Attributes:
        step: 0 for the prefill, ``s`` for decode step ``s``.
        capture: the pass's checkpoints.
        kv: what the pass keeps of each layer's cache (:class:`KVRecorder`), ``span`` says what.
        span: per layer, ``"prefill"``, ``"audit"``, ``"rewrite"`` or ``"new"`` (:attr:`DecodeRun.kv_span`).
        mask: the attention mask ``[batch, length]`` over the cached positions after the pass.
        token: ``[batch]`` int64, the token fed at this step (None for the prefill).
    """

    step: int
    capture: Capture
    kv: dict[int, LayerKV]
    span: dict[int, str]
    mask: np.ndarray
    token: np.ndarray | None = None


def collect_run(passes: Iterator[DecodePass], steps: int) -> DecodeRun:
    """Every pass of a streamed decode kept, as one :class:`DecodeRun` (what ``run_decode`` returns)."""
    run = DecodeRun([], np.zeros((0, steps), np.int64))
    chosen: list[np.ndarray] = []
    for p in passes:
        run.captures.append(p.capture)
        run.kv_cache.append(p.kv)
        run.kv_span.append(p.span)
        run.attention_masks.append(p.mask)
        if p.token is not None:
            chosen.append(np.asarray(p.token, np.int64))
    batch = run.attention_masks[0].shape[0] if run.attention_masks else 0
    run.tokens = np.stack(chosen, axis=1) if chosen else np.zeros((batch, 0), np.int64)
    return run


def module_decode(backend_name: str, module: torch.nn.Module, kwargs: dict[str, torch.Tensor],
                  capture: Callable[[], ContextManager[object]],
                  inputs: ModelInputs, steps: int, tokens: np.ndarray | None, dtype: str,
                  wrap: Callable[[dict[CheckpointKey, Tensor], float], Capture]) -> DecodeRun:
    """Decode ``steps`` tokens through ``module``'s own cache (``past_key_values``), every pass kept
    (:func:`iter_module_decode`, collected).

    Raises:
        ConfigurationError: (DF005) no tokens given and the module returns no logits to choose from.
        BackendRuntimeError: (DF005) the module keeps no cache (``past_key_values``).
    """
    return collect_run(iter_module_decode(backend_name, module, kwargs, capture, inputs, steps, tokens, wrap), steps)


def iter_module_decode(backend_name: str, module: torch.nn.Module, kwargs: dict[str, torch.Tensor],
                       capture: Callable[[], ContextManager[object]],
                       inputs: ModelInputs, steps: int, tokens: np.ndarray | TokenFeed | None,
                       wrap: Callable[[dict[CheckpointKey, Tensor], float], Capture],
                       prefill_capture: Callable[[], ContextManager[object]] | None = None,
                       context: Callable[[], ContextManager[object]] | None = None,
                       draft: Callable[[], torch.nn.Module | None] | None = None) -> Iterator[DecodePass]:
    """Decode ``steps`` tokens through ``module``'s own cache (``past_key_values``), one
    :class:`DecodePass` yielded as each pass is done (nothing kept here between passes).

    ``kwargs`` are the prefill's forward arguments (``inputs.torch()`` on the module's device);
    ``capture()`` opens a fresh hook capture (a context manager with ``run`` and ``tensors``) for a
    decode step, ``prefill_capture()`` for the prefill (default ``capture``); ``wrap(tensors,
    seconds)`` turns a pass's checkpoints into a :class:`Capture`. ``tokens[:, s]`` is read only when
    step ``s + 1`` runs, so a caller streaming several backends may fill it as it goes. Each pass
    runs under ``torch.inference_mode()`` and ``context()`` (entered and left within the pass, never
    across a yield: several decodes may be interleaved).

    ``draft()``: a greedy decode may compute up to :data:`CHUNK_STEPS` steps in one pass, the
    tokens after the first proposed by the module ``draft()`` returns (a cheaper copy; None: a step
    a pass), each step's tensors and tokens the module's own (:mod:`._decode_draft`); its passes'
    ``Capture.meta["chunk"]`` is ``[first step, steps kept, steps computed]``. ``tokens`` may be a
    :class:`~._decode_draft.TokenFeed` (another process chooses them): as many as it knows, up to
    :data:`CHUNK_STEPS`, are fed in one pass (a plain cache), and every pass records the tokens the
    module's own greedy choice would feed next, ``Capture.meta["choice"]`` (one per row).

    Raises:
        ConfigurationError: (DF005) no tokens given and the module returns no logits to choose from.
        BackendRuntimeError: (DF005) the module keeps no cache (``past_key_values``).
    """
    import inspect
    import time

    import torch

    from ._decode_draft import GreedyDraft, TokenFeed, accepted, cache_length, crop_cache, fed_column, plain_cache

    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        params = {}
    cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x names it cache
    device = kwargs["input_ids"].device
    mask = kwargs["attention_mask"]
    offset = int(inputs.meta.get("position_offset", 0) or 0)
    kv = KVRecorder(steps)

    def forward(open_capture: Callable[[], ContextManager[object]], kw: dict[str, object]
                ) -> tuple[object, dict[CheckpointKey, Tensor], float]:
        with torch.inference_mode(), (context or contextlib.nullcontext)():
            start = time.perf_counter()
            with open_capture() as cap:
                out = cap.run(module, **kw)  # type: ignore[attr-defined]
            return out, dict(cap.tensors), time.perf_counter() - start  # type: ignore[attr-defined]

    out, got, seconds = forward(prefill_capture or capture, {**kwargs, "use_cache": True})
    cache = _cache_of(out)
    if cache is None:
        raise BackendRuntimeError("the module returned no past_key_values, so it cannot decode through its cache",
                                  backend=backend_name, call="run_decode()",
                                  hint="give the module a cache (use_cache=True), or decode with prefill/decode_step")
    mask_np = mask.detach().cpu().numpy().astype(np.int64)
    with torch.inference_mode():
        kept = _kept_kv(cache, kv)
    logits = getattr(out, "logits", None)
    last = torch.from_numpy(last_token_index(mask_np)).to(device)
    feeder = tokens if isinstance(tokens, TokenFeed) else None  # the tokens as another side chooses them
    first = wrap(got, seconds)
    if feeder is not None:
        first.meta["choice"] = _choice_meta(logits, last)
    yield DecodePass(0, first, *kept, mask_np)
    feeds_several = feeder is not None and plain_cache(cache)
    drafter: GreedyDraft | None = None
    if draft is not None and tokens is None and logits is not None and steps > 1 and plain_cache(cache):
        copy = draft()
        if copy is not None:
            # its cache not a plain one, or its prefill failing: a step a pass (the draft only ever saves time)
            with contextlib.suppress(RuntimeError, ValueError, TypeError, IndexError):
                drafter = GreedyDraft(copy, kwargs, cache_arg, offset)
            del copy  # held by the draft alone: gone with it
    fed_so_far: list[np.ndarray] = []  # every token fed after the prefill (the draft catches up with them)
    s = 0
    while s < steps:
        known = feeder.known(s, min(CHUNK_STEPS, steps - s) if feeds_several else 1) if feeder is not None else None
        if known is not None:
            tok = torch.as_tensor(np.asarray(known[:, 0]), dtype=torch.long, device=device)
        elif tokens is not None:
            tok = torch.as_tensor(fed_column(tokens, s), dtype=torch.long, device=device)
        elif logits is not None:
            tok = greedy_choice(logits, last)
        else:
            raise ConfigurationError("the model returns no logits, so the decode tokens cannot be chosen",
                                     backend=backend_name, hint="give them: --decode-tokens (config decode_tokens)")
        fed = tok.cpu().numpy().astype(np.int64)
        n = min(CHUNK_STEPS, steps - s) if drafter is not None else known.shape[1] if known is not None else 1
        if n > 1:
            start = time.perf_counter()
            if known is not None:  # fed: every token kept
                feed = np.asarray(known, np.int64)
            else:
                try:
                    proposed = drafter.propose([*fed_so_far, fed], n - 1)  # type: ignore[union-attr]
                except (RuntimeError, ValueError, TypeError, IndexError):  # the draft fails: a step a pass from here
                    drafter = None
                    continue
                feed = np.concatenate([fed[:, None], proposed], axis=1)
            before = cache_length(cache)
            wide = np.concatenate([mask_np, np.ones((mask_np.shape[0], n), np.int64)], axis=1)
            positions = decode_positions(mask_np, offset) + np.arange(n)
            out, got, seconds = forward(capture, {"input_ids": torch.from_numpy(feed).to(device),
                                                  "attention_mask": torch.from_numpy(wide).to(device),
                                                  "position_ids": torch.from_numpy(positions).to(device),
                                                  cache_arg: cache, "use_cache": True})
            wider = getattr(out, "logits", None)
            cuts = all(t.dim() >= 2 and t.shape[0] == feed.shape[0] and t.shape[1] == n for t in got.values())
            if wider is None or wider.dim() != 3 or wider.shape[1] != n or not cuts or _cache_of(out) is not cache \
                    or cache_length(cache) != before + n:
                # a checkpoint that is not [batch, tokens, ...]: the pass dropped, a step a pass from here
                crop_cache(cache, cache_length(cache) - before)
                drafter, feeds_several = None, False
                continue
            choice = wider.float().argmax(-1).cpu().numpy()
            m = n if known is not None else accepted(feed, choice)
            crop_cache(cache, n - m)
            seconds = (time.perf_counter() - start) / m  # the draft's proposals and the pass, per step kept
            made: list[DecodePass] = []
            with torch.inference_mode():  # left before any yield, as every pass's
                for j in range(m):
                    kept = _kept_kv(cache, kv, before + j + 1)
                    cap = wrap({k: t[:, j:j + 1].clone() for k, t in got.items()}, seconds)
                    cap.meta["chunk"] = [s + 1, m, n]
                    if feeder is not None:
                        cap.meta["choice"] = choice[:, j].tolist()
                    made.append(DecodePass(s + j + 1, cap, *kept, wide[:, :mask_np.shape[1] + j + 1].copy(),
                                           feed[:, j].copy()))
            del got
            yield from made
            fed_so_far.extend(feed[:, j].copy() for j in range(m))
            mask_np = wide[:, :mask_np.shape[1] + m].copy()
            logits, last = wider[:, m - 1:m], torch.zeros(mask_np.shape[0], dtype=torch.long, device=device)
            s += m
            continue
        positions = torch.from_numpy(decode_positions(mask_np, offset)).to(device)
        mask_np = np.concatenate([mask_np, np.ones((mask_np.shape[0], 1), np.int64)], axis=1)
        out, got, seconds = forward(capture, {"input_ids": tok[:, None], "attention_mask": torch.from_numpy(mask_np).to(device),
                                              "position_ids": positions, cache_arg: cache, "use_cache": True})
        cache = _cache_of(out)
        logits = getattr(out, "logits", None)
        with torch.inference_mode():
            kept = _kept_kv(cache, kv)
        last = torch.full((mask_np.shape[0],), logits.shape[1] - 1 if logits is not None else 0, device=device)
        cap = wrap(got, seconds)
        if feeder is not None:
            cap.meta["choice"] = _choice_meta(logits, last)
        yield DecodePass(s + 1, cap, *kept, mask_np, fed)
        fed_so_far.append(fed)
        s += 1


def runner_decode(backend_name: str, runner: object, inputs: ModelInputs, steps: int, keys: Sequence[CheckpointKey],
                  tokens: np.ndarray | None, wrap: Callable[[dict[CheckpointKey, Tensor], float], Capture]) -> DecodeRun:
    """Decode through a user engine's runner, every pass kept (:func:`iter_runner_decode`, collected).

    Raises:
        ConfigurationError: (DF005) no tokens given and the runner returns no ``post_processing`` logits.
        BackendRuntimeError: (DF005) a call that does not return a mapping of checkpoints.
    """
    return collect_run(iter_runner_decode(backend_name, runner, inputs, steps, keys, tokens, wrap), steps)


def iter_runner_decode(backend_name: str, runner: object, inputs: ModelInputs, steps: int,
                       keys: Sequence[CheckpointKey], tokens: np.ndarray | TokenFeed | None,
                       wrap: Callable[[dict[CheckpointKey, Tensor], float], Capture],
                       prefill_keys: Sequence[CheckpointKey] | None = None,
                       context: Callable[[], ContextManager[object]] | None = None) -> Iterator[DecodePass]:
    """Decode through a user engine's runner (the engine protocol, docs/validation.md "Decode steps"),
    one :class:`DecodePass` yielded as each pass is done:

    * ``runner.prefill(inputs, keys) -> {checkpoint: tensor}``: the prompt, tensors ``[batch, length, ...]``
      (what it writes at padded positions is not judged); asked for ``prefill_keys`` (default ``keys``);
    * ``runner.decode_step(tokens, positions, keys) -> {checkpoint: tensor}``: one token per row
      (``tokens`` and ``positions`` int64 ``[batch]``), tensors ``[batch, 1, ...]``;
    * optional ``runner.kv_cache() -> {layer: (keys, values)}``, each ``[batch, length, kv_heads,
      head_dim]`` over every position so far (padded ones included, as zeros or anything);
    * optional ``runner.decode_steps(tokens, positions, keys) -> {checkpoint: tensor}``: several
      tokens per row in one pass (``[batch, n]``, each attending over the cache and the tokens
      before it), tensors ``[batch, n, ...]`` (or the tokens flattened, ``[batch x n, ...]``): where
      ``tokens`` is a :class:`~._decode_draft.TokenFeed`, as many as it knows (up to
      :data:`CHUNK_STEPS`) are fed in one such pass, one :class:`DecodePass` a step
      (``Capture.meta["chunk"]``); the references written from the math offer it.

    Without ``tokens`` the runner's ``post_processing`` logits choose them (greedy); ``tokens[:, s]``
    is read only when step ``s + 1`` runs (a :class:`~._decode_draft.TokenFeed` waited for then, each
    pass recording the runner's own greedy choice after it, ``Capture.meta["choice"]``). Each call
    into the runner runs under ``context()`` (entered and left within the pass, never across a
    ``yield``).

    Raises:
        ConfigurationError: (DF005) no tokens given and the runner returns no ``post_processing`` logits.
        BackendRuntimeError: (DF005) a call that does not return a mapping of checkpoints.
    """
    import time

    within = context or contextlib.nullcontext

    def call(what: str, fn: Callable[[], object]) -> tuple[dict[CheckpointKey, Tensor], float]:
        with within():
            start = time.perf_counter()
            produced = fn()
            seconds = time.perf_counter() - start
        if not isinstance(produced, dict):
            raise BackendRuntimeError(f"{what} returned {type(produced).__name__}, not a mapping of checkpoints",
                                      backend=backend_name, call=what, hint="return {'post_mlp:2': tensor, ...}")
        return {CheckpointKey.parse(k): v for k, v in produced.items()}, seconds

    recorder = KVRecorder(steps)

    def whole_cache() -> dict[int, LayerKV]:
        fn = getattr(runner, "kv_cache", None)
        with within():
            return {int(k): (v[0], v[1]) for k, v in (fn() or {}).items()} if callable(fn) else {}

    def kept(whole: dict[int, LayerKV]) -> tuple[dict[int, LayerKV], dict[int, str]]:
        spans = recorder.spans_for({i: int(kv[0].shape[1]) for i, kv in whole.items()})
        return recorder.cut(whole, spans), spans

    def cache() -> tuple[dict[int, LayerKV], dict[int, str]]:
        return kept(whole_cache())

    offset = int(inputs.meta.get("position_offset", 0) or 0)
    mask = np.asarray(inputs.attention_mask, np.int64)
    first = list(keys if prefill_keys is None else prefill_keys)
    from ._decode_draft import TokenFeed, fed_column, step_of

    logit_key = CheckpointKey("post_processing")

    def greedy(got: dict[CheckpointKey, Tensor], last: np.ndarray) -> np.ndarray:
        logits = np.asarray(got[logit_key].detach().cpu().double() if hasattr(got[logit_key], "detach")
                            else got[logit_key], dtype=np.float64)
        return logits[np.arange(logits.shape[0]), last].argmax(-1).astype(np.int64)

    def wrapped(got: dict[CheckpointKey, Tensor], seconds: float, last: np.ndarray) -> Capture:
        cap = wrap(got, seconds)
        if isinstance(tokens, TokenFeed) and logit_key in got:  # the token its own greedy choice feeds next
            cap.meta["choice"] = greedy(got, last).tolist()
        return cap

    got, seconds = call("prefill()", lambda: runner.prefill(inputs, first))
    last = last_token_index(mask)
    yield DecodePass(0, wrapped(got, seconds, last), *cache(), mask)
    several = getattr(runner, "decode_steps", None) if isinstance(tokens, TokenFeed) else None
    s = 0
    while s < steps:
        fed = None if several is None else np.asarray(tokens.known(s, min(CHUNK_STEPS, steps - s)), np.int64)  # type: ignore[union-attr]
        if fed is not None and fed.shape[1] > 1:  # the fed tokens several a pass: one pass, a DecodePass a step
            n, width = fed.shape[1], mask.shape[1]
            positions = decode_positions(mask, offset) + np.arange(n)
            mask = np.concatenate([mask, np.ones((mask.shape[0], n), np.int64)], axis=1)
            got, seconds = call("decode_steps()", lambda f=fed, p=positions: several(f, p, list(keys)))  # type: ignore[misc]
            whole = whole_cache()
            last = np.zeros(mask.shape[0], np.int64)
            for j in range(n):
                at_step = {k: step_of(backend_name, k, t, fed.shape[0], n, j) for k, t in got.items()}
                cap = wrapped(at_step, seconds / n, last)
                cap.meta["chunk"] = [s + 1, n, n]
                upto = width + j + 1
                yield DecodePass(s + j + 1, cap, *kept({i: (kv[0][:, :upto], kv[1][:, :upto]) for i, kv in whole.items()}),
                                 mask[:, :upto].copy(), fed[:, j].copy())
            got = at_step  # the last step's: its logits choose where the feed ends
            s += n
            continue
        if fed is not None:
            tok = fed[:, 0]
        elif tokens is not None:
            tok = fed_column(tokens, s)
        elif logit_key in got:
            tok = greedy(got, last)
        else:
            raise ConfigurationError("the engine returns no post_processing logits, so the decode tokens cannot be "
                                     "chosen", backend=backend_name, hint="give them: --decode-tokens (config decode_tokens)")
        positions = decode_positions(mask, offset)[:, 0]
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
        got, seconds = call("decode_step()", lambda t=tok, p=positions: runner.decode_step(t, p, list(keys)))
        last = np.zeros(mask.shape[0], np.int64)
        yield DecodePass(s + 1, wrapped(got, seconds, last), *cache(), mask, np.array(tok, np.int64))
        s += 1


def streams_decode(backend: object) -> bool:
    """Whether ``backend`` gives its decode pass by pass (``iter_decode``), not only whole (``run_decode``)."""
    from .capabilities import offers

    return offers(backend, "iter_decode")


def decode_passes(backend: object, inputs: ModelInputs, steps: int, taps: Sequence[CheckpointKey],
                  tokens: np.ndarray | None, prefill_taps: Sequence[CheckpointKey] | None = None) -> Iterator[DecodePass]:
    """A backend's decode pass by pass: its ``iter_decode(inputs, steps, taps, tokens,
    prefill_taps)`` where it streams (the built-in backends), else its ``run_decode`` run whole and
    its passes given one by one (an engine written to the ``run_decode`` protocol alone: it holds
    every pass until the end, so its memory grows with the steps)."""
    if streams_decode(backend):
        return backend.iter_decode(inputs, steps, taps, tokens, prefill_taps)  # type: ignore[attr-defined]

    def whole() -> Iterator[DecodePass]:
        run: DecodeRun = backend.run_decode(inputs, steps, taps, tokens)  # type: ignore[attr-defined]
        for s, capture in enumerate(run.captures):
            yield DecodePass(s, capture, run.kv_cache[s] if s < len(run.kv_cache) else {},
                             run.kv_span[s] if s < len(run.kv_span) else {},
                             run.attention_masks[s] if s < len(run.attention_masks) else np.zeros((0, 0), np.int64),
                             None if s == 0 else np.asarray(run.tokens)[:, s - 1])
    return whole()


class ReferenceDecoder:
    """The engine protocol over a decoder written from the math (``architectures``): the prefill
    fills a fresh :class:`~debug_framework.architectures.kv_cache.KVCache` with every layer's
    rotated keys and values (padded positions included, masked as in the prefill), and each decode
    step runs the new tokens alone at their positions over it, the mask over every cached position
    grown by one. ``to_array(x)`` turns host ids and masks (int64 NumPy) into the model's arrays."""

    def __init__(self, net: Model, to_array: Callable[[np.ndarray], Array]) -> None:
        from ..architectures.kv_cache import KVCache

        self.net, self.to_array, self._cache_type = net, to_array, KVCache
        self.mask = np.zeros((0, 0), np.int64)

    def _forward(self, ids: np.ndarray, positions: np.ndarray | None, keys: Sequence[CheckpointKey]) -> dict[str, Array]:
        self.net.positions = positions
        out = self.net.forward(self.to_array(ids), self.to_array(self.mask), {tuple(k) for k in keys})
        return {str(CheckpointKey(*k)): v for k, v in out.items()}

    def prefill(self, inputs: ModelInputs, keys: Sequence[CheckpointKey]) -> dict[str, Array]:
        """The prompt ``[B, T]`` at the inputs' positions, every layer's keys and values kept."""
        self.net.cache = self._cache_type()
        self.mask = np.asarray(inputs.attention_mask, np.int64)
        return self._forward(np.asarray(inputs.input_ids, np.int64), inputs.position_ids(), keys)

    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, keys: Sequence[CheckpointKey]) -> dict[str, Array]:
        """One token per row at its position, attending over the cache and itself."""
        self.mask = np.concatenate([self.mask, np.ones((self.mask.shape[0], 1), np.int64)], axis=1)
        return self._forward(np.asarray(tokens, np.int64)[:, None], np.asarray(positions, np.int64)[:, None], keys)

    def decode_steps(self, tokens: np.ndarray, positions: np.ndarray, keys: Sequence[CheckpointKey]) -> dict[str, Array]:
        """Several tokens per row (``tokens`` and ``positions`` ``[B, n]``) in one pass over the cache,
        each attending over the cache and the tokens before it (the last ``n`` rows of the mask over
        every cached position: ``kv_cache.last_queries``); tensors ``[B, n, ...]``."""
        n = int(np.asarray(tokens).shape[1])
        self.mask = np.concatenate([self.mask, np.ones((self.mask.shape[0], n), np.int64)], axis=1)
        return self._forward(np.asarray(tokens, np.int64), np.asarray(positions, np.int64), keys)

    def layer_step(self, i: int, hidden: Array, positions: np.ndarray) -> dict[str, Array]:
        """Layer i alone at the next decode step on ``hidden`` ``[B, 1, D]`` (its input, given), over
        its cache: its post_attention and post_mlp."""
        self.mask = np.concatenate([self.mask, np.ones((self.mask.shape[0], 1), np.int64)], axis=1)
        self.net.positions = np.asarray(positions, np.int64)[:, None]
        a, out = self.net.layer(i, hidden, self.to_array(self.mask))
        return {f"post_attention:{i}": a, f"post_mlp:{i}": out}

    def kv_cache(self) -> dict[int, LayerKV]:
        """Each layer's keys and values ``[B, L, K, E]`` over every position so far."""
        return {} if self.net.cache is None else self.net.cache.layers()

    def close(self) -> None:
        """Drop the cache: the model's next pass (a replay, a forward) keeps none."""
        self.net.cache, self.net.positions = None, None


def reference_can_decode(net: Model | None) -> tuple[bool, str]:
    """Whether a reference written from the math decodes: a decoder does; an encoder or an ONNX
    file's graph (``net`` None) does not, and why."""
    if net is None:
        return False, "runs an ONNX file's graph, which carries no past key/values: it cannot decode"
    if net.config.architecture == "bert":
        return False, "runs an encoder (BERT): it has no causal decode"
    return True, ""


def reference_decode(backend_name: str, dtype: str, net: Model | None, to_array: Callable[[np.ndarray], Array],
                     inputs: ModelInputs, steps: int, keys: Sequence[CheckpointKey],
                     tokens: np.ndarray | None, context: Callable[[], ContextManager[object]]) -> DecodeRun:
    """A reference written from the math decoded through its own KV cache, every pass kept
    (:func:`reference_iter_decode`, collected).

    Raises:
        BackendInitializationError: (DF002) a model that cannot decode (:func:`reference_can_decode`).
    """
    return collect_run(reference_iter_decode(backend_name, dtype, net, to_array, inputs, steps, keys, tokens,
                                             context), steps)


def reference_iter_decode(backend_name: str, dtype: str, net: Model | None, to_array: Callable[[np.ndarray], Array],
                          inputs: ModelInputs, steps: int, keys: Sequence[CheckpointKey],
                          tokens: np.ndarray | None, context: Callable[[], ContextManager[object]],
                          prefill_keys: Sequence[CheckpointKey] | None = None) -> Iterator[DecodePass]:
    """A reference written from the math decoded through its own KV cache (:class:`ReferenceDecoder`,
    driven by :func:`iter_runner_decode`), pass by pass, each call under ``context()``
    (``torch.no_grad`` for torch); the model keeps no cache afterwards (nor when the caller stops early).

    Raises:
        BackendInitializationError: (DF002) a model that cannot decode (:func:`reference_can_decode`).
    """
    ok, why = reference_can_decode(net)
    if not ok:
        raise BackendInitializationError(f"this reference {why}", backend=backend_name)
    assert net is not None

    wanted = set(keys) | set(prefill_keys or ())

    def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
        return Capture(tensors={k: v for k, v in tensors.items() if k in wanted}, backend=backend_name, dtype=dtype,
                       elapsed_s=seconds)

    def passes() -> Iterator[DecodePass]:
        decoder = ReferenceDecoder(net, to_array)
        release = hold_weights(net, DECODE_HOLD_BYTES)
        try:
            yield from iter_runner_decode(backend_name, decoder, inputs, steps, keys, tokens, wrap, prefill_keys,
                                          context)
        finally:
            release()
            decoder.close()
    return passes()


def hold_weights(net: Model, budget: int) -> Callable[[], None]:
    """Keep a streamed reference's converted weights for a whole decode, which reads every one at
    every step: its layers (as many as fit in ``budget`` bytes at its dtype), then, in what is
    left, its tables (the LM head, the embeddings); the rest converts as used, as before. Returns
    what puts the streams back."""
    layers = net.layers
    count = len(layers)
    sizes = [layers.layer_bytes(i) for i in range(count)]
    fit = 0
    while fit < count and sum(sizes[:fit + 1]) <= budget:
        fit += 1
    undo_layers = layers.hold(fit)
    undo_tables = net.params.hold(budget - sum(sizes[:fit]))

    def release() -> None:
        undo_tables()
        undo_layers()
    return release


def reference_decode_layer(backend_name: str, dtype: str, net: Model, to_array: Callable[[np.ndarray], Array],
                           inputs: ModelInputs, step: int, tokens: np.ndarray, i: int, hidden: Array,
                           context: Callable[[], ContextManager[object]]) -> Capture:
    """Layer ``i`` of a reference written from the math replayed at decode ``step`` (>= 1): the
    prefill and the steps before it through its cache as :func:`reference_decode` runs them, then
    layer i alone on ``hidden`` ``[B, 1, D]`` at the step's positions. Its post_attention and post_mlp."""
    import time

    decoder = ReferenceDecoder(net, to_array)
    offset = int(inputs.meta.get("position_offset", 0) or 0)
    try:
        with context():
            decoder.prefill(inputs, [])
            for s in range(step - 1):
                decoder.decode_step(np.asarray(tokens)[:, s], decode_positions(decoder.mask, offset)[:, 0], [])
            start = time.perf_counter()
            got = decoder.layer_step(i, hidden, decode_positions(decoder.mask, offset)[:, 0])
    finally:
        decoder.close()
    return Capture(tensors={CheckpointKey.parse(k): v for k, v in got.items()}, backend=backend_name, dtype=dtype,
                   elapsed_s=time.perf_counter() - start)
