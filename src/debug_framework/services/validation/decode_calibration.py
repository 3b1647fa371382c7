"""The calibration's noise at the decode steps: measured where it must be, by the calibration's own
decode fed the same tokens (or one prefill), carried between (docs/validation.md, "Decode steps").

The calibration (a correct implementation at the alternative's precision) is not judged at every
step beside the reference and the alternative. Where a step's noise is measured,
:class:`CalibrationPasses` gives its pass at step ``s``: its own decode through its own cache, fed
the tokens fed at steps 1..s several a pass (up to ``CHUNK_STEPS``; each pass a prefill of those
tokens over the keys and values it computed itself), or, where that decode cannot give it (the
step is behind it; the decode fails, or computes one step a pass), the prompt and those tokens as
ONE prefill through the backend's own decode of no steps (``iter_decode(inputs, 0, ...)``), its
last position (prefill equivalence). Either is an honest measurement of a correct run's rounding
at step ``s``, at the alternative's precision, over keys and values it computed itself. The decode
costs about what a pass of several tokens costs every ``CHUNK_STEPS`` steps, the same at step 10
and step 1000; a prefill of ``s`` tokens grows with ``s`` (its attention with its square). Where
the reference decodes in a process of its own, that process keeps the calibration's decode up with
the tokens of its passes (:func:`beside_calibration`), so a sampled step's pass is there when the
step is.

It is measured (:func:`noise_sampled`) at step 0 (the prompt), at steps 1, 2, 4, 8, ... (powers of
two), every :data:`NOISE_EVERY`-th and the last, whatever the checks say; between them
:class:`NoiseCarry` carries the last measured noise of each checkpoint (and each layer's K or V) and
measures it at the step itself where a check fails by the carried bound. After the first step that
fails by its own noise, a step failing by the carried bound measures again only every
:data:`NOISE_EVERY` steps (the rest is judged by the carried bound and counted as such), so a
decode that diverges early does not measure the calibration at every step.
``result.decode["calibration_noise"]`` records where it was measured and how
(:meth:`NoiseCarry.record`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import numpy as np

from ...backends.base import Backend
from ...backends.decode import CHUNK_STEPS, DecodePass, decode_passes, streams_decode
from ...capture.keys import Capture, CapturedTensor, CheckpointKey
from ...comparison import ComparisonResult
from ...jsonio import JsonObject
from ...modelio.inputs import ModelInputs
from .context import RunContext, call_backend, own
from .decode_equivalence import replayed_as_prefill
from .memory import give_back_freed, large_blocks_mapped

__all__ = ["CalibrationPasses", "ChosenTokens", "NoiseCarry", "NOISE_EVERY", "noise_sampled", "beside_calibration"]

#: besides the powers of two, the calibration's noise is measured at every this many decode steps
#: (and the last); the steps between carry the last measured
NOISE_EVERY = 256
#: a prefill longer than this many tokens runs a row at a time (its attention scores grow with the
#: square of its length); a shorter one runs the batch at once (one pass: less overhead)
ROWS_APART_FROM = 256


def noise_sampled(step: int, steps: int) -> bool:
    """Whether the calibration's noise is measured at decode ``step`` of ``steps`` whatever the
    check: the prompt (0), the powers of two, every :data:`NOISE_EVERY`-th and the last."""
    return step == 0 or step & (step - 1) == 0 or step % NOISE_EVERY == 0 or step == steps


def _last_position(t: CapturedTensor, batch: int) -> CapturedTensor:
    """``t`` ``[batch, length, ...]`` cut to its last position, copied (no view of the whole kept);
    a tensor of the tokens flattened, ``[batch * length, ...]`` (a router's logits), cut to each
    row's last token, ``[batch, ...]``, as a decode step gives it."""
    if t.shape[0] == batch or t.shape[0] % batch:
        last = t[:, -1:]
    else:
        last = t.reshape(batch, t.shape[0] // batch, *t.shape[1:])[:, -1]
    clone = getattr(last, "clone", None)
    return clone() if callable(clone) else np.array(last)


def _row(inputs: ModelInputs, b: int) -> ModelInputs:
    """Row ``b`` of ``inputs`` as inputs of one row (every per-row array cut alike)."""
    batch = inputs.shape[0]

    def cut(x: np.ndarray) -> np.ndarray:
        return x[b:b + 1] if getattr(x, "ndim", 0) and x.shape[0] == batch else x
    return ModelInputs(inputs.input_ids[b:b + 1], inputs.attention_mask[b:b + 1],
                       None if inputs.token_type_ids is None else inputs.token_type_ids[b:b + 1],
                       meta=dict(inputs.meta), extra={k: cut(v) for k, v in inputs.extra.items()})


def _concat_rows(parts: list[CapturedTensor]) -> CapturedTensor:
    """Tensors ``[1, ...]`` joined along the batch (torch or NumPy)."""
    if len(parts) == 1:
        return parts[0]
    if hasattr(parts[0], "detach"):
        import torch

        return torch.cat(list(parts), dim=0)  # type: ignore[arg-type]
    return np.concatenate([np.asarray(p) for p in parts], axis=0)


def _join_rows(rows: list[DecodePass], step: int) -> DecodePass:
    """One pass of the whole batch from one pass per row (what every row has)."""
    keys = [k for k in rows[0].capture.tensors if all(k in r.capture.tensors for r in rows)]
    layers = [i for i in rows[0].kv if all(i in r.kv for r in rows)]
    first = rows[0].capture
    capture = Capture(tensors={k: _concat_rows([r.capture.tensors[k] for r in rows]) for k in keys},
                      backend=first.backend, dtype=first.dtype, elapsed_s=sum(r.capture.elapsed_s for r in rows))
    kv = {i: (_concat_rows([r.kv[i][0] for r in rows]), _concat_rows([r.kv[i][1] for r in rows])) for i in layers}
    return DecodePass(step, capture, kv, dict(rows[0].span), np.concatenate([r.mask for r in rows], axis=0))


class ChosenTokens:
    """The tokens chosen so far, as a decode in this process reads them (a
    :class:`~debug_framework.backends._decode_draft.TokenFeed`): :attr:`tokens` ``[batch, steps]``,
    :attr:`count` how many of its columns are chosen. A decode reads only what is chosen before it
    asks (the alternative's choices where this process takes a lost child's reference decode over,
    :mod:`.decode_led`; the tokens judged so far, or the reference's passes so far, where the
    calibration decodes, :class:`CalibrationPasses`)."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens
        self.count = 0

    def known(self, start: int, most: int) -> np.ndarray:
        n = min(most, self.count - start)
        if n < 1:
            raise EOFError(f"the token of decode step {start + 1} is not chosen yet")
        return self.tokens[:, start:start + n].copy()


class CalibrationPasses:
    """The calibration's pass at a decode step, computed where it is asked for (see the module):
    by the calibration's own decode, fed the tokens fed so far several a pass through its own cache,
    where the backend streams its decode so and the step is not behind that decode; else as one
    prefill of the prompt and ``tokens[:, :s]`` (its checkpoints cut to the last position, its whole
    KV cache). The prompt's pass has every position. The last step's pass is held, so every
    measurement at one step shares one pass."""

    def __init__(self, ctx: RunContext, backend: Backend, taps: Sequence[CheckpointKey],
                 prompt_taps: Sequence[CheckpointKey], tokens: np.ndarray, steps: int,
                 given: Callable[[int], DecodePass | None] | None = None) -> None:
        self.ctx, self.backend, self.tokens, self.steps = ctx, backend, tokens, steps
        #: ``given(step)``: the pass at a sampled step where another process computed it already
        #: (the reference's decode process, :func:`beside_calibration`), else None
        self.given = given
        self.taps, self.prompt_taps = list(taps), list(prompt_taps)
        self._held: tuple[int, DecodePass | None] | None = None
        #: ``(step, positions, seconds, why, how)`` of each pass measured: ``how`` ``"decode"`` (its
        #: seconds: the decode's since the pass measured before) or ``"prefill"``
        self.runs: list[tuple[int, int, float, str, str]] = []
        self._fed = ChosenTokens(tokens)
        self._decode: Iterator[DecodePass] | None = None
        self._at = -1  # the last step the decode gave
        self._decodes = streams_decode(backend)  # False once it cannot (or gives one step a pass)
        self._spent = 0.0  # the decode's seconds since the last pass it gave for a measurement

    @property
    def name(self) -> str:
        return self.backend.name

    def ran_at(self, step: int) -> bool:
        """Whether the pass of ``step`` is computed (and held)."""
        return self._held is not None and self._held[0] == step

    def at(self, step: int, why: str = "sampled") -> DecodePass | None:
        """The calibration's pass at decode ``step`` (0: the prompt's prefill), computed once per
        step: by the decode where it can (:meth:`keep_up`), else by a prefill, longer than
        :data:`ROWS_APART_FROM` tokens a row at a time (a prefill's attention scores grow with the
        square of its length: one row's at a time halves the peak of a batch of two), joined along
        the batch."""
        if self._held is not None and self._held[0] == step:
            return self._held[1]
        self._held = None  # the last step's tensors are not kept beside this one's
        positions = self.ctx.inputs.shape[1] + step
        done = self.given(step) if self.given is not None and why == "sampled" else None
        if done is not None:  # computed in the reference's decode process
            how = str(done.capture.meta.get("calibration", "prefill"))
            self.runs.append((step, positions, float(done.capture.elapsed_s), why, how))
            self._held = (step, done)
            return done
        got = self._decoded(step, step)
        if got is not None:
            self.runs.append((step, positions, got.capture.elapsed_s, why, "decode"))
            self._held = (step, got)
            return got
        start = time.perf_counter()
        longer = replayed_as_prefill(self.ctx.inputs, self.tokens, step)
        apart = longer.shape[1] > ROWS_APART_FROM
        rows = [self._prefill(_row(longer, b), step, apart) for b in range(longer.shape[0])] if apart else \
            [self._prefill(longer, step)]
        got = None if any(r is None for r in rows) else _join_rows(rows, step)  # type: ignore[arg-type]
        if got is not None:
            got.capture.meta["calibration"] = "prefill"
        self.runs.append((step, positions, time.perf_counter() - start, why, "prefill"))
        self._held = (step, got)
        return got

    def keep_up(self, known: int) -> None:
        """The decode moved on by whole passes of :data:`~debug_framework.backends.decode.CHUNK_STEPS`
        steps while the tokens of the first ``known`` steps are there for them (the reference's
        process after each of its passes: its pass at a sampled step is then there at once)."""
        if self._decodes and self._at < 0:  # the prompt's pass first
            self._decoded(0, known)
        while self._decodes and 0 <= self._at < self.steps and known - self._at >= min(CHUNK_STEPS, self.steps - self._at):
            self._decoded(self._at + min(CHUNK_STEPS, self.steps - self._at), known)

    def _decoded(self, step: int, known: int) -> DecodePass | None:
        """The decode's pass at ``step``, the tokens of the first ``known`` steps fed (opened on the
        first ask); None where it cannot give it: the step is behind it, or the decode failed or
        gives one step a pass (a prefill then costs less than a decode step by step: every later
        step is measured by prefills)."""
        if not self._decodes or step <= self._at:
            return None
        start = time.perf_counter()
        self._fed.count = max(self._fed.count, known)
        got: DecodePass | None = None
        one_a_pass = False
        try:
            if self._decode is None:
                self._decode = decode_passes(self.backend, own(self.ctx.inputs), self.steps, self.taps, self._fed,
                                             self.prompt_taps)
            while self._at < step:
                got = next(self._decode)
                self._at = got.step
                # fed two tokens or more, it computed one: a decode as dear as the steps themselves
                one_a_pass = one_a_pass or (got.step > 0 and known - got.step >= 1 and "chunk" not in got.capture.meta)
        except Exception:  # noqa: BLE001 - the prefill measures it instead (and raises the backend's own error)
            self._stop()
            return None
        if one_a_pass:
            self._stop()
        self._spent += time.perf_counter() - start
        if got is None or got.step != step:
            return None
        seconds, self._spent = self._spent, 0.0
        capture = replace(got.capture, elapsed_s=seconds, meta={**got.capture.meta, "calibration": "decode"})
        return replace(got, capture=capture)

    def _stop(self) -> None:
        """No decode from here: its stream closed (the prefill measures every later step)."""
        self._decodes = False
        close = getattr(self._decode, "close", None)
        self._decode = None
        if callable(close):
            with contextlib.suppress(Exception):
                close()

    def close(self) -> None:
        """The decode's stream closed (its cache freed)."""
        self._stop()

    def _prefill(self, inputs: ModelInputs, step: int, long: bool = False) -> DecodePass | None:
        """One prefill of ``inputs`` by the backend (its decode of no steps), its checkpoints cut to
        the last position after a decode step. A ``long`` one runs with its large blocks mapped
        apart (:func:`~.memory.large_blocks_mapped`) and gives the heap's freed pages back after:
        its logits and attention blocks would otherwise leave holes in the heap that the next
        prefill's stack on, and the session's peak grew with every one."""
        if not long:
            return self._prefill_once(inputs, step)
        try:
            with large_blocks_mapped():
                return self._prefill_once(inputs, step)
        finally:
            give_back_freed()

    def _prefill_once(self, inputs: ModelInputs, step: int) -> DecodePass | None:
        taps = self.taps if step else self.prompt_taps
        what = f"the prefill of the prompt and {step} decoded token(s) (the calibration at decode step {step})"
        stream = call_backend(self.backend, what, lambda: decode_passes(self.backend, own(inputs), 0, taps, None, taps))
        try:
            got = call_backend(self.backend, what, lambda: next(stream, None))
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
        if got is None or not step:
            return got
        batch = inputs.shape[0]
        return DecodePass(step, Capture(tensors={k: _last_position(v, batch) for k, v in got.capture.tensors.items()},
                                        backend=got.capture.backend, dtype=got.capture.dtype,
                                        elapsed_s=got.capture.elapsed_s), got.kv, got.span, got.mask)

    def capture_at(self, step: int, why: str = "sampled") -> Capture | None:
        """The checkpoints of :meth:`at`."""
        got = self.at(step, why)
        return None if got is None else got.capture


def beside_calibration(ctx: RunContext, backend: Backend, taps: Sequence[CheckpointKey],
                       prompt_taps: Sequence[CheckpointKey], steps: int) -> Callable[[DecodePass], DecodePass | None]:
    """What the reference's decode process computes beside each of its passes
    (:func:`~.decode_ahead.decode_ahead`'s ``beside``): the calibration's decode kept up with the
    tokens of its passes (:meth:`CalibrationPasses.keep_up`), and at a sampled step
    (:func:`noise_sampled`) the calibration's pass; else nothing. The session's process takes it
    as :class:`CalibrationPasses`' ``given``, so the calibration runs beside its own work."""
    tokens = np.zeros((ctx.inputs.shape[0], steps), np.int64)
    passes = CalibrationPasses(ctx, backend, taps, prompt_taps, tokens, steps)

    def at(p: DecodePass) -> DecodePass | None:
        if not p.step or p.token is None:
            return None
        tokens[:, p.step - 1] = p.token
        if not noise_sampled(p.step, steps):
            passes.keep_up(p.step)
            return None
        return passes.at(p.step)
    return at


class NoiseCarry:
    """The calibration's noise at the decode steps, measured where it must be and carried between:
    at a sampled step (:func:`noise_sampled`) it is measured; at any other, the last one measured
    for the same slot (a checkpoint, a layer's K or V new entries or whole cache) is carried, and
    where the check fails by the carried bound the noise is measured at that step and judges it
    instead (so a carried bound never fails a correct step, and a failure is judged by its own
    step's noise) -- until the first divergence (:meth:`diverged`); after it, a failing step is
    measured again only every :data:`NOISE_EVERY` steps and otherwise judged by the carried bound.
    Counts what was measured and carried for ``result.decode["calibration_noise"]``."""

    def __init__(self) -> None:
        self.last: dict[tuple[object, ...], ComparisonResult] = {}
        self.measured = self.carried = self.remeasured = self.carried_failing = 0
        self.diverged_at: int | None = None
        self._remeasured_at: int | None = None

    def diverged(self, step: int) -> None:
        """The first step failing by its own noise: from here re-measuring is rationed."""
        if self.diverged_at is None:
            self.diverged_at = step

    def may_measure(self, step: int, cal: CalibrationPasses | None) -> bool:
        """Whether a check failing by the carried bound at ``step`` may measure its own noise."""
        if self.diverged_at is None or (cal is not None and cal.ran_at(step)):
            return True
        since = self.diverged_at if self._remeasured_at is None else self._remeasured_at
        if step - since >= NOISE_EVERY:
            self._remeasured_at = step
            return True
        return False

    def noise(self, slot: tuple[object, ...], measure: Callable[[], ComparisonResult | None], sampled: bool,
              fails: Callable[[ComparisonResult], bool], measured: ComparisonResult | None = None,
              may_measure: Callable[[], bool] = lambda: True) -> ComparisonResult | None:
        """The noise at ``slot`` this step: ``measured`` (already measured at a sampled step), the
        carried one where the check passes by it (or where it fails and ``may_measure()`` says no),
        else ``measure()``."""
        held = None if sampled else self.last.get(slot)
        if held is not None and not fails(held):
            self.carried += 1
            return held
        if held is not None and not may_measure():
            self.carried_failing += 1
            return held
        noise = measured if measured is not None and held is None else measure()
        self.measured += 1
        self.remeasured += held is not None
        if noise is not None:
            self.last[slot] = noise
        return noise

    def record(self, steps: int, cal: CalibrationPasses | None) -> JsonObject:
        """Where the noise was measured and how it was carried (the bound's provenance)."""
        runs = [] if cal is None else cal.runs
        return {"sampled_steps": [s for s in range(1, steps + 1) if noise_sampled(s, steps)],
                "every": NOISE_EVERY, "measured": self.measured, "carried": self.carried,
                "remeasured": self.remeasured, "carried_failing": self.carried_failing,
                "first_divergence": self.diverged_at,
                "calibration": None if cal is None else cal.name,
                "passes": [{"step": s, "tokens": n, "seconds": round(t, 6), "why": why, "how": how}
                           for s, n, t, why, how in runs],
                "rule": "measured by the calibration (at the alternative's precision) at the prompt, steps 1, 2, 4, 8, "
                        "..., every NOISE_EVERY-th step and the last: its own decode fed the same tokens, several a "
                        "pass through its own cache (how: decode), or one prefill of the prompt and the tokens fed up "
                        "to the step, its last position (how: prefill); between them the last measured noise of the "
                        "same checkpoint (or K/V) is carried, and measured at the step itself where the check fails "
                        "by the carried bound (after the first divergence at most every NOISE_EVERY steps; the other "
                        "failing steps are judged by the carried bound: carried_failing)"}
