"""KernelDiffHarness: run a model under a reference and a backend under test, compare everything.

    harness = KernelDiffHarness(model, (x,), model_name="tiny_mlp")          # Inductor vs eager
    report = harness.compare(generate_visualizations=True)
    print(report.summary()); report.save_json("kd.json")

How each part works (and what it costs):

* **Sides.** The reference and the test each get their own deep copy of the model (so gradients and
  in-place state never mix and the user's model is untouched). ``"eager"`` runs the copy as is;
  ``"float64"`` runs a float64 copy on float64 inputs (and a float32 eager copy as the baseline of
  the ratio rule); anything else (a backend name such as ``"inductor"``, or a backend callable such
  as ``debug_module.mock_backend``) goes through ``torch.compile`` with that backend, wrapped so the
  time spent inside the backend's compiler is measured, and handed a copy of each graph (what it
  edits in place never reaches the graph kept for the minifier). The float64 side runs under
  ``_runtime.WidenToFloat64`` (the model's casts to narrower floats stay float64); a reference run
  that still raises is a ``BackendRuntimeError`` (DF005) saying so, with a hint.
* **Runs.** Each side is called ``runs`` times on fresh clones of the inputs. Call 1 is the first
  call (Dynamo tracing + backend compilation + execution); calls 2..N give the steady-state latency
  (CUDA is synchronised around every timed region). Run *i* of the test is compared with run *i*
  of the reference; the verdict is the worst run, and each tensor carries the max error of every
  run (mean and spread), while run-to-run differences inside one side are reported as
  nondeterminism.
* **Gradients** (``compare_gradients=True``): after each forward, ``loss = sum(<leaf, w_leaf>)``
  over the floating outputs with fixed random weights ``w`` (seeded per leaf name, identical on both
  sides) is back-propagated; every parameter's ``.grad`` and every floating input's gradient is
  compared.
* **Submodules** (``compare_modules=True``): forward hooks on every named submodule record its
  output (detached clones). On the eager side on a fresh copy; on the compiled side the hooks are
  registered on a fresh copy *before* ``torch.compile``, so Dynamo traces them and the recorded
  values are the compiled graph's own intermediate results (they become extra graph outputs). That
  can move fusion boundaries, so the hooked compiled model is separate from the one whose outputs
  decide the verdict, and the difference between the two is reported (``observer_effect``).
  Modules are ordered by when their forward returns in eager execution, so the first divergent
  module is the innermost, earliest one whose output differs; modules whose hooks did not fire on
  the test side (e.g. a backend that replaced them) are listed as not captured.
* **Accuracy failure** -> the minifier (``debug_module.minifier``) is run on the failing Dynamo
  graph; its repro is linked in the report.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import logging
import math
import tempfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeAlias, Unpack

import torch

from debug_framework.comparison import (ComparisonResult, RatioRule, compare, finite_metric, flatten_outputs,
                                         judge_with_noise, perturb_within_rounding)
from debug_framework.measure import TimedBackend, Timer, run_stats

from debug_framework.errors import BackendRuntimeError
from debug_framework.jsonio import JsonObject

from ..artifacts import RunDirectory, new_run_id
from ..minifier import _runtime
from .metrics import CompareTolerance, ToleranceOptions, core_tolerance
from .report import DiffReport, TensorDiff

__all__ = ["KernelDiffHarness"]

log = logging.getLogger(__name__)

#: A side's backend: a name ("eager", "float64", a registered torch.compile backend) or a
#: torch.compile backend (a callable taking the FX graph and example inputs).
BackendSpec: TypeAlias = str | Callable[..., object]
#: What KernelDiff runs: an ``nn.Module`` (submodule hooks, parameters) or any callable.
ModelLike: TypeAlias = torch.nn.Module | Callable[..., object]


# ---------------------------------------------------------------------------------------------- helpers


def _backend_name(backend: object) -> str:
    if isinstance(backend, str):
        return backend
    name = getattr(backend, "name", None)
    if isinstance(name, str):
        return name
    return getattr(backend, "__name__", None) or type(backend).__name__


def _resolve_backend(backend: object) -> Callable[..., object]:
    if isinstance(backend, str):
        from debug_framework._torch import dynamo

        return dynamo.lookup_backend(backend)
    if callable(backend):
        return backend
    raise TypeError(f"a backend must be a name or a callable, got {type(backend).__name__}")


def _map_tensors(obj: object, fn: Callable[[torch.Tensor], object]) -> object:
    """``obj`` with every tensor in it (nested in mappings, tuples, lists, named tuples, ModelOutputs)
    replaced by ``fn(tensor)``."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return type(obj)(**{k: _map_tensors(v, fn) for k, v in obj.items()}) if _is_model_output(obj) else \
            {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[_map_tensors(v, fn) for v in obj])
    if isinstance(obj, list | tuple):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _is_model_output(obj: object) -> bool:
    return any(c.__name__ == "ModelOutput" for c in type(obj).__mro__)


