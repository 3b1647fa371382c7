"""The spec's import path of ``TensorComparisonEngine``
(``debug_framework.services.tensor_comparison_engine``).

``TensorComparisonEngine`` is a face, defined in :mod:`debug_framework.compat`: dicts in and out
over :func:`debug_framework.comparison.compare`, which the project's own code calls.
"""

from __future__ import annotations

from ..compat import TensorComparisonEngine

__all__ = ["TensorComparisonEngine"]
