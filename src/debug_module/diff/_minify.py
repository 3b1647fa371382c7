"""Hand an accuracy failure found by KernelDiff to the minifier (``debug_module.minifier``).

The failing Dynamo graphs are the ones the test backend compiled (recorded by the harness's timing
wrapper, with clones of the example inputs Dynamo gave the backend). Each is checked with the
minifier's ``AccuracySignature`` (same backend, the judgement that failed: in float64 mode the same
ratio rule, ``RatioRule.verdict``, with eager as the baseline, else the tolerance; the harness's
``test_backend_spec`` tells the repro how to import the backend), narrowed to the classes of failure
the graph shows (shape, dtype, non-finite values, values); the first graph on which the failure
reproduces in isolation is minified and its repro directory linked.

A gradient-only failure (forward outputs agree) is minified on the AOT backward graph: each Dynamo
graph is run once through AOTAutograd (forward as is), a weighted sum of its floating outputs is
back-propagated, and the backward graph, with the saved tensors and tangents it was called with, is
judged by the same signature (the backend compiles it as it compiles any graph).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from debug_framework.jsonio import JsonObject

if TYPE_CHECKING:
    from ..artifacts import RunDirectory
    from ..minifier import AccuracySignature
    from debug_framework.comparison import RatioRule
    from debug_framework.measure import TimedBackend

    from .report import DiffReport, TensorDiff

log = logging.getLogger(__name__)


class HarnessSettings(Protocol):
    """What the hand-off reads of the :class:`~debug_module.diff.KernelDiffHarness` (described here:
    the harness imports this module, not the reverse)."""

    model_name: str
    float64: bool
    ratio_rule: RatioRule
    test_backend_spec: str | None
    minify_max_seconds: float
    seed: int


class CompiledSide(Protocol):
    """What the hand-off reads of the harness's test side: its backend and the graphs it compiled."""

    backend_spec: str | Callable[..., object]
    timed: TimedBackend | None


def _backward_graphs(gm: torch.fx.GraphModule, inputs: Sequence[object], seed: int) -> list[tuple[torch.fx.GraphModule, list[object]]]:
    """The AOT backward graph(s) of ``gm`` with the arguments they were called with (clones), from one
    forward and backward pass on fresh clones of ``inputs``; empty when nothing needs a gradient."""
    from debug_framework._torch import functorch

    from ..minifier import _runtime

    recorded: list[tuple[torch.fx.GraphModule, list[object]]] = []

    def forward_compiler(g: torch.fx.GraphModule, _example: Sequence[object]) -> Callable[..., object]:
        return functorch.make_boxed_func(g.forward)

    def backward_compiler(g: torch.fx.GraphModule, _example: Sequence[object]) -> Callable[[list[object]], object]:
        def run(args: list[object]) -> object:
            recorded.append((g, _runtime.fresh(args)))
            return g(*args)

        run._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd passes a list
        return run

    args = _runtime.fresh(inputs)
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return []
    compiled = functorch.aot_compile(gm, args, fw_compiler=forward_compiler, bw_compiler=backward_compiler)
    with torch.enable_grad():
        out = compiled(*args)
        leaves = [o for o in _runtime._tensors(out) if o.is_floating_point() and o.requires_grad]
        if not leaves:
            return []
        g = torch.Generator().manual_seed(seed)
        loss = sum((o * torch.randn(o.shape, generator=g).to(o.dtype)).sum() for o in leaves)
        loss.backward()  # type: ignore[union-attr]
    return recorded


def _signature(harness: HarnessSettings, test: CompiledSide, failing: TensorDiff) -> AccuracySignature:
    from ..minifier import AccuracySignature

    tol = failing.result.tolerance
    return AccuracySignature(test.backend_spec, reference="float64" if harness.float64 else "eager", rtol=tol.rtol,
                             atol=tol.atol, backend_spec=getattr(harness, "test_backend_spec", None),
                             ratio=harness.ratio_rule if harness.float64 else None)