def _device_of(model: object, inputs: object) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            return p.device
    found: list[torch.device] = []
    _map_tensors(inputs, lambda t: found.append(t.device))
    return found[0] if found else torch.device("cpu")


def _leaf_weight(name: str, t: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed((zlib.crc32(name.encode()) + seed) % (2**63))
    return torch.randn(t.shape, generator=g, dtype=torch.float32).to(device=t.device, dtype=t.dtype)


def _safe_flatten(obj: object, prefix: str) -> dict[str, torch.Tensor]:
    """Tensor leaves of ``obj``; leaves that are not tensors (caches, strings...) are dropped."""
    try:
        flat = flatten_outputs(obj, prefix)
    except Exception:
        return {}
    return {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}


def _compile_caches_off(compiling: bool) -> contextlib.AbstractContextManager[None]:
    """Inductor's FX graph cache and AOTAutograd's cache off while a compiled side compiles and runs:
    detection never depends on what the on-disk cache holds."""
    if not compiling:
        return contextlib.nullcontext()
    from debug_framework._torch import inductor

    return inductor.compile_caches_off()


def _bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaN where NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


def _stats(samples_s: list[float]) -> dict[str, float | int | None] | None:
    """Run statistics in seconds; ``None`` without samples."""
    return run_stats(samples_s) if samples_s else None


class _Side:
    """One way of running the model: eager, float64, or compiled with a backend."""

    def __init__(self, label: str, model: ModelLike, backend: BackendSpec, *, dtype: torch.dtype | None, compile_: bool) -> None:
        self.label = label
        self.backend_spec = backend
        self.dtype = dtype
        self.compile = compile_
        self.model = self._copy(model)
        self.timed: TimedBackend | None = None
        if compile_:
            self.timed = TimedBackend(_GivenACopy(_resolve_backend(backend)), keep_graphs=True)
            self.fn = torch.compile(self.model, backend=self.timed)
        else:
            self.fn = self.model
        self.outputs: list[dict[str, torch.Tensor]] = []
        self.grads: list[dict[str, torch.Tensor]] = []
        self.forward_s: list[float] = []
        self.backward_s: list[float] = []

    def _copy(self, model: ModelLike) -> ModelLike:
        m = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
        if self.dtype is not None and isinstance(m, torch.nn.Module):
            m = m.to(self.dtype)
        return m

    def widening(self) -> contextlib.AbstractContextManager[object]:
        """The context a side's runs (forward and backward) go in: the float64 side keeps float64 where
        the model's code narrows (:class:`~debug_module.minifier._runtime.WidenToFloat64`)."""
        return _runtime.WidenToFloat64() if self.dtype == torch.float64 else contextlib.nullcontext()

    def cast_inputs(self, inputs: object) -> object:
        dtype = self.dtype

        def one(t: torch.Tensor) -> torch.Tensor:
            t = t.detach().clone()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t

        return _map_tensors(inputs, one)


class _GivenACopy:
    """A backend wrapper that hands the backend a copy of every graph (:func:`_runtime.backend_copy`):
    a backend that edits the graph it is given in place leaves the graph the harness keeps (and the
    minifier judges) as Dynamo made it."""

    def __init__(self, inner: Callable[..., object]) -> None:
        self.inner = inner

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        return self.inner(_runtime.backend_copy(gm), example_inputs)


def _reference_failed(side: _Side, exc: Exception) -> BackendRuntimeError:
    """The DF005 error for a reference (or eager baseline) run of the model that raised ``exc``."""
    if side.dtype == torch.float64:
        what = ("KernelDiff's float64 reference run (the model in float64 on float64 inputs, its casts to "
                "narrower floats kept float64) failed")
        hint = ("judge against eager instead (--reference eager, or reference_backend='eager'), or let the "
                "model follow its inputs' dtype where it pins one")
    else:
        what = f"KernelDiff's {side.label} run (the model as it is, eagerly) failed"
        hint = "check that the model runs on these inputs: call it once yourself"
    return BackendRuntimeError(f"{what}: {type(exc).__name__}: {exc}"[:1500], backend=_backend_name(side.backend_spec),
                               call=side.label, hint=hint)


def _call(fn: Callable[..., object], inputs: object) -> object:
    if isinstance(inputs, Mapping):
        return fn(**inputs)
    if isinstance(inputs, tuple):
        return fn(*inputs)
    return fn(inputs)


# ---------------------------------------------------------------------------------------------- harness


class KernelDiffHarness:
    """Compare a backend under test against a reference on one model and its example inputs.

    Args:
        model: an ``nn.Module`` (or a plain function; then ``compare_modules`` is unavailable and
            gradients are of inputs only).
        example_inputs: a tuple of positional inputs, a dict of keyword inputs (HF style) or one tensor.
        model_name: a label for reports (default: the model's class name).
        reference_backend: ``"float64"`` (float64 reference, judged with the ratio rule: the test's error
            against it may be at most ``float64_multiplier`` x eager's own error at the inputs' precision
            + ``float64_floor``; a precision-only difference passes, a real bug fails), ``"eager"`` (judged
            by the tolerance), or any torch.compile backend name/callable. Default (``None``):
            ``"float64"``, or ``"eager"`` when a tolerance keyword is given.
        test_backend: the backend under test: a name (default ``"inductor"``) or a callable
            (``debug_module.mock_backend``, ``aot_mock_backend(...)``, an adapter, your own).
        rtol, atol, equal_nan, pass_rule, max_mismatch_percentage, tolerance: keywords of the comparison
            core's tolerance (:class:`~debug_module.diff.metrics.ToleranceOptions`; default: torch.testing's
            for the dtype); used in ``"eager"``/backend mode.
        float64_multiplier, float64_floor: the ratio rule ``test_rmse <= m * eager_rmse + floor``
            (errors against the float64 reference; defaults as in torch's own accuracy checks: 2.0, 1e-5);
            where a tensor exceeds it, eager's error is measured again on inputs perturbed within rounding
            (the noise rule, :func:`debug_framework.comparison.judge_with_noise`) before it fails.
        compare_gradients: also compare parameter and input gradients after a backward pass.
        compare_modules: also compare every submodule's output and name the first divergent one.
        runs: calls per side (>= 1); the first is the first call, the rest give steady-state latency.
        seed: seeds the gradient projection weights.
        artifact_root: write a run directory there (``manifest.json``, ``reports/kerneldiff.json``,
            ``visualizations/*.png``); ``None``: nothing is written unless plots are asked for, which
            then go to a fresh temporary directory.
        minify_on_failure: on an accuracy failure, run ``debug_module.minifier`` when it is installed
            (``minify_max_seconds`` bounds it); its verified repro goes to the run directory's ``repros/``.
        test_backend_spec: how that standalone repro imports the backend under test, ``"pkg.mod:attr"`` or
            ``"path/file.py:attr"`` (the minifier's ``backend_spec``). Needed only when ``test_backend`` is a
            callable the repro cannot name by itself (a closure, a configured backend object); a registered
            name or a module-level function is found without it.
    """

    def __init__(
        self,
        model: ModelLike,
        example_inputs: object,
        *,
        model_name: str | None = None,
        reference_backend: BackendSpec | None = None,
        test_backend: BackendSpec = "inductor",
        float64_multiplier: float = 2.0,
        float64_floor: float = 1e-5,
        compare_gradients: bool = False,
        compare_modules: bool = False,
        runs: int = 3,
        seed: int = 0,
        artifact_root: str | Path | None = None,
        minify_on_failure: bool = True,
        minify_max_seconds: float = 120.0,
        test_backend_spec: str | None = None,
        top_k: int = 5,
        max_plots: int = 8,
        **tolerance_options: Unpack[ToleranceOptions],
    ) -> None:
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        if compare_modules and not isinstance(model, torch.nn.Module):
            raise TypeError("compare_modules needs an nn.Module (submodule hooks)")
        self.model = model
        self.example_inputs = example_inputs if isinstance(example_inputs, Mapping | tuple) else (
            tuple(example_inputs) if isinstance(example_inputs, list) else (example_inputs,))
        self.model_name = model_name or (type(model).__name__ if isinstance(model, torch.nn.Module)
                                         else getattr(model, "__name__", "model"))
        self.tolerance_kwargs: CompareTolerance = core_tolerance(tolerance_options)
        if reference_backend is None:  # fair by default: a tolerance given asks for it, else the ratio rule
            given = any(v is not None for v in self.tolerance_kwargs.values())
            reference_backend = "eager" if given else "float64"
        self.reference_backend = reference_backend
        self.test_backend = test_backend
        self.ratio_rule = RatioRule(float(float64_multiplier), float(float64_floor), "rmse")
        self.compare_gradients = compare_gradients
        self.compare_modules = compare_modules
        self.runs = int(runs)
        self.seed = seed
        self.artifact_root = Path(artifact_root) if artifact_root is not None else None
        self.minify_on_failure = minify_on_failure
        self.minify_max_seconds = minify_max_seconds
        self.test_backend_spec = test_backend_spec
        self.top_k = top_k
        self.max_plots = max_plots
        self.float64 = isinstance(reference_backend, str) and reference_backend == "float64"
        self.device = _device_of(model, self.example_inputs)
        self._test_side: _Side | None = None
        self._noise_side: _Side | None = None  # the float32 eager side, rerun on perturbed inputs
        self._noise_runs: dict[int, dict[str, dict[str, torch.Tensor]]] = {}

    # ------------------------------------------------------------------ sides

    def _make_side(self, label: str, backend: BackendSpec) -> _Side:
        if isinstance(backend, str) and backend == "eager":
            return _Side(label, self.model, backend, dtype=None, compile_=False)
        if isinstance(backend, str) and backend == "float64":
            return _Side(label, self.model, backend, dtype=torch.float64, compile_=False)
        return _Side(label, self.model, backend, dtype=None, compile_=True)

    def _run_side(self, side: _Side, example_inputs: object = None, runs: int | None = None) -> None:
        params = dict(side.model.named_parameters()) if isinstance(side.model, torch.nn.Module) else {}
        for _ in range(self.runs if runs is None else runs):
            inputs = side.cast_inputs(self.example_inputs if example_inputs is None else example_inputs)
            input_leaves: dict[str, torch.Tensor] = {}
            if self.compare_gradients:
                for k, t in _safe_flatten(inputs, "input").items():
                    if t.is_floating_point():
                        t.requires_grad_(True)
                        input_leaves[k] = t
                for p in params.values():
                    p.grad = None
            with Timer(self.device) as fwd, torch.set_grad_enabled(self.compare_gradients), side.widening():
                out = _call(side.fn, inputs)
            side.forward_s.append(fwd.seconds)
            flat = _safe_flatten(out, "")
            side.outputs.append({k: v.detach().clone() for k, v in flat.items()})
            if self.compare_gradients:
                loss = None
                for k in sorted(flat):
                    v = flat[k]
                    if v.is_floating_point() and v.requires_grad:
                        term = (v * _leaf_weight(k, v, self.seed)).sum()
                        loss = term if loss is None else loss + term
                grads: dict[str, torch.Tensor] = {}
                if loss is not None:
                    with Timer(self.device) as bwd, side.widening():
                        loss.backward()
                    side.backward_s.append(bwd.seconds)
                    for name, p in params.items():
                        if p.grad is not None:
                            grads[f"param.{name}"] = p.grad.detach().clone()
                    for k, t in input_leaves.items():
                        if t.grad is not None:
                            grads[k] = t.grad.detach().clone()
                side.grads.append(grads)

    def _capture_modules(self, side: _Side) -> tuple[dict[str, dict[str, torch.Tensor]], list[str], dict[str, torch.Tensor]]:
        """Submodule outputs of one call on a fresh hooked copy; (per-module leaves, completion order, final outputs)."""
        model = side._copy(self.model)
        captured: dict[str, object] = {}
        order: list[str] = []
        handles = []
        for name, mod in model.named_modules():
            if not name:
                continue

            def hook(mod: torch.nn.Module, args: object, out: object, name: str = name) -> None:
                captured[name] = _map_tensors(out, lambda t: t.detach().clone())
                order.append(name)

            handles.append(mod.register_forward_hook(hook))
        fn: Callable[..., object] = model
        if side.compile:
            fn = torch.compile(model, backend=_resolve_backend(side.backend_spec))
        inputs = side.cast_inputs(self.example_inputs)
        with torch.no_grad(), _compile_caches_off(side.compile), side.widening():
            out = _call(fn, inputs)
        for h in handles:
            h.remove()
        per_module = {name: _safe_flatten(captured[name], name) for name in captured}
        seen: list[str] = []
        for n in order:  # completion order (a module called twice counts at its first return)
            if n not in seen:
                seen.append(n)
        return per_module, seen, {k: v.detach() for k, v in _safe_flatten(out, "").items()}

    # ------------------------------------------------------------------ judging

    def _judge(self, name: str, kind: str, refs: list[torch.Tensor], tests: list[torch.Tensor],
               bases: list[torch.Tensor] | None, module: str | None = None) -> TensorDiff:
        results: list[ComparisonResult] = []
        base_results: list[ComparisonResult | None] = []
        verdicts: list[tuple[bool, str | None, dict[str, float | str | None] | None]] = []
        for i, (r, t) in enumerate(zip(refs, tests, strict=False)):
            if bases is None:
                res = compare(r, t, name=name, top_k=self.top_k, **self.tolerance_kwargs)
                results.append(res)
                base_results.append(None)
                verdicts.append((res.passed, res.reason, None))
                continue
            res = compare(r, t, name=name, top_k=self.top_k, check_dtype=False)
            base = compare(r, bases[i], name=name, top_k=self.top_k, check_dtype=False)
            results.append(res)
            base_results.append(base)
            passed, reason, ratio = self._ratio_verdict(res, base, r, name, kind)
            if bases[i].dtype != t.dtype:  # the float64 side's dtype says nothing: eager's does
                passed, reason = False, (f"dtype mismatch: eager {str(bases[i].dtype).removeprefix('torch.')} "
                                         f"vs test {str(t.dtype).removeprefix('torch.')}")
            verdicts.append((passed, reason, ratio))
        # the worst run: a failing one first, then the largest error
        def badness(i: int) -> tuple[int, float]:
            err = results[i].max_abs_error
            return (0 if verdicts[i][0] else 1, -1.0 if err is None else (err if math.isfinite(err) else math.inf))

        identical = None if bases is None else all(_bit_identical(b, t) for b, t in zip(bases, tests, strict=False))
        worst = max(range(len(results)), key=badness)
        passed, reason, ratio = verdicts[worst]
        return TensorDiff(name=name, kind=kind, passed=passed and all(v[0] for v in verdicts), result=results[worst],
                          rule="ratio" if bases is not None else "tolerance", baseline=base_results[worst],
                          ratio=ratio, run_max_abs_errors=[r.max_abs_error for r in results], reason=reason,
                          module=module, identical_to_eager=identical)

    def _ratio_verdict(self, res: ComparisonResult, base: ComparisonResult, ref: torch.Tensor, name: str,
                       kind: str) -> tuple[bool, str | None, dict[str, float | str | bool | JsonObject | None]]:
        """The project's ratio verdict of the test against float64, with eager at the inputs' precision
        as the baseline, and where the single-run bound is exceeded the noise rule
        (:func:`~debug_framework.comparison.judge_with_noise`: eager rerun on inputs perturbed within
        rounding); the dict is what the report shows of it (``noise``: the provenance of a widened bound)."""
        rule = self.ratio_rule

        def measure(seed: int) -> ComparisonResult | None:
            noisy = self._perturbed_leaf(seed, kind, name)
            return None if noisy is None else compare(ref, noisy, name=name, top_k=1, check_dtype=False)

        v, evidence = judge_with_noise(rule, base, res, measure, oracle="float64", baseline_name="eager")
        test_err = finite_metric(res, rule.metric)
        eager_err = evidence.single_run_error if evidence is not None else v.judgement.reference_error
        ratio: dict[str, float | str | bool | JsonObject | None] = {
            "test_error": test_err, "eager_error": eager_err, "bound": v.judgement.bound,
            "multiplier": rule.multiplier, "floor": rule.floor, "metric": rule.metric, "passed": v.passed,
            "noise": evidence.to_dict() if evidence is not None else None}
        return v.passed, v.reason, ratio

    def _perturbed_leaf(self, seed: int, kind: str, name: str) -> torch.Tensor | None:
        """Leaf ``name`` (an output or a gradient) of the eager side run once on the inputs perturbed
        within rounding with ``seed`` (runs are cached per seed); ``None`` for a submodule's output."""
        side = self._noise_side
        if side is None or kind not in ("output", "gradient"):
            return None
        if seed not in self._noise_runs:
            saved = side.outputs, side.grads, side.forward_s, side.backward_s
            side.outputs, side.grads, side.forward_s, side.backward_s = [], [], [], []
            try:
                self._run_side(side, perturb_within_rounding(self.example_inputs, seed), runs=1)
                self._noise_runs[seed] = {"output": side.outputs[0], "gradient": side.grads[0] if side.grads else {}}
            finally:
                side.outputs, side.grads, side.forward_s, side.backward_s = saved
        return self._noise_runs[seed][kind].get(name)

    def _judge_maps(self, kind: str, ref_runs: list[dict[str, torch.Tensor]], test_runs: list[dict[str, torch.Tensor]],
                    base_runs: list[dict[str, torch.Tensor]] | None) -> tuple[list[TensorDiff], list[str], list[str]]:
        ref0, test0 = ref_runs[0], test_runs[0]
        missing = [k for k in ref0 if k not in test0]
        extra = [k for k in test0 if k not in ref0]
        diffs = []
        for k in ref0:
            if k not in test0:
                continue
            bases = [b[k] for b in base_runs] if base_runs is not None else None
            diffs.append(self._judge(k, kind, [r[k] for r in ref_runs], [t[k] for t in test_runs], bases))
        return diffs, missing, extra

    @staticmethod
    def _nondeterminism(side: _Side) -> dict[str, float]:
        """Leaves whose value changes between calls of the same side, with the largest change."""
        out: dict[str, float] = {}
        runs = [{**o, **g} for o, g in zip(side.outputs, side.grads or [{}] * len(side.outputs), strict=False)]
        for later in runs[1:]:
            for k, v in later.items():
                first = runs[0].get(k)
                if first is None or first.shape != v.shape or torch.equal(first, v):
                    continue
                if torch.equal(torch.isnan(first), torch.isnan(v)) and torch.equal(first.nan_to_num(), v.nan_to_num()):
                    continue
                r = compare(first, v, rtol=0.0, atol=0.0, equal_nan=True)
                err = r.max_abs_error if r.max_abs_error is not None else math.inf
                out[k] = max(out.get(k, 0.0), err)
        return out

    def _timing(self, side: _Side) -> JsonObject:
        return {
            "backend": _backend_name(side.backend_spec),
            "first_call_s": side.forward_s[0],
            "backend_compile_s": side.timed.compile_s if side.timed is not None else None,
            "graphs_compiled": len(side.timed.graphs) if side.timed is not None else 0,
            "steady_state_s": _stats(side.forward_s[1:]),
            "first_backward_s": side.backward_s[0] if side.backward_s else None,
            "steady_backward_s": _stats(side.backward_s[1:]),
            "cuda_synchronized": self.device.type == "cuda",
            "note": ("first_call_s includes Dynamo tracing, backend compilation and execution; backend_compile_s is "
                     "the time inside the backend's compiler for forward graphs (a lazily compiled backward shows in "
                     "first_backward_s); steady_state_s excludes the first call"),
        }

    # ------------------------------------------------------------------ main entry

    def compare(self, generate_visualizations: bool = False) -> DiffReport:
        """Run both sides, compare, and return a :class:`DiffReport` (also written to the run directory
        when ``artifact_root`` is set)."""
        ref_label = "float64" if self.float64 else _backend_name(self.reference_backend)
        ref = self._make_side("reference", self.reference_backend)
        base = self._make_side("eager_float32", "eager") if self.float64 else None
        test = self._make_side("test", self.test_backend)
        self._test_side = test
        self._noise_side, self._noise_runs = base, {}
        for side in (ref, base, test):
            if side is not None:
                with _compile_caches_off(side.compile):
                    try:
                        self._run_side(side)
                    except Exception as e:
                        if side is test:
                            raise
                        raise _reference_failed(side, e) from e

        outputs, missing, extra = self._judge_maps("output", ref.outputs, test.outputs,
                                                   base.outputs if base is not None else None)
        gradients: list[TensorDiff] = []
        if self.compare_gradients:
            gradients, gmiss, gextra = self._judge_maps("gradient", ref.grads, test.grads,
                                                        base.grads if base is not None else None)
            missing += gmiss
            extra += gextra

        run = RunDirectory(self.artifact_root, backend="kerneldiff",
                           info={"model": self.model_name, "reference_backend": ref_label,
                                 "test_backend": _backend_name(self.test_backend)}) if self.artifact_root else None
        report = DiffReport(
            model_name=self.model_name,
            run_id=run.run_id if run is not None else new_run_id(),
            created=_dt.datetime.now(_dt.UTC).isoformat(),
            reference_backend=ref_label,
            test_backend=_backend_name(self.test_backend),
            mode="float64-ratio" if self.float64 else "tolerance",
            runs=self.runs,
            outputs=outputs,
            gradients=gradients,
            missing=missing,
            extra=extra,
            tolerance=self._tolerance_description(),
            environment={"torch": torch.__version__, "device": str(self.device)},
            artifact_dir=str(run.path) if run is not None else None,
        )
        report.timing = {"reference": self._timing(ref), "test": self._timing(test)}
        if base is not None:
            report.timing["eager_float32"] = self._timing(base)
        r_ss, t_ss = report.timing["reference"]["steady_state_s"], report.timing["test"]["steady_state_s"]
        report.timing["speedup"] = (r_ss["median"] / t_ss["median"]) if r_ss and t_ss and t_ss["median"] > 0 else None
        report.nondeterminism = {s.label: self._nondeterminism(s) for s in (ref, base, test) if s is not None}

        module_tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.compare_modules:
            self._compare_modules(report, ref, base, test, module_tensors)

        if not report.passed and self.minify_on_failure:
            report.minifier = self._minify(test, report, run)
        elif not report.passed:
            report.minifier = {"status": "skipped", "detail": "minify_on_failure=False"}

        if generate_visualizations:
            out_dir = run.path / "visualizations" if run is not None else Path(tempfile.mkdtemp(prefix="kerneldiff-"))
            from .visualization import render_report_plots

            paths = render_report_plots(report, ref, test, module_tensors, out_dir, max_plots=self.max_plots)
            report.visualizations = [str(p) for p in paths]
            if run is not None:
                for p in paths:
                    run.record(p.relative_to(run.path).as_posix(), "kerneldiff_plot")
            report.artifact_dir = str(run.path) if run is not None else str(out_dir)
        if run is not None:
            report.json_path = str(run.path / "reports" / "kerneldiff.json")
            run.write_text("reports/kerneldiff.json", report.to_json() + "\n", kind="kerneldiff_report")
            run.set_status("complete", passed=report.passed, first_divergent_module=report.first_divergent_module)
        return report

    def _tolerance_description(self) -> JsonObject:
        if self.float64:
            rule = self.ratio_rule
            return {"rule": "ratio", "metric": rule.metric, "multiplier": rule.multiplier, "floor": rule.floor}
        tol = self.tolerance_kwargs.get("tolerance")
        d: JsonObject = {"rule": "tolerance", "base": tol.to_dict() if tol is not None else "dtype default (torch.testing)"}
        d.update({k: v for k, v in self.tolerance_kwargs.items() if k != "tolerance" and v is not None})
        return d

    def _compare_modules(self, report: DiffReport, ref: _Side, base: _Side | None, test: _Side,
                         keep: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        ref_mods, order, _ = self._capture_modules(ref)
        test_mods, _, hooked_out = self._capture_modules(test)
        base_mods = self._capture_modules(base)[0] if base is not None else None
        report.module_order = [n for n in order if ref_mods.get(n)]
        diffs: list[TensorDiff] = []
        for name in report.module_order:
            if name not in test_mods:
                report.modules_not_captured.append(name)
                continue
            for leaf, r in ref_mods[name].items():
                t = test_mods[name].get(leaf)
                if t is None:
                    continue
                b = [base_mods[name][leaf]] if base_mods is not None and leaf in base_mods.get(name, {}) else None
                if base_mods is not None and b is None:
                    continue
                diffs.append(self._judge(leaf, "module", [r], [t], b, module=name))
                keep[leaf] = (r, t)
        report.modules = diffs
        # Observer effect: the hooked compiled model against the unhooked one (same backend, same inputs).
        worst = 0.0
        for k, v in hooked_out.items():
            u = test.outputs[0].get(k)
            if u is not None and u.shape == v.shape:
                r = compare(u, v, rtol=0.0, atol=0.0, equal_nan=True)
                if r.max_abs_error is not None:
                    worst = max(worst, r.max_abs_error)
        report.observer_effect = {"max_abs_error": worst,
                                  "note": "hooked compiled outputs vs unhooked compiled outputs (same backend)"}

    # ------------------------------------------------------------------ minifier

    def _minify(self, test: _Side, report: DiffReport, run: RunDirectory | None) -> JsonObject:
        from . import _minify

        return _minify.minify_accuracy_failure(self, test, report, run)
