"""The compile pipeline shared by the mock backends and adapters.

    Dynamo FX graph ──save──> AOTAutograd (once) ──> forward / backward / inference ATen graphs
        each ATen graph: save, statistics, check constraints (strict: repro hook + raise; warn: log)
        then lower it: "eager" (run the ATen graph as is) or "inductor" (compile_fx_inner, trace
        captured into this run's directory) or an adapter's own compile.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
import torch
import torch.fx

from debug_framework.jsonio import JsonObject

from .artifacts import RunDirectory
from .constraints import Constraint, GraphReport, Violation, as_constraint, check_graph
from .errors import ConstraintViolationError
from .repro import ReproRequest, write_repro
from .stats import graph_statistics, graph_svg

__all__ = ["CompilePipeline", "CapturedGraph", "Lowering"]

log = logging.getLogger("debug_module.constraints")

#: ``lower(aten_gm, example_inputs, kind) -> boxed callable``; kind is forward/backward/inference.
Lowering = Callable[[torch.fx.GraphModule, Sequence[object], str], Callable[..., object]]

_KERNEL_RE = re.compile(
    r"^(?P<name>\w+) = async_compile\.(?P<kind>cpp_pybinding|cpp|triton)\((?P<args>.*?)r?'''(?P<src>.*?)'''",
    re.S | re.M,
)


@dataclass
class CapturedGraph:
    """One captured graph: ``kind`` is ``fx`` (pre-AOT Dynamo graph), ``forward``, ``backward`` or ``inference``."""

    name: str
    kind: str
    graph_module: torch.fx.GraphModule
    statistics: JsonObject
    report: GraphReport | None = None
    files: list[str] = field(default_factory=list)


def _readable(gm: torch.fx.GraphModule) -> str:
    try:
        return gm.print_readable(print_output=False, include_stride=True, include_device=True)
    except Exception:  # pragma: no cover - very old graphs
        return gm.code


class CompilePipeline:
    """A torch.compile backend: ``pipeline(gm, example_inputs) -> callable``.

    Args:
        constraints: constraints checked on every ATen graph; ``[]`` means none.
        strict: raise :class:`ConstraintViolationError` (after calling the repro hook) on violations;
            otherwise log them through ``logging`` (logger ``debug_module.constraints``) and record them.
        lowering: ``"eager"``, ``"inductor"`` or a :data:`Lowering` callable.
        artifact_root: where this backend's run directory is created (``None``: keep everything in
            memory only). The run directory is created at the first compiled graph.
        decompositions: ``"inductor"``, ``"core_aten"`` or ``None`` (AOTAutograd's own).
        svg: also write SVG drawings of graphs (needs pydot + graphviz; skipped with a note otherwise).
        inductor_passes: partition with Inductor's partitioner and run its joint-graph passes on
            inference graphs, so the checked graphs are the ones Inductor compiles (default: only
            when ``lowering="inductor"``; needed by any lowering that calls ``compile_fx_inner``).
    """

    def __init__(
        self,
        *,
        constraints: Sequence[Constraint | Callable[..., object]],
        strict: bool,
        lowering: str | Lowering = "eager",
        artifact_root: str | Path | None = None,
        decompositions: str | None = "inductor",
        svg: bool = False,
        name: str = "debug_module",
        inductor_passes: bool | None = None,
    ) -> None:
        self.constraints = [as_constraint(c) for c in constraints]
        self.strict = strict
        self.lowering = lowering
        self.artifact_root = Path(artifact_root) if artifact_root is not None else None
        self.decompositions = decompositions
        self.svg = svg
        self.name = name
        self.inductor_passes = (lowering == "inductor") if inductor_passes is None else inductor_passes
        self.run: RunDirectory | None = None
        self.graphs: list[CapturedGraph] = []
        self.reports: list[GraphReport] = []
        self._counter = itertools.count()

    # ------------------------------------------------------------------ public results

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.reports for v in r.violations]

    @property
    def run_dir(self) -> Path | None:
        return self.run.path if self.run is not None else None

    def coverage_summary(self) -> str:
        return "\n".join(r.summary() for r in self.reports)

    # ------------------------------------------------------------------ backend entry

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable[..., object]:
        from debug_framework._torch import functorch

        index = next(self._counter)
        base = f"graph_{index:03d}"
        if self.artifact_root is not None and self.run is None:
            self.run = RunDirectory(self.artifact_root, backend=self.name,
                                    info={"strict": self.strict, "constraints": [c.describe() for c in self.constraints]})
        fx = CapturedGraph(base, "fx", gm, graph_statistics(gm))
        self.graphs.append(fx)
        if self.run is not None:
            fx.files.append(self.run.write_text(f"fx_graphs/{base}.py", _readable(gm), kind="fx_graph", graph=base).name)
            self.run.write_json(f"statistics/{base}.json", fx.statistics, kind="statistics", graph=base)
            self._maybe_svg(gm, base, "fx_graphs")

        def compiler_for(kind: str) -> Callable[..., object]:
            def compiler(aot_gm: torch.fx.GraphModule, aot_inputs: Sequence[object]) -> Callable[..., object]:
                return self._compile_aten(aot_gm, aot_inputs, kind=kind, name=f"{base}_{kind}",
                                          fx_gm=gm, fx_inputs=example_inputs)
            return compiler

        decomps = None
        partition: str | Callable[..., object] = "min_cut"
        if self.inductor_passes:
            from debug_framework._torch import inductor
            partition = inductor.partition_fn
        if self.decompositions == "inductor":
            from debug_framework._torch import inductor
            decomps = inductor.inductor_decompositions()
        elif self.decompositions == "core_aten":
            decomps = functorch.core_aten_decompositions()
        context: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if self.inductor_passes:
            from debug_framework._torch import inductor
            context = inductor.compile_context(example_inputs)
        try:
            with context:
                compiled = functorch.aot_compile(
                    gm, example_inputs,
                    fw_compiler=compiler_for("forward"),
                    bw_compiler=compiler_for("backward"),
                    inference_compiler=compiler_for("inference"),
                    decompositions=decomps,
                    partition=partition,
                )
        except Exception as e:
            if self.run is not None:
                self.run.set_status("failed", error=f"{type(e).__name__}: {str(e)[:2000]}")
            raise
        if self.run is not None:
            self.run.set_status("complete", graphs_compiled=index + 1)
        return compiled

    # ------------------------------------------------------------------ one ATen graph

    def _compile_aten(self, aot_gm: torch.fx.GraphModule, aot_inputs: Sequence[object], *, kind: str, name: str,
                      fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[object]) -> Callable[..., object]:
        if kind == "inference" and self.inductor_passes:
            from debug_framework._torch import inductor

            # Check the graph Inductor will really compile (training graphs got these passes in the partitioner).
            aot_gm = inductor.prepare_inference_graph(aot_gm, aot_inputs)
        stats = graph_statistics(aot_gm)
        report = check_graph(aot_gm, self.constraints, name)
        captured = CapturedGraph(name, kind, aot_gm, stats, report)
        self.graphs.append(captured)
        self.reports.append(report)
        run = self.run
        if run is not None:
            run.write_text(f"aot_graphs/{name}.py", _readable(aot_gm), kind="aot_graph", graph=name)
            run.write_json(f"statistics/{name}.json", stats, kind="statistics", graph=name)
            run.write_json(f"reports/{name}.constraints.json", report.to_dict(), kind="constraint_report", graph=name)
            self._maybe_svg(aot_gm, name, "aot_graphs")
            run.add_graph({"name": name, "kind": kind, "nodes": stats["nodes"],
                           "violations": len(report.violations), "coverage": report.coverage.to_dict(),
                           "peak_memory_bytes": (stats["memory"] or {}).get("peak_bytes")})

        if report.violations:
            if self.strict:
                repro = write_repro(ReproRequest(fx_graph=fx_gm, example_inputs=fx_inputs, aten_graph=aot_gm,
                                                 graph_name=name, violations=report.violations,
                                                 constraints=self.constraints,
                                                 run_dir=run.path if run is not None else None, run=run))
                raise ConstraintViolationError(report.violations, graph=name,
                                               run_dir=str(run.path) if run is not None else None,
                                               repro_path=str(repro) if repro is not None else None)
            shown = report.violations[:50]
            more = len(report.violations) - len(shown)
            log.warning("%s: %d constraint violation(s) (warn mode)\n%s%s", name, len(report.violations),
                        "\n".join("  " + v.describe() for v in shown),
                        f"\n  ... and {more} more (see the constraint report)" if more else "")
        log.info("%s", report.summary())
        return self._lower(aot_gm, aot_inputs, kind, name)

    def _lower(self, aot_gm: torch.fx.GraphModule, aot_inputs: Sequence[object], kind: str, name: str) -> Callable[..., object]:
        from debug_framework._torch import functorch

        if self.lowering == "eager":
            return functorch.make_boxed_func(aot_gm.forward)
        if self.lowering == "inductor":
            from debug_framework._torch import inductor

            if self.run is None:
                return inductor.compile_graph(aot_gm, aot_inputs, is_backward=kind == "backward",
                                              is_inference=kind == "inference")
            scratch = self.run.scratch_dir(name)
            try:
                with inductor.trace_into(scratch, svg=self.svg) as trace_root:
                    compiled = inductor.compile_graph(aot_gm, aot_inputs, is_backward=kind == "backward",
                                                      is_inference=kind == "inference")
                self._collect_inductor_trace(trace_root, name)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
                try:
                    scratch.parent.rmdir()
                except OSError:
                    pass
            return compiled
        return self.lowering(aot_gm, aot_inputs, kind)  # type: ignore[operator]

    def _collect_inductor_trace(self, trace_root: Path, name: str) -> None:
        from debug_framework._torch.inductor import TRACE_FILES

        assert self.run is not None
        dirs = sorted(p for p in trace_root.glob("*") if p.is_dir()) if trace_root.exists() else []
        for d in dirs:
            for f in sorted(d.iterdir()):
                if not f.is_file():
                    continue
                if f.name == "output_code.py":
                    self.run.copy_in(f, f"inductor_kernels/{name}/output_code.py", kind="inductor_output_code", graph=name)
                    for m in _KERNEL_RE.finditer(f.read_text(encoding="utf-8")):
                        ext = "py" if m["kind"] == "triton" else "cpp"
                        self.run.write_text(f"inductor_kernels/{name}/{m['name']}.{ext}", m["src"].strip("\n") + "\n",
                                            kind="inductor_kernel", graph=name)
                elif f.name in TRACE_FILES:
                    self.run.copy_in(f, f"inductor_ir/{name}/{f.name}", kind=TRACE_FILES[f.name], graph=name)
                elif f.suffix in (".svg", ".dot"):
                    self.run.copy_in(f, f"inductor_ir/{name}/{f.name}", kind="inductor_graph_diagram", graph=name)

    def _maybe_svg(self, gm: torch.fx.GraphModule, name: str, sub: str) -> None:
        if not self.svg or self.run is None:
            return
        target = self.run.path / sub / f"{name}.svg"
        why_not = graph_svg(gm, name, target)
        if why_not is None:
            self.run.record(f"{sub}/{name}.svg", "svg", name)
        else:
            self.run.set_status(self.run.manifest["status"], svg_skipped=why_not)