def _minify_one(harness: HarnessSettings, sig: AccuracySignature, gm: torch.fx.GraphModule, inputs: list[object],
                run: RunDirectory | None, label: str, graph: int, errors: list[str]) -> JsonObject | None:
    """Minify one graph when the failure reproduces on it in isolation; ``None`` when it does not (a run
    of the graph that raised, the reference's or the backend's, is added to ``errors``)."""
    from ..minifier import Minifier

    holds, obs = sig.check(gm, inputs)
    if not holds:
        if obs.get("error"):
            errors.append(f"{label}: {obs['error']}"[:400])
        return None
    sig = sig.for_failure(obs)  # the same bug at every step: its class of failure, not any difference
    out_dir = (Path(run.path) / "repros" / label) if run is not None else None
    result = Minifier(gm, inputs, sig, progress=False, max_seconds=harness.minify_max_seconds, output_dir=out_dir,
                      title=f"KernelDiff accuracy failure: {harness.model_name}").minify()
    repro = str(result.repro_path) if result.repro_path else None
    if run is not None and result.repro_path:
        # repro_path is <dir>/repro.py: record every file of its directory (inputs, backend copy...)
        run.record_tree(Path(result.repro_path).parent.relative_to(run.path).as_posix(), "repro", label)
    detail = "; ".join([result.summary(), *result.notes])  # notes: why a repro is missing/unverified
    return {"status": "ran", "graph": graph, "repro": repro, "verified": result.verified, "detail": detail,
            "signature": sig.describe(), "failures": sig.failures, "original_nodes": result.original_nodes,
            "nodes": result.nodes, "oracle_calls": result.calls, "seconds": round(result.seconds, 3)}


def minify_accuracy_failure(harness: HarnessSettings, test: CompiledSide, report: DiffReport,
                            run: RunDirectory | None) -> JsonObject:
    """The minifier's outcome for a failing report (``status``: ran / not_reproduced / skipped / failed;
    with ``ran``: the graph, ``stage`` forward or backward, the repro and whether it was verified)."""
    if not harness.model_name or test.timed is None or not test.timed.graphs:
        return {"status": "skipped", "detail": "the test side compiled no graph (nothing to minify)"}
    failing = [d for d in report.outputs if not d.passed]
    stage = "forward"
    if not failing:
        failing = [d for d in report.gradients if not d.passed]
        stage = "backward"
    if not failing:
        return {"status": "skipped", "detail": _nothing_to_minify(report)}
    errors: list[str] = []
    try:
        sig = _signature(harness, test, failing[0])
        for i, (gm, inputs) in enumerate(test.timed.graphs):
            if stage == "forward":
                found = _minify_one(harness, sig, gm, inputs, run, f"accuracy_graph_{i:03d}", i, errors)
                if found is not None:
                    return {**found, "stage": stage}
                continue
            for j, (bw, bw_inputs) in enumerate(_backward_graphs(gm, inputs, harness.seed)):
                found = _minify_one(harness, sig, bw, bw_inputs, run, f"accuracy_graph_{i:03d}_backward_{j}", i, errors)
                if found is not None:
                    return {**found, "stage": stage}
    except Exception as e:  # noqa: BLE001 - report, never mask the KernelDiff result
        log.debug("minifier failed", exc_info=True)
        return {"status": "failed", "stage": stage, "detail": f"{type(e).__name__}: {e}"[:600]}
    return {"status": "not_reproduced", "stage": stage, "detail": _not_reproduced(stage, len(test.timed.graphs), errors)}


def _nothing_to_minify(report: DiffReport) -> str:
    """Why a failing report has no tensor to minify on: its outputs differ in structure."""
    parts = [f"{what}: {', '.join(names[:5])}" for what, names in (("missing", report.missing), ("extra", report.extra))
             if names]
    if parts:
        return (f"no repro: the outputs differ in structure ({'; '.join(parts)}), not in value; a value repro "
                "needs the same outputs on both sides")
    return "no output or gradient failed (nothing to minify)"


def _not_reproduced(stage: str, graphs: int, errors: list[str]) -> str:
    """The line a failing diff ends in when no isolated graph reproduces it: what was tried and why a
    one-graph repro cannot show this failure."""
    ran = f" (a run failed there: {errors[0]})" if errors else ""
    if stage == "forward":
        return (f"no repro: the forward failure did not reproduce on any of {graphs} compiled graph(s) in isolation"
                f"{ran}; it needs the graphs run together (a graph's inputs come from the graphs before it) or "
                "state the backend keeps between graphs, which a one-graph repro cannot hold")
    return (f"no repro: the backward failure did not reproduce on any of {graphs} compiled graph(s)' AOT backward "
            f"graphs in isolation{ran}; the backend computes those backward graphs correctly when given each "
            "alone, so the gradients go wrong only in its joint forward-and-backward compile (its AOTAutograd "
            "backward compiler), which a one-graph repro cannot hold: debug that compiler with "
            "`inductor-debug diff --gradients` on the smallest model that shows it")
