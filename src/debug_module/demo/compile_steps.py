"""The tour's first three steps: constraint checking, FX/AOT capture, Inductor IR.

Each compiles the tiny model through debug_module's own backends (:mod:`debug_module.pipeline`) into a
new run directory under the tour's ``runs/`` folder; nothing here re-implements them.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .context import MODEL_NAME, StepResult, TourContext, quiet_constraint_log

if TYPE_CHECKING:
    from ..constraints import Violation
    from ..pipeline import CompilePipeline

__all__ = ["run_constraints", "run_capture", "run_inductor"]

_SCHEDULER_NODE_NAME = re.compile(r"^(\S+): (\w*)SchedulerNode\(", re.M)


def _mark(pipeline: CompilePipeline, step: str) -> Path:
    """Name the model and the step in the run's manifest; the run's path."""
    pipeline.run.set_status("complete", model=MODEL_NAME, tour_step=step)
    return Path(pipeline.run_dir)


def _short_op(op: str) -> str:
    """``aten.view.default`` -> ``view``; ``torch._C._nn.linear`` -> ``linear``."""
    parts = op.split(".")
    return parts[1] if parts[0] in ("aten", "prims") and len(parts) > 1 else parts[-1]


def _where(v: Violation) -> str:
    if v.source is None:
        return "a graph input or parameter" if v.op in (None, "placeholder") else "no source line"
    return f"{Path(v.source.file).name}:{v.source.line}"


def run_constraints(ctx: TourContext) -> StepResult:
    """Compile in warn mode with the mock accelerator's constraints (plus the knobs'); list the violations."""
    import torch

    from ..backend.mock import make_mock_backend
    from ..config import MockConfig
    from ..constraints import OpDenylistConstraint

    k = ctx.knobs
    constraints = MockConfig(alignment=k.alignment).constraints()
    if k.deny_ops:
        constraints.append(OpDenylistConstraint(k.deny_ops))
    model, inputs = ctx.model_and_inputs()
    backend = make_mock_backend(strict=False, constraints=constraints, artifact_root=ctx.runs_root)
    torch.compiler.reset()
    with torch.no_grad(), quiet_constraint_log():
        torch.compile(model, backend=backend)(**inputs)
    run_dir = _mark(backend.pipelines[0], "constraints")
    violations = backend.violations
    nodes = sum(r.coverage.nodes for r in backend.reports)
    supported = sum(r.coverage.supported_nodes for r in backend.reports)
    kinds = Counter(v.constraint for v in violations)
    lines = [f"{len(backend.reports)} ATen graph(s), {nodes} nodes checked against {len(constraints)} constraints",
             f"{len(violations)} violation(s)" + (": " + ", ".join(f"{n} {c}" for c, n in kinds.most_common())
                                                   if violations else ""),
             f"coverage: {supported}/{nodes} nodes run on the accelerator ({supported / max(nodes, 1):.0%})"]
    seen: set[str] = set()
    for v in violations:
        if v.constraint not in seen:  # one example per constraint, with the source line that made it
            seen.add(v.constraint)
            lines.append(f"  e.g. [{v.constraint}] {v.message} at {_where(v)} (op {v.op})")
    return StepResult("ok", ran=f"torch.compile(tiny BERT, backend=make_mock_backend(strict=False, "
                                f"alignment={k.alignment}, deny_ops={list(k.deny_ops)}))",
                      lines=lines,
                      artifacts={"run": run_dir, "constraint reports": run_dir / "reports"},
                      data={"violations": len(violations), "by_constraint": dict(kinds), "run": str(run_dir),
                            "headline": lines[1]})


def run_capture(ctx: TourContext) -> StepResult:
    """A training step through GuardInspector and the mock backend: Dynamo's FX graph, AOTAutograd's
    forward and backward ATen graphs, statistics, guards and graph breaks."""
    import torch

    from ..backend.mock import make_mock_backend
    from ..guards import GuardInspector
    from ..reports import save_guard_report

    model, inputs = ctx.model_and_inputs()
    model.train()
    backend = make_mock_backend(strict=False, constraints=[], artifact_root=ctx.runs_root)
    torch.compiler.reset()
    inspector = GuardInspector(model, backend=backend)
    inspector(**inputs).last_hidden_state.sum().backward()
    pipeline = backend.pipelines[0]
    run_dir = _mark(pipeline, "capture")
    guards = inspector.report()
    save_guard_report(guards, pipeline.run)
    lines = [f"Dynamo: {guards.graph_count} FX graph(s), {guards.graph_break_count} graph break(s), "
             f"{len(guards.recompilations)} recompilation(s)"]
    artifacts: dict[str, Path] = {"run": run_dir, "guards": run_dir / "reports" / "guards.json"}
    for g in pipeline.graphs:
        top = ", ".join(f"{_short_op(op)} x{n}" for op, n in Counter(g.statistics.get("op_counts", {})).most_common(4))
        lines.append(f"{g.kind:>9} graph {g.name}: {g.statistics['nodes']} nodes; top ops: {top}")
        sub = "fx_graphs" if g.kind == "fx" else "aot_graphs"
        artifacts[f"{g.kind} graph"] = run_dir / sub / f"{g.name}.py"
    return StepResult("ok", ran="GuardInspector(tiny BERT, backend=make_mock_backend(strict=False)); forward + backward",
                      lines=lines, artifacts=artifacts,
                      data={"graphs": [g.name for g in pipeline.graphs], "graph_breaks": guards.graph_break_count,
                            "headline": f"{len(pipeline.graphs)} graphs captured; " + lines[0]})


#: Kernels listed by name per graph (the rest are counted, with their folder).
_KERNELS_LISTED = 8


def scheduler_nodes(ir_text: str) -> int:
    """The scheduler nodes of an Inductor IR dump: after fusion, a fused node (``op1_op2: ...Fused
    SchedulerNode``) counts once and the nodes it lists as its parts (``op1: SchedulerNode``) do not."""
    names = [m.group(1) for m in _SCHEDULER_NODE_NAME.finditer(ir_text)]
    fused = {m.group(1) for m in _SCHEDULER_NODE_NAME.finditer(ir_text) if "Fused" in m.group(2)}
    parts = {part for name in fused for part in name.split("_")}
    return sum(1 for n in names if n in fused or n not in parts)


def run_inductor(ctx: TourContext) -> StepResult:
    """AOTAutograd + Inductor (aot_mock_backend, warn mode): the scheduler's IR before and after fusion
    and the generated kernels, copied into the run."""
    import torch

    from ..aot_backend.mock import aot_mock_backend

    model, inputs = ctx.model_and_inputs()
    backend = aot_mock_backend(strict=False, constraints=[], artifact_root=ctx.runs_root)
    torch.compiler.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(**inputs)
    run_dir = _mark(backend, "inductor")
    lines: list[str] = []
    artifacts: dict[str, Path] = {"run": run_dir}
    kernels_total = 0
    for ir_dir in sorted((run_dir / "inductor_ir").iterdir()):
        pre, post = (ir_dir / "ir_pre_fusion.txt", ir_dir / "ir_post_fusion.txt")
        kdir = run_dir / "inductor_kernels" / ir_dir.name
        kernels = sorted(p for p in kdir.glob("*") if p.name != "output_code.py") if kdir.is_dir() else []
        kernels_total += len(kernels)
        counts = [scheduler_nodes(p.read_text(encoding="utf-8")) if p.is_file() else 0 for p in (pre, post)]
        lines.append(f"{ir_dir.name}: {counts[0]} scheduler nodes before fusion, {counts[1]} after; "
                     f"{len(kernels)} generated kernel(s)")
        lines += [f"  kernel {p.stem}" for p in kernels[:_KERNELS_LISTED]]
        if len(kernels) > _KERNELS_LISTED:
            lines.append(f"  ... and {len(kernels) - _KERNELS_LISTED} more kernel(s) in {kdir}")
        artifacts.update({"IR pre-fusion": pre, "IR post-fusion": post, "output code": kdir / "output_code.py"})
    return StepResult("ok", ran="torch.compile(tiny BERT, backend=aot_mock_backend(strict=False)): AOTAutograd + "
                                "Inductor's compile_fx_inner", lines=lines, artifacts=artifacts,
                      data={"kernels": kernels_total, "run": str(run_dir), "headline": lines[0] if lines else ""})
