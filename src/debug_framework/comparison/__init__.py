"""The comparison core: one streaming engine that every other part of the project uses.

    >>> import torch
    >>> from debug_framework.comparison import compare
    >>> r = compare(torch.ones(4), torch.ones(4) + 1e-7)
    >>> r.passed, r.max_ulp_error
    (True, 1)

``compare`` is the one front door; ``TensorComparisonEngine.compare_tensors`` (the spec's dict front)
and ``debug_module.diff.compare_tensors`` (KernelDiff's names) delegate to it. :class:`RatioRule`
judges against a float64 oracle relative to a baseline (validation's oracle mode, KernelDiff).
"""

from .engine import DEFAULT_CHUNK_ELEMENTS, EXACT_QUANTILE_LIMIT, compare
from .noise import NOISE_RUNS, NoiseEvidence, judge_with_noise, perturb_within_rounding
from .nested import compare_nested, flatten_outputs
from .positions import position_mask, select_positions
from .ratio import (
    FLOOR_EPS,
    NOISE_MARGIN,
    OracleJudgement,
    RatioRule,
    RatioVerdict,
    error_metric,
    finite_metric,
    finite_rms,
    float64_array,
)
from .result import ComparisonResult, NestedComparison, WorstElement, dumps_json, json_safe
from ._rows import ROW_SUMS, row_errors
from .tolerance import PassRule, Tolerance, default_tolerance, less_precise_dtype

__all__ = [
    "compare",
    "compare_nested",
    "position_mask",
    "select_positions",
    "flatten_outputs",
    "ComparisonResult",
    "NestedComparison",
    "WorstElement",
    "Tolerance",
    "PassRule",
    "default_tolerance",
    "less_precise_dtype",
    "RatioRule",
    "RatioVerdict",
    "NoiseEvidence",
    "judge_with_noise",
    "perturb_within_rounding",
    "NOISE_RUNS",
    "OracleJudgement",
    "error_metric",
    "finite_metric",
    "finite_rms",
    "float64_array",
    "NOISE_MARGIN",
    "FLOOR_EPS",
    "json_safe",
    "dumps_json",
    "DEFAULT_CHUNK_ELEMENTS",
    "EXACT_QUANTILE_LIMIT",
    "row_errors",
    "ROW_SUMS",
]
