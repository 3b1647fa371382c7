"""The benchmark workloads: BERT (real MiniLM weights, and bert-base-sized random), ResNet-18, a Mamba-style SSM.

Each model comes as a :class:`Workload` factory (``build(size)`` -> model + example inputs) so the runner
treats them alike. ``size`` is ``"full"`` (the benchmark sizes) or ``"tiny"`` (quick mode / CI).
"""

from __future__ import annotations

from .registry import WORKLOADS, Workload, get_workload, param_count

__all__ = ["WORKLOADS", "Workload", "get_workload", "param_count"]
