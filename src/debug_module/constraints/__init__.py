"""Accelerator constraints checked on ATen-level FX graphs from FakeTensor metadata.

    from debug_module.constraints import ShapeConstraint, DtypeConstraint, check_graph
    report = check_graph(aten_gm, [ShapeConstraint(alignment=8), DtypeConstraint({"float32"})])
"""

from .base import Constraint, NodeInfo, SourceLocation, TensorMeta, Violation, op_name
from .builtin import (
    DEFAULT_ALLOWED_DTYPES,
    CallableConstraint,
    DtypeConstraint,
    DynamicShapeConstraint,
    LayoutConstraint,
    MaxRankConstraint,
    MemoryConstraint,
    OpAllowlistConstraint,
    OpDenylistConstraint,
    ShapeConstraint,
    UnsupportedOpsConstraint,
    as_constraint,
)
from .checker import Coverage, GraphReport, check_graph, compute_coverage
from .memory import MemoryEstimate, estimate_peak_memory

__all__ = [
    "Constraint", "NodeInfo", "SourceLocation", "TensorMeta", "Violation", "op_name",
    "DEFAULT_ALLOWED_DTYPES", "CallableConstraint", "DtypeConstraint", "DynamicShapeConstraint",
    "LayoutConstraint", "MaxRankConstraint", "MemoryConstraint", "OpAllowlistConstraint", "OpDenylistConstraint",
    "ShapeConstraint", "UnsupportedOpsConstraint", "as_constraint",
    "Coverage", "GraphReport", "check_graph", "compute_coverage",
    "MemoryEstimate", "estimate_peak_memory",
]
