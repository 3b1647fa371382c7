"""KernelDiff results: one :class:`TensorDiff` per compared tensor, gathered in a :class:`DiffReport`."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from debug_framework.comparison import ComparisonResult
from debug_framework.jsonio import JsonObject, json_safe
from debug_framework.reports import neutralise_bidi

from ..reports._kerneldiff import exact_match_of

__all__ = ["TensorDiff", "DiffReport", "REPORT_SCHEMA"]

#: ``schema`` field of a saved KernelDiff report.
REPORT_SCHEMA = "debug_module.kerneldiff/1"


def _fmt(v: object) -> str:
    return f"{v:.3e}" if isinstance(v, int | float) and not isinstance(v, bool) else "n/a"


def _ratio_text(ratio: dict[str, float | str | bool | JsonObject | None]) -> str:
    """The ratio rule's line: the judged metric against its bound with the comparison sign that holds
    (``<=`` within it, ``>`` over it, ``vs`` when unmeasured), eager's single-run error, and where
    the measured noise widened the bound, by how much."""
    test, bound = ratio.get("test_error"), ratio.get("bound")
    metric = "RMSE" if ratio.get("metric", "rmse") == "rmse" else str(ratio.get("metric"))
    if isinstance(test, int | float) and isinstance(bound, int | float) and not math.isnan(test):
        sign = "<=" if test <= bound else ">"
    else:
        sign = "vs"
    text = f"{metric} vs float64: test {_fmt(test)} {sign} bound {_fmt(bound)} (eager {_fmt(ratio.get('eager_error'))})"
    noise = ratio.get("noise")
    if isinstance(noise, dict) and noise.get("widened"):
        text += (f" [bound widened x{_fmt_g(noise.get('widening'))} from {_fmt(noise.get('single_run_bound'))} by "
                 f"the measured noise of {noise.get('runs')} eager runs on inputs perturbed within rounding]")
    elif isinstance(noise, dict):
        text += f" [{noise.get('runs')} eager runs on perturbed inputs: no more noise than the single run]"
    return text


def _fmt_g(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, int | float) else "n/a"


@dataclass
class TensorDiff:
    """One compared tensor: a forward output leaf, a gradient, or a submodule's output.

    ``result`` is the comparison core's result for the worst run (test against reference).
    ``rule`` is ``"tolerance"`` (the result's own verdict) or ``"ratio"`` (float64 reference:
    ``test_error <= multiplier * eager_error + floor``, errors as RMSE against float64; the numbers
    are in ``ratio``; ``baseline`` is float32 eager against float64).
    ``run_max_abs_errors`` holds the max absolute error of every run (mean/spread below).
    """

    name: str
    kind: str  # "output" | "gradient" | "module"
    passed: bool
    result: ComparisonResult
    rule: str = "tolerance"
    baseline: ComparisonResult | None = None
    ratio: dict[str, float | str | bool | JsonObject | None] | None = None
    run_max_abs_errors: list[float | None] = field(default_factory=list)
    reason: str | None = None
    module: str | None = None  # for kind == "module": the submodule's qualified name
    #: with a float64 reference: whether the test is bit-identical to float32 eager (same dtype) in every run
    identical_to_eager: bool | None = None

    @property
    def max_abs_error(self) -> float | None:
        return self.result.max_abs_error

    @property
    def error_mean(self) -> float | None:
        vals = [v for v in self.run_max_abs_errors if v is not None and math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    @property
    def error_std(self) -> float | None:
        vals = [v for v in self.run_max_abs_errors if v is not None and math.isfinite(v)]
        if len(vals) < 2:
            return None
        m = sum(vals) / len(vals)
        return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))

    @property
    def has_nonfinite(self) -> bool:
        r = self.result
        return bool(r.nan_count_ref or r.nan_count_alt or r.inf_count_ref or r.inf_count_alt)

    def line(self) -> str:
        r = self.result
        verdict = "PASS" if self.passed else "FAIL"
        parts = [f"{verdict} {self.kind:<8} {self.name}"]
        if not r.shape_match:
            parts.append(f"({r.reason})")
            return " ".join(parts)
        parts.append(f"max_abs={_fmt(r.max_abs_error)} mean_abs={_fmt(r.mean_abs_error)} "
                     f"max_rel={_fmt(r.max_rel_error)} rmse={_fmt(r.rmse)} mismatch={r.mismatch_percent:.4g}%")
        if self.ratio is not None:
            parts.append(_ratio_text(self.ratio))
        if len(self.run_max_abs_errors) > 1:
            parts.append(f"runs: mean {_fmt(self.error_mean)} std {_fmt(self.error_std)}")
        if r.worst:
            parts.append(f"worst at {tuple(r.worst[0].index)}")
        if self.has_nonfinite:
            parts.append(f"NaN ref/test {r.nan_count_ref}/{r.nan_count_alt}, Inf ref/test {r.inf_count_ref}/{r.inf_count_alt}")
        if self.reason and not self.passed:
            parts.append(f"-- {self.reason}")
        return " ".join(parts)

    def to_dict(self) -> JsonObject:
        r = self.result
        return json_safe({
            "name": self.name,
            "kind": self.kind,
            "module": self.module,
            "passed": self.passed,
            "rule": self.rule,
            "reason": self.reason,
            "max_abs_error": r.max_abs_error,
            "mean_abs_error": r.mean_abs_error,
            "max_rel_error": r.max_rel_error,
            "rmse": r.rmse,
            "mismatch_percent": r.mismatch_percent,
            "nan_count_reference": r.nan_count_ref,
            "nan_count_test": r.nan_count_alt,
            "inf_count_reference": r.inf_count_ref,
            "inf_count_test": r.inf_count_alt,
            "run_max_abs_errors": list(self.run_max_abs_errors),
            "error_mean": self.error_mean,
            "error_std": self.error_std,
            "ratio": self.ratio,
            "identical_to_eager": self.identical_to_eager,
            "comparison": r.to_dict(json_compatible=True),
            "baseline": self.baseline.to_dict(json_compatible=True) if self.baseline is not None else None,
        })


@dataclass
class DiffReport:
    """What :meth:`KernelDiffHarness.compare` found. ``passed`` is the verdict over every compared tensor
    (outputs, gradients when asked; submodule outputs only localise, they do not decide)."""

    model_name: str
    run_id: str
    created: str
    reference_backend: str
    test_backend: str
    mode: str  # "tolerance" | "float64-ratio"
    runs: int
    outputs: list[TensorDiff] = field(default_factory=list)
    gradients: list[TensorDiff] = field(default_factory=list)
    modules: list[TensorDiff] = field(default_factory=list)
    module_order: list[str] = field(default_factory=list)
    modules_not_captured: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # leaves the test side lacks
    extra: list[str] = field(default_factory=list)  # leaves only the test side has
    timing: JsonObject = field(default_factory=dict)
    nondeterminism: dict[str, dict[str, float]] = field(default_factory=dict)
    observer_effect: dict[str, float | str] | None = None
    tolerance: JsonObject = field(default_factory=dict)
    environment: JsonObject = field(default_factory=dict)
    visualizations: list[str] = field(default_factory=list)
    minifier: JsonObject = field(default_factory=dict)
    artifact_dir: str | None = None
    json_path: str | None = None

    @property
    def passed(self) -> bool:
        return (not self.missing and not self.extra and all(d.passed for d in self.outputs)
                and all(d.passed for d in self.gradients))

    @property
    def forward_passed(self) -> bool:
        return not self.missing and not self.extra and all(d.passed for d in self.outputs)

    @property
    def gradients_passed(self) -> bool | None:
        return all(d.passed for d in self.gradients) if self.gradients else None

    @property
    def failed(self) -> list[TensorDiff]:
        return [d for d in self.outputs + self.gradients if not d.passed]

    @property
    def first_divergent_module(self) -> str | None:
        """The first submodule, in eager execution order (a module counts when its forward returns),
        whose output diverges; ``None`` if none does or modules were not compared."""
        failing = {d.module for d in self.modules if not d.passed}
        for name in self.module_order:
            if name in failing:
                return name
        return None

    @property
    def exact_match(self) -> bool:
        """Every compared tensor bit-identical (see :func:`~debug_module.reports._kerneldiff.exact_match_of`):
        no error plot is drawn and the report says "exact match" in one line."""
        return exact_match_of(self.to_dict())

    @property
    def repro_path(self) -> str | None:
        return self.minifier.get("repro")

    @property
    def nonfinite(self) -> list[dict[str, str | int]]:
        out = []
        for d in self.outputs + self.gradients + self.modules:
            if d.has_nonfinite:
                r = d.result
                out.append({"name": d.name, "kind": d.kind, "nan_reference": r.nan_count_ref, "nan_test": r.nan_count_alt,
                            "inf_reference": r.inf_count_ref, "inf_test": r.inf_count_alt})
        return out

    def summary(self) -> str:
        head = (f"KernelDiff {self.model_name}: {'PASS' if self.passed else 'FAIL'} "
                f"({self.test_backend} vs {self.reference_backend}, {self.mode}, {self.runs} run(s))")
        lines = [head]
        if self.exact_match:
            lines.append(f" exact match: all {len(self.outputs) + len(self.gradients) + len(self.modules)} compared "
                         "tensors are bit-identical")
        for section, items in (("outputs", self.outputs), ("gradients", self.gradients)):
            if items:
                bad = sum(not d.passed for d in items)
                lines.append(f" {section}: {len(items) - bad}/{len(items)} passed")
                lines += [f"  {d.line()}" for d in items]
        lines += [f"  missing on test side: {k}" for k in self.missing]
        lines += [f"  extra on test side: {k}" for k in self.extra]
        if self.modules:
            bad = sorted({d.module for d in self.modules if not d.passed}, key=self.module_order.index)
            lines.append(f" modules: {len(self.module_order)} compared, {len(bad)} diverge; "
                         f"first divergent: {self.first_divergent_module or 'none'}")
            for d in self.modules:
                if not d.passed:
                    lines.append(f"  {d.line()}")
            if self.modules_not_captured:
                lines.append(f"  not captured on the test side: {', '.join(self.modules_not_captured)}")
            if self.observer_effect and self.observer_effect.get("max_abs_error"):
                lines.append(f"  note: module hooks changed the compiled output by up to "
                             f"{_fmt(self.observer_effect['max_abs_error'])} (fusion boundaries moved)")
        for nf in self.nonfinite:
            lines.append(f" non-finite in {nf['kind']} {nf['name']}: NaN ref/test {nf['nan_reference']}/{nf['nan_test']}, "
                         f"Inf ref/test {nf['inf_reference']}/{nf['inf_test']}")
        for side, leaves in self.nondeterminism.items():
            if leaves:
                worst = max(leaves.values())
                lines.append(f" nondeterminism: {side} differs between runs in {len(leaves)} leaf(s), up to {_fmt(worst)}")
        for side, t in self.timing.items():
            if not isinstance(t, dict):
                continue
            parts = [f"first call {t['first_call_s'] * 1e3:.2f} ms"]
            if t.get("backend_compile_s") is not None:
                parts.append(f"backend compile {t['backend_compile_s'] * 1e3:.1f} ms over {t['graphs_compiled']} graph(s)")
            ss = t.get("steady_state_s")
            if ss:
                parts.append(f"steady {ss['median'] * 1e3:.3f} ms median (mean {ss['mean'] * 1e3:.3f} +- "
                             f"{(ss['std'] or 0) * 1e3:.3f}, n={ss['samples']})")
            lines.append(f" timing {side}: " + ", ".join(parts))
        if self.timing.get("speedup") is not None:
            lines.append(f" steady-state speedup (reference median / test median): {self.timing['speedup']:.2f}x")
        if self.minifier:
            lines.append(f" minifier: {self.minifier.get('status')}"
                         + (f" -> {self.minifier['repro']}" if self.minifier.get("repro") else "")
                         + (f" ({self.minifier['detail']})" if self.minifier.get("detail") else ""))
        if self.visualizations:
            lines.append(f" plots: {len(self.visualizations)} in {os.path.dirname(self.visualizations[0])}")
        if self.json_path:
            lines.append(f" report: {self.json_path}")
        return neutralise_bidi("\n".join(lines))  # names are user text; a terminal must not reorder them

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> JsonObject:
        d = self._dict()
        d["exact_match"] = exact_match_of(d)
        return d

    def _dict(self) -> JsonObject:
        return json_safe({
            "schema": REPORT_SCHEMA,
            "model_name": self.model_name,
            "run_id": self.run_id,
            "created": self.created,
            "reference_backend": self.reference_backend,
            "test_backend": self.test_backend,
            "mode": self.mode,
            "runs": self.runs,
            "passed": self.passed,
            "forward_passed": self.forward_passed,
            "gradients_passed": self.gradients_passed,
            "first_divergent_module": self.first_divergent_module,
            "outputs": [d.to_dict() for d in self.outputs],
            "gradients": [d.to_dict() for d in self.gradients],
            "modules": [d.to_dict() for d in self.modules],
            "module_order": list(self.module_order),
            "modules_not_captured": list(self.modules_not_captured),
            "missing": list(self.missing),
            "extra": list(self.extra),
            "nonfinite": self.nonfinite,
            "nondeterminism": self.nondeterminism,
            "observer_effect": self.observer_effect,
            "timing": self.timing,
            "tolerance": self.tolerance,
            "environment": self.environment,
            "visualizations": list(self.visualizations),
            "minifier": self.minifier,
            "artifact_dir": self.artifact_dir,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as strict JSON (non-finite numbers as ``"NaN"``/``"Infinity"`` strings)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json() + "\n", encoding="utf-8")
        self.json_path = str(p)
        return p
