"""Fixtures for the storage tests: a fresh database per test and result dicts shaped like
``ComparisonResult.to_dict()`` (the comparison core's output)."""

from __future__ import annotations

from typing import Any

import pytest

from debug_framework.services.database_manager import DatabaseManager


def _result(checkpoint: str, layer: int | None, max_abs: float, passed: bool, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "checkpoint": checkpoint, "layer": layer, "passed": passed,
        "reason": None if passed else f"max abs error {max_abs} > tolerance",
        "shape_match": True, "dtype_match": True, "numel": 4096,
        "max_abs_error": max_abs, "mean_abs_error": max_abs / 10, "median_abs_error": max_abs / 20,
        "p99_abs_error": max_abs / 2, "max_rel_error": max_abs * 3, "mean_rel_error": max_abs / 5,
        "rmse": max_abs / 8, "rel_l2_error": max_abs / 7, "cosine_similarity": 1.0 - max_abs,
        "sqnr_db": 60.0, "mismatch_count": 0 if passed else 17, "mismatch_percent": 0.0 if passed else 0.415,
        "max_ulp_error": 3.0, "nan_count_ref": 0, "nan_count_alt": 0, "inf_count_ref": 0, "inf_count_alt": 0,
        "first_nonfinite_index": None,
        "worst": [{"index": [0, 3], "ref": 1.0, "alt": 1.0 + max_abs, "abs_error": max_abs}],
        "tolerance": {"rtol": 1e-4, "atol": 1e-6},
    }
    d.update(extra)
    return d


@pytest.fixture
def make_result():
    return _result


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "db" / "debug_framework.db"


@pytest.fixture
def db(db_path):
    manager = DatabaseManager(db_path)
    yield manager
    manager.close()
