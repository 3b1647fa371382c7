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
``precision_diagnosis`` is (the default). An alternative holding torchao-quantized weights is
measured first against a correct run at its own quantization (the trusted model quantized by torchao
with the same configuration), named by its scheme (``int8_weight_only``).
"""

from __future__ import annotations

from ...backends.base import Backend
from ...backends.capabilities import capabilities, release
from ...capture.keys import Capture, CheckpointKey
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

    # a session calibrated at the alternative's torchao quantization measures lower float precisions as "auto" does
    backend: Backend = (TorchReferenceBackend() if calibration_backend in ("auto", "torch_reference", "torchao")
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
        from ...backends.torchao.weights import declared_scheme

        lower = bool(ctx.plan.lower_precisions) or (declared_scheme(ctx.alternative) is not None
                                                    and ctx.plan.config.calibration_backend != "torchao")
        return lower and bool(ctx.evidence.checkpoints) and not ctx.judge().passed

    def run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        keys = [ev.key for ev in ctx.evidence.checkpoints]
        measured: list[str] = []
        skipped: dict[str, str] = {}
        seconds: dict[str, float] = {}
        from ...backends.torchao.weights import declared_scheme

        release(ctx.alternative, "session")  # not run here (opened again on need): not held beside these runs
        scheme = declared_scheme(ctx.alternative)
        if scheme is not None and plan.config.calibration_backend != "torchao":
            # a correct run at the alternative's torchao quantization, measured first (a session
            # calibrated by that very run was judged at it: the question is answered there)
            self._quantized_run(ctx, scheme, keys, measured, skipped, seconds)
        for dtype in plan.lower_precisions:
            backend, why = lower_precision_backend(plan.config.calibration_backend, dtype)
            if backend is None:
                skipped[dtype] = str(why)
                continue
            with Timer() as t:
                try:
                    ctx.prepare_backend(backend, f"precision {dtype}", dtype, "cpu")
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
                                       **({"quantized_modules": modules} if modules else {})}

    @staticmethod
    def _quantized_run(ctx: RunContext, scheme: str, keys: list[CheckpointKey], measured: list[str],
                       skipped: dict[str, str], seconds: dict[str, float]) -> None:
        """The trusted model quantized by torchao as the alternative is, at the alternative's dtype
        (:class:`~debug_framework.backends.torchao.TorchaoReferenceBackend`): its error at every
        checkpoint under the scheme's name (``int8_weight_only``)."""
        from ...backends.torchao.reference import TorchaoReferenceBackend

        with Timer() as t:
            backend = TorchaoReferenceBackend(ctx.alternative)
            try:
                ctx.prepare_backend(backend, f"precision {scheme}", ctx.plan.alternative_dtype, "cpu")
                cap = call_backend(backend, "run()", lambda: backend.run(own(ctx.inputs), keys))
            except DebugFrameworkError as exc:  # a scheme this framework cannot reproduce: said, not fatal
                skipped[scheme] = exc.message
                return
        seconds[scheme] = t.seconds
        measured.append(scheme)
        for ev in ctx.evidence.checkpoints:
            noise = noise_at(ev.key, ctx.reference_capture, cap, positions=ctx.positions)
            if noise is not None:
                ev.lower_precision = {**(ev.lower_precision or {}), scheme: noise}
