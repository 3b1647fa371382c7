"""The ``drill-down`` stage: inside the layers that diverge, which operator introduces the error.

Runs with ``drill_down: true``, after the verdicts are final (compare, isolation, oracle). The
layers drilled are the first divergence's layer and every layer isolation says introduces error;
for each, the reference's float64 input to that layer (its run kept the layer inputs) goes into a
:class:`~debug_framework.services.drilldown.DrillRequest`, and the first strategy of
:data:`~debug_framework.services.drilldown.STRATEGY_FACTORIES` that applies to the alternative
drills it. No strategy, no layer input or a strategy failing: that layer's entry has an empty table
and a note saying why (never silently nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...backends.artifacts import current_artifact_root
from ...errors import DebugFrameworkError
from ..drilldown import DrillRequest, LayerDrilldown, choose_strategy
from .context import RunContext, Stage
from .deadline import bounded

__all__ = ["DrillDownStage", "drill_targets"]


def drill_targets(ctx: RunContext) -> list[tuple[int, str]]:
    """``(layer, checkpoint)`` to drill: the first divergence's layer, then each introducing layer
    (at the checkpoint its first introducing block ends at), as the judge decided them."""
    verdict = ctx.verdict if ctx.verdict is not None else ctx.judge()
    targets: dict[int, str] = {}
    first = verdict.first_divergence
    if first is not None and first.layer is not None:
        targets[first.layer] = str(first)
    for i, lv in sorted((verdict.layers or {}).items()):
        if lv.introduces and i not in targets:
            targets[i] = f"{'post_attention' if lv.block == 'attention' else 'post_mlp'}:{i}"
    return sorted(targets.items())


class DrillDownStage(Stage):
    """Op-level drill-down of the diverging layers (see the module's docstring)."""

    name = "drill-down"
    timing_key = "drilldown_s"

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config.get("drill_down"))

    def run(self, ctx: RunContext) -> None:
        targets = drill_targets(ctx)
        ctx.drilldown = []
        if not targets:
            return
        strategy, why = choose_strategy(ctx.alternative)
        for layer, checkpoint in targets:
            if strategy is None:
                ctx.drilldown.append(self._empty(ctx, layer, checkpoint, why))
                continue
            hidden = ctx.reference_capture.layer_inputs.get(layer)
            if hidden is None:
                ctx.drilldown.append(self._empty(ctx, layer, checkpoint, f"the reference backend "
                                                 f"{ctx.reference.name!r} did not record the input of layer {layer}",
                                                 strategy.name))
                continue
            request = DrillRequest(layer=layer, checkpoint=checkpoint, backend=ctx.alternative, model=ctx.model,
                                   inputs=ctx.inputs, hidden_in=hidden, dtype=ctx.plan.alternative_dtype,
                                   device=str(ctx.plan.config["device"]), out_dir=_out_dir(ctx, layer),
                                   noise_margin=float(ctx.plan.config["noise_margin"]),
                                   floor_eps=float(ctx.plan.config["floor_eps"]))
            ctx.drilldown.append(self._drill(ctx, strategy, request))

    @staticmethod
    def _drill(ctx: RunContext, strategy: Any, request: DrillRequest) -> LayerDrilldown:
        try:
            return bounded(lambda: strategy.drill(request))  # within the session's time limit
        except DebugFrameworkError:
            raise
        except Exception as exc:  # noqa: BLE001 - tracing a user's module may fail in its own code
            where = _crash_log(request.out_dir, strategy.name, exc)
            return DrillDownStage._empty(ctx, request.layer, request.checkpoint,
                                         f"the {strategy.name} drill-down failed: {type(exc).__name__}: {exc} "
                                         f"({where})", strategy.name)

    @staticmethod
    def _empty(ctx: RunContext, layer: int, checkpoint: str, note: str, method: str = "none") -> LayerDrilldown:
        return LayerDrilldown(layer=layer, checkpoint=checkpoint, backend=ctx.alternative.name, method=method,
                              note=note)


def _crash_log(out_dir: Path, strategy: str, exc: BaseException) -> str:
    """Write ``exc``'s traceback to ``<out_dir>/crash.log``; say where (or why it could not be)."""
    import traceback

    path = out_dir / "crash.log"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(f"the {strategy} drill-down strategy crashed:\n"
                        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), encoding="utf-8")
    except OSError as err:
        return f"its traceback could not be written to {path}: {err}"
    return f"traceback in {path}"


def _out_dir(ctx: RunContext, layer: int) -> Path:
    """``<session artifacts>/drilldown/layer_<n>`` (a temporary folder outside an engine run)."""
    root = current_artifact_root()
    if root is None:
        import tempfile

        root = Path(tempfile.mkdtemp(prefix=f"df-drill-{ctx.session.session_id}-"))
    return root / "drilldown" / f"layer_{layer}"
