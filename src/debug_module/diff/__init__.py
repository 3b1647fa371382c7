"""KernelDiff: compare a backend under test against a reference, tensor by tensor.

    from debug_module.diff import KernelDiffHarness, compare_tensors

    result = compare_tensors(eager_out, compiled_out)        # thin front over the comparison core
    report = KernelDiffHarness(model, (x,), model_name="mlp").compare(generate_visualizations=True)
    print(report.summary())
"""

from .harness import KernelDiffHarness
from .metrics import TensorComparisonResult, compare_tensors
from .report import REPORT_SCHEMA, DiffReport, TensorDiff

__all__ = ["KernelDiffHarness", "DiffReport", "TensorDiff", "compare_tensors", "TensorComparisonResult",
           "REPORT_SCHEMA"]
