"""The noise rule: before a ratio verdict calls a tensor a failure, measure the noise a correct run has there.

The ratio rule (:class:`~debug_framework.comparison.RatioRule`) bounds the error of the
implementation under test by ``multiplier x`` the error of *one* trusted run at the same precision
(eager in the test's dtype) ``+ floor``. One run is a sample of one: where the output is
ill-conditioned (a reciprocal near its pole, ``exp`` of large arguments, a matrix's condition number)
an equally correct implementation that rounds an intermediate differently lands several ulps, or
orders of magnitude, away from where eager happened to land. So where the single-run bound is
exceeded, :func:`judge_with_noise` runs the trusted side ``runs`` more times on inputs perturbed
within their dtype's rounding (:func:`perturb_within_rounding`: each floating value moved by at most
one ulp, the backward error every correct implementation is allowed), measures each run's error
against the same oracle, and judges again with the largest of them in place of the single run's:

    err(test, oracle) <= multiplier x max(err(trusted), err(trusted on perturbed inputs)_k) + floor

The bound only ever widens, and only by measurement; :class:`NoiseEvidence` records by how much
(the provenance a report shows). A real bug is not rounding noise and still fails. KernelDiff, the
operator sweep and the plugin sweep all judge this way.

    >>> import torch
    >>> x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    >>> y = perturb_within_rounding(x, seed=1)
    >>> y.dtype, bool(((y.double() - x.double()).abs() <= x.double() * 2 ** -10).all())
    (torch.float16, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ..jsonio import as_float
from .ratio import RatioRule, RatioVerdict, finite_metric
from .result import ComparisonResult
from .tolerance import DTYPE_EPS

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..jsonio import JsonObject

__all__ = ["NOISE_RUNS", "NoiseEvidence", "perturb_within_rounding", "perturb_array", "judge_with_noise",
           "PERTURBATION"]

#: How many perturbed trusted runs measure the noise at a tensor whose single-run bound is exceeded.
NOISE_RUNS = 4
#: What the perturbation is, in words (recorded in the evidence).
PERTURBATION = "each floating input moved by at most one ulp of its dtype"

_V = TypeVar("_V")
#: the smallest move :func:`perturb_within_rounding` computes in float32 (a 2^-16 relative move is 256
#: float32 ulps: float32's own rounding of it is negligible); smaller moves are computed in float64
_FLOAT32_ENOUGH = 2.0 ** -16


def perturb_within_rounding(value: _V, seed: int, *, within: str | None = None, fraction: float = 1.0) -> _V:
    """``value`` with every floating tensor in it (nested in lists, tuples and dicts) multiplied by
    ``1 + u x eps``, ``u`` uniform in [-1/2, 1/2] per element (drawn from ``seed``), and rounded
    back to its dtype: each value stays or moves to a neighbour (at most one ulp). ``eps`` is the
    tensor's own dtype's, or that of ``within`` (a dtype name: ``"bfloat16"``) where given, for a
    value a computation at that precision rounds (float32 weights of a bfloat16 run). With ``within``,
    ``fraction`` scales the move: ``1/8`` moves each value by at most an eighth of an ulp of
    ``within`` before that computation rounds it, so only values near a rounding's midpoint round
    the other way (the rounding is resampled, not made worse); never by less than one ulp of the
    value's own dtype, since a smaller move rounds back to the value itself. Anything else is
    returned as is."""
    import torch

    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return value
        gen = torch.Generator().manual_seed(int(seed))
        eps = rounding_eps(value.dtype)
        if within is not None:
            eps = max(fraction * rounding_eps(getattr(torch, within)), eps)
        x = value.detach().to("cpu")
        if within is not None and eps >= _FLOAT32_ENOUGH and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            # a move of at least 2^-16: float32 arithmetic (rounding 2^-24) is exact enough, and a
            # model's weights are moved in a fraction of the time and memory of float64
            factor = torch.rand(x.shape, generator=gen, dtype=torch.float32)
            moved = factor.sub_(0.5).mul_(eps).add_(1.0).mul_(x).to(value.dtype)
        else:
            u = torch.rand(x.shape, generator=gen, dtype=torch.float64) - 0.5
            moved = (x.to(torch.float64) * (1.0 + u * eps)).to(value.dtype)
        return moved.to(value.device).requires_grad_(value.requires_grad)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: perturb_within_rounding(v, seed + i, within=within, fraction=fraction)  # type: ignore[return-value]
                for i, (k, v) in enumerate(value.items())}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(perturb_within_rounding(v, seed + 7919 * (i + 1), within=within,  # type: ignore[return-value]
                                                   fraction=fraction)
                           for i, v in enumerate(value))
    return value


def perturb_array(array: np.ndarray, seed: int, *, within: str | None = None, fraction: float = 1.0) -> np.ndarray:
    """:func:`perturb_within_rounding` of a NumPy array, in NumPy (a copy; a non-floating array as
    is): the engines that compute in NumPy (an ONNX file's graph) never import torch for it."""
    import numpy as np

    if not np.issubdtype(array.dtype, np.floating):
        return array
    eps = float(np.finfo(array.dtype).eps)
    if within is not None:
        eps = max(fraction * DTYPE_EPS[within], eps)
    u = np.random.default_rng(int(seed)).random(array.shape) - 0.5
    moved = np.asarray(array, dtype=np.float64) * (1.0 + u * eps)
    return moved.astype(array.dtype, copy=False)


def rounding_eps(dtype: torch.dtype) -> float:
    """The machine epsilon of a torch floating dtype (the gap from 1 to the next value)."""
    import torch

    return float(torch.finfo(dtype).eps)


@dataclass(frozen=True)
class NoiseEvidence:
    """What measuring the noise at one tensor found: the single run's error and bound, the errors of
    the ``runs`` perturbed trusted runs, and the bound judged by (``widening`` = bound / single-run bound)."""

    runs: int
    errors: tuple[float, ...]
    single_run_error: float
    single_run_bound: float
    bound: float
    perturbation: str = PERTURBATION

    @property
    def noise(self) -> float:
        """The largest error of a perturbed trusted run (NaN when none could be measured)."""
        finite = [e for e in self.errors if not math.isnan(e)]
        return max(finite) if finite else math.nan

    @property
    def widened(self) -> bool:
        """Whether the measured noise raised the bound above the single run's."""
        return self.bound > self.single_run_bound

    @property
    def widening(self) -> float:
        """bound / single-run bound (1.0 when not widened)."""
        return self.bound / self.single_run_bound if self.single_run_bound > 0 else (1.0 if self.bound == 0 else math.inf)

    def to_dict(self) -> JsonObject:
        """The evidence as JSON: every field, ``noise``, ``widened`` and ``widening``."""
        return {"runs": self.runs, "errors": list(self.errors), "noise": self.noise,
                "single_run_error": self.single_run_error, "single_run_bound": self.single_run_bound,
                "bound": self.bound, "widened": self.widened, "widening": self.widening,
                "perturbation": self.perturbation}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> NoiseEvidence:
        """The evidence read back from :meth:`to_dict`'s shape."""
        errors = data.get("errors")
        return cls(int(_number(data.get("runs"), 0.0)),
                   tuple(_number(e) for e in errors) if isinstance(errors, list) else (),
                   _number(data.get("single_run_error")), _number(data.get("single_run_bound")),
                   _number(data.get("bound")), str(data.get("perturbation") or PERTURBATION))

    def text(self) -> str:
        """One line for a report: by how much the bound was widened, and by what."""
        if not self.widened:
            return (f"{self.runs} perturbed trusted runs measured no more noise than the single run "
                    f"({self.noise:.3e}): bound not widened")
        return (f"bound widened x{self.widening:.3g} (from {self.single_run_bound:.3e}) by the noise of {self.runs} "
                f"trusted runs on perturbed inputs (largest error {self.noise:.3e})")


def _number(value: object, missing: float = math.nan) -> float:
    number = as_float(value)
    return missing if number is None else number


def judge_with_noise(rule: RatioRule, baseline: ComparisonResult, test: ComparisonResult,
                     measure: Callable[[int], ComparisonResult | None], *, runs: int = NOISE_RUNS,
                     oracle: str = "the oracle", baseline_name: str = "the baseline",
                     perturbation: str = PERTURBATION) -> tuple[RatioVerdict, NoiseEvidence | None]:
    """:meth:`RatioRule.verdict` of ``test``, and where it fails on the metric alone (not a shape or a
    non-finite mismatch), judged again with the noise measured: ``measure(k)`` (k = 1..``runs``) is the
    comparison against the same oracle of the trusted side run on inputs perturbed with seed ``k``
    (``None``, or an exception, when it cannot run: the single-run verdict stands); ``perturbation``
    says how the inputs were moved (recorded in the evidence). Returns the verdict and the evidence
    (``None`` when no noise was measured)."""
    verdict = rule.verdict(baseline, test, oracle=oracle, baseline_name=baseline_name)
    j = verdict.judgement
    if verdict.passed or not test.shape_match or math.isnan(j.alternative_error) \
            or test.nonfinite_mismatch_count > baseline.nonfinite_mismatch_count:
        return verdict, None
    errors: list[float] = []
    for k in range(1, runs + 1):
        try:
            res = measure(k)
        except Exception:  # noqa: BLE001 - the trusted side cannot run perturbed: no noise measured
            return verdict, None
        if res is None:
            return verdict, None
        value = finite_metric(res, rule.metric)  # over the finite pairs: an overflow does not widen
        errors.append(math.nan if value is None else value)
    measured = [e for e in errors if math.isfinite(e)]
    noise = max([j.reference_error, *measured])
    widened = rule.judge(noise, j.alternative_error)
    evidence = NoiseEvidence(runs, tuple(errors), j.reference_error, j.bound, widened.bound, perturbation)
    if widened.passed:
        return RatioVerdict(True, None, widened), evidence
    label = "RMSE" if rule.metric == "rmse" else rule.metric
    reason = (f"{label} {j.alternative_error:.3e} vs {oracle} exceeds the bound {widened.bound:.3e} = {rule.multiplier:g} x "
              f"the largest {label} of {baseline_name} ({j.reference_error:.3e} once, {noise:.3e} over {runs} runs on "
              f"inputs perturbed within rounding) + {rule.floor:.3g}")
    return RatioVerdict(False, reason, widened), evidence
