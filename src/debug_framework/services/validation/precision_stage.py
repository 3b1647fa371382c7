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

from ...backends.base import Backend, EmulatedPrecision
from ...backends.capabilities import capabilities, emulated_precision, release
from ...capture.keys import Capture
from ...errors import DebugFrameworkError
from ...measure import Timer
from ...models.session_config import SessionConfig
from .calibration import noise_at
from .context import RunContext, Stage, call_backend, own

__all__ = ["PrecisionStage", "lower_precision_backend"]


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
        measured: list[str] = []
        skipped: dict[str, str] = {}
        seconds: dict[str, float] = {}
        release(ctx.alternative, "session")  # not run here (opened again on need): not held beside these runs
        emulated = self._emulated(ctx)
        candidates: list[tuple[str, str]] = [(emulated.name, emulated.dtype)] if emulated is not None else []
        candidates += [(d, d) for d in plan.lower_precisions if emulated is None or d != emulated.name]
        for dtype, compute in candidates:
            if emulated is not None and dtype == emulated.name:
                backend, why = emulated.trusted_backend(), None
            else:
                backend, why = lower_precision_backend(plan.config.calibration_backend, dtype)
            if backend is None:
                skipped[dtype] = str(why)
                continue
            with Timer() as t:
                try:
                    ctx.prepare_backend(backend, f"precision {dtype}", compute, "cpu")
                    cap: Capture = call_backend(backend, "run()", lambda b=backend: b.run(own(ctx.inputs), keys))
                except DebugFrameworkError as exc:  # a trusted run that cannot run here: said, not fatal
                    skipped[dtype] = exc.message
                    continue
            seconds[dtype] = t.seconds
            measured.append(dtype)
            backend = None  # its model (weights at this dtype) freed before the next dtype's is built
            for ev in ctx.evidence.checkpoints:
                noise = noise_at(ev.key, ctx.reference_capture, cap, positions=ctx.positions)
                if noise is not None:
                    ev.lower_precision = {**(ev.lower_precision or {}), dtype: noise}
            del cap
        from ...backends.quantized import quantized_modules, quantized_operators

        modules = quantized_modules(ctx.alternative)
        ctx.evidence.precision_note = {"measured": measured, "skipped": skipped, "seconds": seconds,
                                       "backend": plan.config.calibration_backend,
                                       "quantized": quantized_operators(ctx.alternative),
                                       "emulated": {emulated.name: emulated.dtype} if emulated is not None else {},
                                       **({"quantized_modules": modules} if modules else {})}
