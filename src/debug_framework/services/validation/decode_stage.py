"""The decode stage: after the prefill, ``decode_steps`` tokens decoded one at a time through each
backend's own KV cache, every step's checkpoints compared (docs/validation.md, "Decode steps").

Both sides see the same sequence (teacher forcing): the tokens are ``decode_tokens`` where given,
else the reference's greedy choice. The calibration backend computes the same tokens at the
alternative's precision where its noise is measured, by its own decode fed them or one prefill
(:mod:`.decode_calibration`), so each step's checkpoints are judged by the same calibrated rule as the
prefill's. The two decodes are streamed side by side (``iter_decode``): each step is judged as
soon as both have produced it (:class:`~.decode_walk.DecodeWalk`) and its tensors dropped, so
memory does not grow with the tensors of the steps taken; with ``stop_at_first_divergence`` the
decode stops at the first step that fails. The prefill's rows then carry ``step`` 0 and decode step
``s``'s rows ``step`` s; the KV cache after each pass is compared per layer (K and V, padded
positions left out) and kept in :attr:`RunContext.decode`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ...backends.base import Backend
from ...backends.capabilities import capabilities
from ...backends.decode import DecodePass, decode_passes, decode_support, kv_audited, streams_decode
from ...capture.keys import CheckpointKey
from ...errors import BackendInitializationError, BackendRuntimeError, ConfigurationError
from ...jsonio import JsonObject
from ...models.session_config import SessionConfig
from .calibration import calibration_dtype
from .context import RunContext, Stage, call_backend, own
from .deadline import bounded
from .decode_ahead import AheadStream, Beside, Channel, FedTokens, ahead_support, decode_ahead, token_pipe
from .decode_calibration import NOISE_EVERY, CalibrationPasses, NoiseCarry, beside_calibration, noise_sampled
from .decode_equivalence import prefill_equivalence
from .decode_led import ChosenTokens, count_chunk, lead
from .decode_replay import replay_decode_layer, step_inputs
from .decode_walk import LOGITS, DecodeWalk, held_by_both
from .memory import give_back_freed, older_objects_frozen

if TYPE_CHECKING:
    from ...modelio import LoadedModel, ModelInputs

__all__ = ["DecodeStage", "check_decode_tokens", "check_decode_plan", "NOISE_EVERY", "noise_sampled", "NoiseCarry",
           "held_by_both"]

#: how to get a decoding reference where the session's cannot decode
_DECODE_HINT = ("use backends that decode (python_reference, torch_reference, pytorch, float64_eager, module "
                "backends, engines with prefill/decode_step), or set decode_steps to 0")


def check_decode_tokens(tokens: object, batch: int, steps: int) -> np.ndarray | None:
    """``decode_tokens`` as ``[batch, steps]`` int64 (one list per row), None when not given.

    Raises:
        ConfigurationError: (DF005) tokens that are not ``batch`` rows of ``steps`` ints.
    """
    if tokens is None:
        return None
    try:
        arr = np.asarray(tokens, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"decode_tokens must be lists of token ids, one per row: {exc}") from exc
    if arr.ndim == 1 and batch == 1:
        arr = arr[None]
    if arr.shape != (batch, steps):
        raise ConfigurationError(f"decode_tokens must be {batch} row(s) of {steps} token id(s) (one per decode step), "
                                 f"got shape {list(arr.shape)}", hint="one list per input row, decode_steps long")
    return arr


def check_decode_plan(config: SessionConfig, inputs: ModelInputs, model: LoadedModel) -> np.ndarray | None:
    """The decode settings checked against the inputs and the model (before any backend runs):
    ``decode_tokens`` one row of ``decode_steps`` ids per input row, and every position (the
    inputs from ``position_offset``, then the steps) within ``max_position_embeddings``. Returns
    the given tokens (None: the reference's greedy choice).

    Raises:
        ConfigurationError: (DF005) saying what to change.
    """
    steps = config.decode_steps
    if not steps:
        return None
    batch, length = inputs.shape
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    offset = config.position_offset
    if limit and offset + length + steps > limit:
        raise ConfigurationError(
            f"{length} input position(s) from {offset} and {steps} decode step(s) exceed the model's "
            f"max_position_embeddings={limit}", hint="fewer decode_steps, shorter inputs or a lower position_offset")
    return check_decode_tokens(config.decode_tokens, batch, steps)


class DecodeStage(Stage):
    """Prefill and ``decode_steps`` decode steps in the reference and the alternative, streamed side
    by side (the calibration's passes where its noise is measured); each step's checkpoints
    measured and judged as it is produced (:class:`~.decode_walk.DecodeWalk`)."""

    name = "decode"
    timing_key = "decode_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.decode_steps > 0

    def run(self, ctx: RunContext) -> None:
        with older_objects_frozen():  # the collector's full passes walk only what the decode made
            self._run(ctx)

    def _run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        steps = plan.config.decode_steps
        given = check_decode_plan(plan.config, ctx.inputs, ctx.model)
        for side, backend in (("reference", ctx.reference), ("alternative", ctx.alternative)):
            ok, why = decode_support(backend)
            if not ok:  # a backend's capability (DF002), as a dtype it does not run
                raise BackendInitializationError(f"the {side} backend {backend.name!r} {why}", backend=backend.name,
                                                 hint=_DECODE_HINT)
        taps = list(plan.keys)
        prefill_taps = [k for k in taps if k == LOGITS]  # the prefill's checkpoints are the compare stage's
        batch = ctx.inputs.shape[0]
        tokens = np.zeros((batch, steps), np.int64) if given is None else np.array(given, np.int64)
        cal = self._calibrator(ctx)
        sides: list[tuple[Backend, Iterator[DecodePass], np.ndarray]] = []
        ref_fed = None if given is None else own(given)
        # the alternative leads a greedy decode where the reference runs in a process of its own (.decode_led)
        fed = token_pipe(batch) if given is None and self._may_lead(ctx, steps, taps) else None
        # the reference's passes computed ahead, the calibration's decode beside them
        chosen = ChosenTokens(tokens)  # the alternative's choices, where this process takes the reference's decode over
        ahead = self._ahead(ctx, steps, taps, ref_fed, prefill_taps, self._beside(ctx, cal, taps, prefill_taps, steps),
                            fed, chosen)
        leads = fed is not None and isinstance(ahead, AheadStream)
        current = {"ahead": ahead}  # the reference's process whose record is kept (the last one opened)
        calibration: CalibrationPasses | None = None
        try:  # the child process (where the reference runs ahead) ended however the decode ends
            for backend, fed_side in ((ctx.reference, ref_fed), (ctx.alternative, own(tokens))):
                stream = ahead if backend is ctx.reference and isinstance(ahead, AheadStream) else \
                    self._open(backend, ctx, steps, taps, fed_side, prefill_taps)
                sides.append((backend, stream, fed_side))  # type: ignore[arg-type]
            # the calibration's pass at a step where its noise is measured: its own decode fed the same tokens,
            # several a pass, or one prefill (.decode_calibration)
            calibration = None if cal is None else CalibrationPasses(
                ctx, cal, taps, prefill_taps, tokens, steps, ahead.beside if isinstance(ahead, AheadStream) else None)
            if given is None and not all(streams_decode(b) for b, _, _ in sides[1:]):
                sides[0] = self._whole_first(sides[0], steps, sides[1:])  # a side that decodes only whole needs every token first
            for ev in ctx.evidence.checkpoints:
                if ev.step is None:
                    ev.step = 0  # the prefill
            walk = DecodeWalk(ctx, steps, calibration)
            stop = plan.config.stop_at_first_divergence
            walls: list[float] = []  # each decode step's wall time: its passes and its judgement
            cpus: list[float] = []  # and this process's CPU time in it (what a loaded machine leaves comparable)
            chunks = {"passes": 0, "steps": 0, "computed": 0}  # the reference's passes of several steps
            led: dict[str, int | None] = {"until": None}  # where the alternative led: the step the reference led from

            def decode() -> int:
                if not leads:
                    return self._steps(ctx, sides, walk, tokens, given is None, stop, (walls, cpus), chunks)
                done, again = lead(ctx, walk, ahead, sides[1][1], sides[1][2], chosen, fed[1],  # type: ignore[arg-type, index]
                                   lambda is_ref, stream, s: self._next(sides[0 if is_ref else 1][0], stream, s),
                                   stop, (walls, cpus), chunks)
                led["until"] = steps + 1 if again is None else again
                if again is None:
                    return done
                # a flip: both decodes opened again, the reference leading, from the step after it
                for _, stream, _ in sides:
                    _close(stream)
                fed[1].close()  # type: ignore[index]
                again_ahead = self._ahead(ctx, steps, taps, None, prefill_taps,
                                          self._beside(ctx, cal, taps, prefill_taps, steps))
                current["ahead"] = again_ahead
                alt_fed = own(tokens)
                sides[:] = [(ctx.reference, again_ahead if isinstance(again_ahead, AheadStream) else
                             self._open(ctx.reference, ctx, steps, taps, None, prefill_taps), None),  # type: ignore[list-item]
                            (ctx.alternative, self._open(ctx.alternative, ctx, steps, taps, alt_fed, prefill_taps), alt_fed)]
                if calibration is not None:
                    calibration.given = again_ahead.beside if isinstance(again_ahead, AheadStream) else None
                return self._steps(ctx, sides, walk, tokens, True, stop, (walls, cpus), chunks, first=again)
            # one watchdog of the session's time limit over the whole loop, not one thread per pass
            done = bounded(decode)
        finally:
            if fed is not None:
                fed[0].close()
                fed[1].close()
            for stream in [s for _, s, _ in sides] + ([ahead] if isinstance(ahead, AheadStream) else []):
                _close(stream)  # an ahead stream read whole first is closed here too
            if calibration is not None:
                calibration.close()
        ctx.decode = {"steps": steps, "tokens": tokens[:, :done].tolist(),
                      "tokens_from": "decode_tokens" if given is not None else f"the reference's greedy choice ({ctx.reference.name})",
                      "kv_cache": walk.kv_rows,
                      "calibration_noise": walk.carry.record(done, calibration),
                      "token_metrics": walk.token_rows,
                      "seconds_per_step": walk.seconds_per_step(),
                      "step_wall_s": walls,
                      "step_cpu_s": cpus,
                      "steps_run": done,
                      "reference_process": self._ahead_record(current["ahead"]),
                      "reference_chunks": chunks if chunks["passes"] else None,
                      "led_by": self._led_record(leads, led["until"] if leads else None, steps),
                      "first_failed_step": walk.first_failed,
                      "stopped_at_first_divergence": bool(stop and walk.first_failed is not None)}
        kept = walk.kept
        verdict = ctx.judge()
        if kept is not None and verdict.first_step == walk.first_failed and verdict.first_divergence is not None:
            key, at = verdict.first_divergence, walk.first_failed
            ctx.decode["prefill_equivalence"] = prefill_equivalence(ctx, ctx.alternative, at, key,
                                                                    kept.captures[at].tensors.get(key), tokens)
        if kept is not None and plan.config.isolate:  # the layer of a first divergence at a decode step, replayed at that step
            replay_decode_layer(ctx, kept, tokens, cal)
        if kept is not None and plan.config.drill_down:  # what the drill-down gives a layer at the first divergent step
            ctx.decode_inputs = step_inputs(ctx, kept, tokens)

    def _steps(self, ctx: RunContext, sides: list[tuple[Backend, Iterator[DecodePass], np.ndarray]], walk: DecodeWalk,
               tokens: np.ndarray, greedy: bool, stop: bool, times: tuple[list[float], list[float]],
               chunks: dict[str, int], first: int = 0) -> int:
        """The prefill and the decode steps, each step's passes taken from ``sides`` (the reference's
        first: its greedy token is fed to the others) and judged by ``walk`` as they come, each
        step's wall and CPU time appended to ``times`` (the steps of one reference pass over several
        judged together, each its share), the reference's passes of several steps counted in
        ``chunks`` (``Capture.meta["chunk"]``: passes, steps kept, steps computed); the last step
        run. Judged from ``first`` on: the passes before it are taken and not judged again (they
        were judged while the alternative led, :mod:`.decode_led`, over the same tokens)."""
        done = first - 1
        steps = walk.steps
        for s in range(first):
            r = self._next(sides[0][0], sides[0][1], s)
            if s and not np.array_equal(np.asarray(r.token, np.int64), tokens[:, s - 1]):
                raise BackendRuntimeError(
                    f"the reference {sides[0][0].name!r} chose other tokens at decode step {s} when its decode was "
                    f"run again than while the alternative led it", backend=sides[0][0].name,
                    call=f"run_decode() step {s}",
                    hint="its greedy choice is not deterministic (a near tie of its logits): give the tokens "
                         "(--decode-tokens)")
            for backend, stream, fed in sides[1:]:
                if s:
                    fed[:, s - 1] = r.token
                self._next(backend, stream, s)
        s = first
        while s <= steps:
            started, cpu = time.perf_counter(), time.process_time()
            pairs: list[tuple[DecodePass, DecodePass]] = []
            more = 1  # the steps of the reference's pass: judged together (DecodeWalk.step_many)
            while len(pairs) < more:
                t = s + len(pairs)
                r = self._next(sides[0][0], sides[0][1], t)
                chunk = count_chunk(chunks, r)  # the first step of a reference's pass over several
                if chunk and not pairs:
                    more = max(1, min(int(chunk[1]), steps - t + 1))
                if greedy and t:
                    tokens[:, t - 1] = r.token
                    for _, _, fed in sides[1:]:
                        fed[:, t - 1] = r.token
                pairs.append((r, self._next(sides[1][0], sides[1][1], t)))
            failed = walk.step_many(pairs, stop)
            wall, used = (time.perf_counter() - started) / len(failed), (time.process_time() - cpu) / len(failed)
            for t, bad in zip(range(s, s + len(failed)), failed):
                if t and (kv_audited(t, steps) or noise_sampled(t, steps)):
                    give_back_freed()  # what an audit's whole caches and a calibration's long prefill left in the heap
                done = t
                if t:
                    times[0].append(round(wall, 6))
                    times[1].append(round(used, 6))
                ctx.layers_done(t, steps)  # the progress bar by step
            if failed[-1] and stop:
                break
            s += len(pairs)
        return done

    def _whole_first(self, ref: tuple[Backend, Iterator[DecodePass], np.ndarray | None], steps: int,
                     others: list[tuple[Backend, Iterator[DecodePass], np.ndarray]]) -> tuple[Backend, Iterator[DecodePass], np.ndarray | None]:
        """The reference's decode run to its end first (its passes held), its greedy tokens given to
        the other sides: what a side decoding only whole (``run_decode``) needs before it starts."""
        backend, stream, fed = ref
        held = [self._next(backend, stream, s) for s in range(steps + 1)]
        for s, p in enumerate(held[1:], start=1):
            for _, _, other in others:
                other[:, s - 1] = p.token
        return backend, iter(held), fed

    @staticmethod
    def _open(backend: Backend, ctx: RunContext, steps: int, taps: list[CheckpointKey], fed: np.ndarray | None,
              prefill_taps: list[CheckpointKey]) -> Iterator[DecodePass]:
        """The backend's decode, pass by pass (:func:`~debug_framework.backends.decode.decode_passes`)."""
        return call_backend(backend, "run_decode()",
                            lambda: decode_passes(backend, own(ctx.inputs), steps, taps, fed, prefill_taps))

    @staticmethod
    def _ahead(ctx: RunContext, steps: int, taps: list[CheckpointKey], fed: np.ndarray | None,
               prefill_taps: list[CheckpointKey], beside: Beside | None, feed: tuple[FedTokens, Channel] | None = None,
               tokens: ChosenTokens | None = None) -> AheadStream | str:
        """The reference's decode run ahead in a child process (:mod:`.decode_ahead`) where it can
        be, with ``beside`` run there after each of its passes; else why not. With ``feed`` its
        tokens are those this process sends (the alternative leads, :mod:`.decode_led`), and
        ``tokens`` (filled with the same, ahead of the reference) feed it where this process takes
        its decode over."""
        backend = ctx.reference
        caps = capabilities(backend)
        ok, why = ahead_support(caps.decode_ahead, steps, caps.device)
        if not ok:
            return why
        inputs = own(ctx.inputs)
        if feed is None:
            return decode_ahead(lambda: decode_passes(backend, inputs, steps, taps, fed, prefill_taps), steps,
                                backend.name, beside)
        return decode_ahead(lambda: decode_passes(backend, inputs, steps, taps, feed[0], prefill_taps),  # type: ignore[arg-type]
                            steps, backend.name, beside, feed,
                            lambda: decode_passes(backend, inputs, steps, taps, tokens, prefill_taps))

    @staticmethod
    def _beside(ctx: RunContext, cal: Backend | None, taps: list[CheckpointKey], prefill_taps: list[CheckpointKey],
                steps: int) -> Beside | None:
        """What the reference's process computes beside its passes: the calibration's decode, its
        passes at the sampled steps sent."""
        return None if cal is None else beside_calibration(ctx, cal, taps, prefill_taps, steps)

    @staticmethod
    def _may_lead(ctx: RunContext, steps: int, taps: list[CheckpointKey]) -> bool:
        """Whether the alternative may lead a greedy decode (:mod:`.decode_led`): the reference
        decodes in a process of its own, the alternative gives its passes one by one, with the
        logits it chooses its tokens by."""
        caps = capabilities(ctx.reference)
        return LOGITS in taps and streams_decode(ctx.alternative) and streams_decode(ctx.reference) \
            and ahead_support(caps.decode_ahead, steps, caps.device)[0]

    @staticmethod
    def _led_record(leads: bool, until: int | None, steps: int) -> JsonObject | None:
        """Which side chose the tokens, for the decode record (None: the reference throughout)."""
        if not leads:
            return None
        last = steps if until is None else min(steps, until - 1)
        return {"alternative_led_through_step": last,
                "reference_led_from_step": None if until is None or until > steps else until}

    @staticmethod
    def _ahead_record(ahead: AheadStream | str) -> JsonObject:
        """Where the reference's decode ran, for the decode record."""
        if isinstance(ahead, str):
            return {"ahead": False, "why": ahead}
        return {"ahead": True, "taken_over_at": ahead.taken_over, "child_error": ahead.child_error,
                "peak_rss_bytes": ahead.peak_rss_bytes, "calibration_passes": ahead.beside_sent}

    @staticmethod
    def _next(backend: Backend, stream: Iterator[DecodePass], step: int) -> DecodePass:
        """The backend's next pass (a backend's failure reads as its own, naming the step)."""
        what = "run_decode() prefill" if step == 0 else f"run_decode() step {step}"
        got = call_backend(backend, what, lambda: next(stream, None))
        if got is None:
            raise BackendRuntimeError(f"the decode of {backend.name!r} ended before step {step}", backend=backend.name,
                                      call=what, hint="a decode yields the prefill and then one pass per step")
        return got

    @staticmethod
    def _calibrator(ctx: RunContext) -> Backend | None:
        """The backend that decodes the same tokens at the alternative's precision: the session's
        calibration backend where it decodes, else the model's own eager code at the calibration's
        dtype (``float64_eager``'s); None where nothing is calibrated."""
        if not ctx.plan.config.calibrate or not any(ctx.plan.calibrated(k) for k in ctx.plan.keys):
            return None
        cal = ctx.calibrator
        if cal is None or not decode_support(cal)[0]:
            from ...backends.eager_reference import EagerReferenceBackend

            cal = EagerReferenceBackend()
            dtype = calibration_dtype(ctx.plan, ctx.model)
            ctx.prepare_backend(cal, "calibration", dtype, "cpu")
        return cal


def _close(stream: object) -> None:
    """A decode stream closed where it can be (a generator, an ahead stream; a list's iterator not)."""
    close = getattr(stream, "close", None)
    if callable(close):
        close()
