"""The ``drill-down`` stage: inside the layers that diverge, which operator introduces the error.

Runs with ``drill_down: true``, after the verdicts are final (compare, isolation, oracle). The
layers drilled are the first divergence's layer and every layer isolation says introduces error;
for each, the reference's float64 input to that layer (its run kept the layer inputs) goes into a
:class:`~debug_framework.services.drilldown.DrillRequest`, and the first strategy of
:data:`~debug_framework.services.drilldown.STRATEGY_FACTORIES` that applies to the alternative
drills it. A first divergence at decode step s is drilled at that step: the reference's input to
the layer then, the tokens decoded and its past keys and values (kept by the decode stage,
:class:`~.context.StepInputs`) go into the request, for a strategy that drills steps
(``decode_steps``: the replay). No strategy, no layer input or a strategy failing: that layer's entry has an empty table
and a note saying why (never silently nothing).
"""

from __future__ import annotations

from pathlib import Path

from ...backends.artifacts import current_artifact_root
from ...errors import DebugFrameworkError
from ...models.session_config import SessionConfig
from ..drilldown import DrillRequest, DrillStrategy, LayerDrilldown, choose_strategy
from .context import RunContext, Stage
from .deadline import bounded

__all__ = ["DrillDownStage", "drill_targets"]


def drill_targets(ctx: RunContext) -> list[tuple[int, str, int]]:
    """``(layer, checkpoint, step)`` to drill: the first divergence's layer (at its decode step, 0 for
    the prefill), then each introducing layer of the prefill (at the checkpoint its first introducing
    block ends at) or, for a first divergence at decode step s, each layer that introduces error at
    s (replayed there), as the judge decided them."""
    verdict = ctx.verdict if ctx.verdict is not None else ctx.judge()
    targets: dict[int, tuple[str, int]] = {}
    first = verdict.first_divergence
    if first is not None and first.layer is not None:
        targets[first.layer] = (str(first), int(verdict.first_step or 0))
    for i, lv in sorted((verdict.layers or {}).items()):
        if lv.introduces and i not in targets:
            targets[i] = (f"{'post_attention' if lv.block == 'attention' else 'post_mlp'}:{i}", 0)
    step = int(verdict.first_step or 0)
    for i, j in sorted(verdict.decode_layers.items()):  # introducing at the first divergent decode step
        if not j.passed and i not in targets:
            key = next((k for (s, k), jk in verdict.steps.items()
                        if s == step and k.layer == i and not jk.passed), None)
            targets[i] = (str(key) if key is not None else f"post_mlp:{i}", step)
    return [(i, checkpoint, step) for i, (checkpoint, step) in sorted(targets.items())]


class DrillDownStage(Stage):
    """Op-level drill-down of the diverging layers (see the module's docstring)."""

    name = "drill-down"
    timing_key = "drilldown_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.drill_down

    def run(self, ctx: RunContext) -> None:
        targets = drill_targets(ctx)
        ctx.drilldown = []
        if not targets:
            return
        strategy, why = choose_strategy(ctx.alternative)
        for layer, checkpoint, step in targets:
            if strategy is None:
                ctx.drilldown.append(self._empty(ctx, layer, checkpoint, why, step=step))
                continue
            request = self._request(ctx, strategy, layer, checkpoint, step)
            ctx.drilldown.append(self._drill(ctx, strategy, request) if isinstance(request, DrillRequest) else request)

    def _request(self, ctx: RunContext, strategy: DrillStrategy, layer: int, checkpoint: str,
                 step: int) -> DrillRequest | LayerDrilldown:
        """What ``strategy`` is given to drill ``layer`` at ``step``: the reference's input to it then
        (and at a decode step the tokens and the reference's past); an entry saying why not where
        there is none, or where the strategy drills only the prefill."""
        past = None
        tokens = None
        if step:
            at = ctx.decode_inputs if ctx.decode_inputs is not None and ctx.decode_inputs.step == step else None
            if not getattr(strategy, "decode_steps", False):
                return self._empty(ctx, layer, checkpoint, f"the {strategy.name} drill-down runs a layer in one "
                                   f"forward pass: it cannot run layer {layer} at decode step {step}, where the error "
                                   "first shows (the replay drill-down of eager torch backends can)",
                                   strategy.name, step)
            hidden = None if at is None else at.hidden.get(layer)
            if at is not None:
                tokens, past = at.tokens, at.past.get(layer)
        else:
            hidden = ctx.reference_capture.layer_inputs.get(layer)
        if hidden is None:
            when = f" at decode step {step}" if step else ""
            return self._empty(ctx, layer, checkpoint, f"the reference backend {ctx.reference.name!r} did not record "
                               f"the input of layer {layer}{when}", strategy.name, step)
        return DrillRequest(layer=layer, checkpoint=checkpoint, backend=ctx.alternative, model=ctx.model,
                            inputs=ctx.inputs, hidden_in=hidden, dtype=ctx.plan.alternative_dtype,
                            device=ctx.plan.config.device, out_dir=_out_dir(ctx, layer, step),
                            noise_margin=ctx.plan.config.noise_margin,
                            floor_eps=ctx.plan.config.floor_eps, step=step, tokens=tokens, past=past,
                            quantization=ctx.plan.config.emulated_precision is not None)

    @staticmethod
    def _drill(ctx: RunContext, strategy: DrillStrategy, request: DrillRequest) -> LayerDrilldown:
        try:
            return bounded(lambda: strategy.drill(request))  # within the session's time limit
        except DebugFrameworkError:
            raise
        except Exception as exc:  # noqa: BLE001 - tracing a user's module may fail in its own code
            where = _crash_log(request.out_dir, strategy.name, exc)
            return DrillDownStage._empty(ctx, request.layer, request.checkpoint,
                                         f"the {strategy.name} drill-down failed: {type(exc).__name__}: {exc} "
                                         f"({where})", strategy.name, request.step)

    @staticmethod
    def _empty(ctx: RunContext, layer: int, checkpoint: str, note: str, method: str = "none",
               step: int = 0) -> LayerDrilldown:
        return LayerDrilldown(layer=layer, checkpoint=checkpoint, backend=ctx.alternative.name, method=method,
                              note=note, step=step)


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


def _out_dir(ctx: RunContext, layer: int, step: int = 0) -> Path:
    """``<session artifacts>/drilldown/layer_<n>`` (``layer_<n>_step_<s>`` at a decode step; a
    temporary folder outside an engine run)."""
    root = current_artifact_root()
    if root is None:
        import tempfile

        root = Path(tempfile.mkdtemp(prefix=f"df-drill-{ctx.session.session_id}-"))
    return root / "drilldown" / (f"layer_{layer}_step_{step}" if step else f"layer_{layer}")
