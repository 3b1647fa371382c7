"""The precision stage: when checkpoints fail at the declared precision, how a correct run at each
lower precision errs.

A backend that silently computes in bfloat16 (some engines' default on processors with bfloat16
instructions) or a model file converted to float16 fails a float32 validation at every checkpoint,
with errors that are exactly what a correct run at that lower precision makes. This stage runs the
session's trusted implementation (the calibration backend) at each dtype less precise than the
alternative's (``float16``, then ``bfloat16``) on the same inputs and keeps its error against the
reference at every enabled checkpoint (``CheckpointEvidence.lower_precision``). It measures only;
the judge (:func:`.judge.consistent_precision`) decides whether the whole run is consistent with
one of them (``consistent_with``). It runs only where a checkpoint failed, calibration is on and
``precision_diagnosis`` is (the default). An alternative whose engine declares a precision it
emulates (:func:`~debug_framework.backends.capabilities.emulated_precision`: llama.cpp's ``q8_0``, a
torchao module's ``int8_weight_only``) is measured first against that emulation, under its name,
where the calibration did not already run it (a session judged at an explicit dtype).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ...backends.base import Backend, EmulatedPrecision
from ...backends.capabilities import capabilities, emulated_precision, release
from ...errors import DebugFrameworkError
from ...measure import Timer
from ...models.session_config import SessionConfig
from .calibration import noise_at
from .context import RunContext, Stage, call_backend, own

__all__ = ["PrecisionStage", "PrecisionTrials", "lower_precision_backend"]

T = TypeVar("T")


def lower_precision_backend(calibration_backend: str, dtype: str) -> tuple[Backend | None, str | None]:
    """A fresh trusted implementation (the session's ``calibration_backend``) for ``dtype``, or
    ``(None, why not)`` when it cannot run that dtype."""
    from ...backends import get_backend
    from ...backends.torch_reference import TorchReferenceBackend

    backend: Backend = (TorchReferenceBackend() if calibration_backend in ("auto", "torch_reference")
                        else get_backend(calibration_backend))
    supported = capabilities(backend).dtypes
    if supported and dtype not in supported:
        return None, f"the calibration backend {backend.name!r} cannot run {dtype}"
    return backend, None


@dataclass
class PrecisionTrials:
    """The correct runs at lower precisions tried by a session: which were measured, which could not
    run here (and why), and how long each took (``precision_note``'s first three fields)."""

    measured: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def runs(self, ctx: RunContext, candidates: Sequence[tuple[str, str, Callable[[], tuple[Backend | None, str | None]]]],
             run: Callable[[Backend], T]) -> Iterator[tuple[str, T]]:
        """``(name, run(backend))`` for each candidate ``(name, compute dtype, trusted backend)`` that
        runs here: each backend prepared at its compute dtype on the CPU, timed; a trusted run that
        cannot run here is recorded as skipped with its reason, never fatal."""
        for name, compute, trusted in candidates:
            backend, why = trusted()
            if backend is None:
                self.skipped[name] = str(why)
                continue
            with Timer() as t:
                try:
                    ctx.prepare_backend(backend, f"precision {name}", compute, "cpu")
                    result = run(backend)
                except DebugFrameworkError as exc:
                    self.skipped[name] = exc.message
                    continue
            self.seconds[name] = t.seconds
            self.measured.append(name)
            backend = None  # its model (weights at this dtype) freed before the next dtype's is built
            yield name, result

    def note(self, calibration_backend: str) -> dict[str, object]:
        """The record's shared fields (``measured``, ``skipped``, ``seconds``, ``backend``)."""
        return {"measured": self.measured, "skipped": self.skipped, "seconds": self.seconds,
                "backend": calibration_backend}


class PrecisionStage(Stage):
    """Correct runs at the precisions below the alternative's, measured where checkpoints fail."""

    name = "precision"
    timing_key = "precision_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.precision_diagnosis and config.calibrate

    def ready(self, ctx: RunContext) -> bool:
        """Some checkpoint fails as judged so far, and there is a lower precision to measure."""
        lower = bool(ctx.plan.lower_precisions) or self._emulated(ctx) is not None
        return lower and bool(ctx.evidence.checkpoints) and not ctx.judge().passed

    @staticmethod
    def _emulated(ctx: RunContext) -> EmulatedPrecision | None:
        """The precision the alternative's engine declares and emulates (llama.cpp's ``q8_0``, a torchao
        module's ``int8_weight_only``), where
        the calibration did not already run it (a session judged at an explicit dtype)."""
        config = ctx.plan.config
        if config.emulated_precision or config.calibration_backend != "auto" or ctx.alternative is None:
            return None
        emulated = emulated_precision(ctx.alternative, ctx.model)
        return None if emulated is None or emulated.name == ctx.plan.alternative_dtype else emulated

    def run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        keys = [ev.key for ev in ctx.evidence.checkpoints]
        release(ctx.alternative, "session")  # not run here (opened again on need): not held beside these runs
        emulated = self._emulated(ctx)
        candidates = [(emulated.name, emulated.dtype, lambda e=emulated: (e.trusted_backend(), None))] if emulated else []
        candidates += [(d, d, lambda d=d: lower_precision_backend(plan.config.calibration_backend, d))
                       for d in plan.lower_precisions if emulated is None or d != emulated.name]
        trials = PrecisionTrials()
        for dtype, cap in trials.runs(ctx, candidates, lambda b: call_backend(b, "run()", lambda: b.run(own(ctx.inputs), keys))):
            for ev in ctx.evidence.checkpoints:
                noise = noise_at(ev.key, ctx.reference_capture, cap, positions=ctx.positions)
                if noise is not None:
                    ev.lower_precision = {**(ev.lower_precision or {}), dtype: noise}
            del cap
        from ...backends.quantized import quantized_modules, quantized_operators

        modules = quantized_modules(ctx.alternative)
        ctx.evidence.precision_note = {**trials.note(plan.config.calibration_backend),
                                       "quantized": quantized_operators(ctx.alternative),
                                       "emulated": {emulated.name: emulated.dtype} if emulated is not None else {},
                                       **({"quantized_modules": modules} if modules else {})}
