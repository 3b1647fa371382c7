"""Op-by-op conformance of a ``torch.compile`` backend: every OpInfo operator it accepts, judged
sample by sample against float64 eager by the calibrated rule (docs/conformance.md).

    from debug_framework.conformance import SweepSettings, run_sweep
    result = run_sweep(SweepSettings(backend="aot_eager", ops=["add", "softmax"]), database="sessions.db")
    result.passed, [o.op for o in result.failing]

``debug_opsweep`` is the command line. Importing this package loads no torch: the sweep runs in
worker processes, and :mod:`.ops`, :mod:`.samples`, :mod:`.judge` are imported there.
"""

from .results import FAILING, OpResult, SweepResult, render_junit
from .sweep import DEFAULT_TIMEOUT_S, SweepSettings, run_sweep, sweep_key

__all__ = ["SweepSettings", "run_sweep", "sweep_key", "SweepResult", "OpResult", "FAILING", "render_junit",
           "DEFAULT_TIMEOUT_S"]
