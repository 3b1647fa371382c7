"""The judge's precision diagnosis (``consistent_with``) on measured evidence, without backends.

Evidence is built from real arrays: a float64 reference per checkpoint, correct runs at float16 and
bfloat16 (the reference rounded so, plus their own rounding noise), and alternatives that compute in
bfloat16 or float16 everywhere, or that are exact float32 except one buggy checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_framework.capture import CheckpointKey
from debug_framework.comparison import compare
from debug_framework.services.validation.evidence import CheckpointEvidence, Evidence, reference_scale
from debug_framework.services.validation.judge import judge
from debug_framework.services.validation.plan import ValidationPlan

KEYS = [CheckpointKey("post_embedding"), CheckpointKey("post_attention", 0), CheckpointKey("post_mlp", 0),
        CheckpointKey("post_attention", 1), CheckpointKey("post_mlp", 1), CheckpointKey("post_processing")]


def _round(x: np.ndarray, dtype: torch.dtype, seed: int) -> np.ndarray:
    """``x`` with the error of a run at ``dtype``: a small perturbation, rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    noisy = x * (1 + eps * rng.standard_normal(x.shape))
    return torch.from_numpy(noisy).to(dtype).to(torch.float64).numpy()


def _evidence(alternative: dict[CheckpointKey, np.ndarray], refs: dict[CheckpointKey, np.ndarray],
              measured: tuple[str, ...] = ("float16", "bfloat16")) -> Evidence:
    ev = Evidence()
    for n, key in enumerate(KEYS):
        r, a = refs[key], alternative[key]
        lower = {"float16": compare(r, _round(r, torch.float16, 100 + n), check_dtype=False),
                 "bfloat16": compare(r, _round(r, torch.bfloat16, 200 + n), check_dtype=False)}
        noise = compare(r, r.astype(np.float32).astype(np.float64) * (1 + 1e-7), check_dtype=False)
        ev.checkpoints.append(CheckpointEvidence(key, compare(r, a, check_dtype=False), reference_scale(r), noise,
                                                 lower_precision={d: lower[d] for d in measured}))
    ev.precision_note = {"measured": list(measured), "skipped": {}}
    return ev


@pytest.fixture(scope="module")
def refs() -> dict[CheckpointKey, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal((2, 8, 16)) for k in KEYS}


@pytest.fixture(scope="module")
def plan() -> ValidationPlan:
    return ValidationPlan.resolve({"dtype": "float32", "reference_dtype": "float64", "isolate": False}, 2)


@pytest.mark.parametrize(("dtype", "name"), [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")])
def test_a_run_at_a_lower_precision_is_named(refs, plan, dtype, name):
    alt = {k: _round(r, dtype, 300 + n) for n, (k, r) in enumerate(refs.items())}
    verdict = judge(_evidence(alt, refs), plan)
    assert not verdict.passed
    assert verdict.consistent_with == name
    assert all(j.consistent_with == name for j in verdict.checkpoints.values() if not j.passed)


def test_the_most_precise_fitting_precision_is_named_and_only_measured_ones(refs, plan):
    alt = {k: _round(r, torch.bfloat16, 300 + n) for n, (k, r) in enumerate(refs.items())}
    assert judge(_evidence(alt, refs, ("float16",)), plan).consistent_with is None  # bfloat16 not measured
    half = {k: _round(r, torch.float16, 300 + n) for n, (k, r) in enumerate(refs.items())}
    assert judge(_evidence(half, refs), plan).consistent_with == "float16"  # bfloat16's bound also holds


@pytest.mark.parametrize("scale", [1e-3, 1e-2, 1e-1])
def test_a_bug_in_an_exact_run_is_not_named(refs, plan, scale):
    """Float32-exact everywhere but one layer's output (and what follows), whose error is of the
    size of a bfloat16 run's or larger: it fails, and no precision is named."""
    alt = {k: r.astype(np.float32).astype(np.float64) for k, r in refs.items()}
    for k in KEYS[2:]:
        alt[k] = alt[k] + scale * np.random.default_rng(7).standard_normal(alt[k].shape)
    verdict = judge(_evidence(alt, refs), plan)
    assert not verdict.passed and verdict.first_divergence == KEYS[2]
    assert verdict.consistent_with is None
    assert all(j.consistent_with is None for j in verdict.checkpoints.values())


def test_a_passing_run_names_nothing(refs, plan):
    alt = {k: r.astype(np.float32).astype(np.float64) for k, r in refs.items()}
    verdict = judge(_evidence(alt, refs), plan)
    assert verdict.passed and verdict.consistent_with is None


def test_the_terminal_says_consistent_with_and_the_json_carries_it(refs, plan):
    from rich.console import Console

    from debug_framework.cli.debug_validate import _print_summary
    from debug_framework.services.validation.results import CheckpointResult, ValidationResult

    alt = {k: _round(r, torch.bfloat16, 300 + n) for n, (k, r) in enumerate(refs.items())}
    evidence = _evidence(alt, refs)
    result = ValidationResult.assemble(evidence, judge(evidence, plan), session_id="s", model_path="m",
                                       reference_backend="python_reference", alternative_backend="openvino",
                                       reference_dtype="float64", alternative_dtype="float32")
    doc = result.to_dict()
    assert doc["consistent_with"] == "bfloat16" and doc["precision_diagnosis"]["measured"] == ["float16", "bfloat16"]
    assert {r["consistent_with"] for r in doc["results"]} == {"bfloat16"}
    row = result.results[0].to_row()
    assert CheckpointResult.from_row(row).judgement.consistent_with == "bfloat16"  # the stored row reads back
    console = Console(width=100, record=True, color_system=None)
    _print_summary(console, result, False, "")
    text = console.export_text()
    assert "precision: consistent with a correct bfloat16 run" in text and "declared float32" in text


def test_an_engines_emulated_precision_is_worded_as_its_own_not_as_a_dtype_to_validate_at():
    """llama.cpp's ``q8_0`` (or its F16 cache's ``float16``) is no dtype to pass: judge it at --dtype auto."""
    from debug_framework.reports._common import precision_text

    emulated = {"q8_0": "float32"}
    words = precision_text("q8_0", "float32", None, emulated)
    assert "alternative's own q8_0 precision" in words and "--dtype auto" in words
    assert "validate it at that dtype" in precision_text("bfloat16", "float32", None, emulated)
