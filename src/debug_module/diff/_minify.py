"""Hand an accuracy failure found by KernelDiff to the minifier (``debug_module.minifier``).

The failing Dynamo graphs are the ones the test backend compiled (recorded by the harness's timing
wrapper, with the example inputs Dynamo gave the backend). Each is checked with the minifier's
``AccuracySignature`` (same backend, same reference, the judgement that failed: the tolerance, or in
float64 mode the same ratio rule, ``RatioRule.verdict``, with eager as the baseline; the harness's
``test_backend_spec`` tells the repro how to import the backend); the first graph on
which the failure reproduces in isolation is minified and its repro directory linked. A gradient-only
failure does not reproduce on forward graphs and is reported as such, not minified.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def minify_accuracy_failure(harness: Any, test: Any, report: Any, run: Any) -> dict[str, Any]:
    from ..minifier import AccuracySignature, Minifier

    if not harness.model_name or test.timed is None or not test.timed.graphs:
        return {"status": "skipped", "detail": "the test side compiled no graph (nothing to minify)"}
    failing = [d for d in report.outputs if not d.passed]
    if not failing:
        return {"status": "skipped",
                "detail": "forward outputs agree; gradient-only failures are not minified (the minifier judges forward graphs)"}
    tol = failing[0].result.tolerance
    reference = "float64" if harness.float64 else "eager"
    backend = test.backend_spec if isinstance(test.backend_spec, str) else test.timed.inner
    try:
        sig = AccuracySignature(backend, reference=reference, rtol=tol.rtol, atol=tol.atol,
                                backend_spec=getattr(harness, "test_backend_spec", None),
                                ratio=harness.ratio_rule if harness.float64 else None)
        for i, (gm, inputs) in enumerate(test.timed.graphs):
            holds, _ = sig.check(gm, inputs)
            if not holds:
                continue
            out_dir = (Path(run.path) / "repros" / f"accuracy_graph_{i:03d}") if run is not None else None
            result = Minifier(gm, inputs, sig, progress=False, max_seconds=harness.minify_max_seconds,
                              output_dir=out_dir, title=f"KernelDiff accuracy failure: {harness.model_name}").minify()
            repro = str(result.repro_path) if result.repro_path else None
            if run is not None and result.repro_path:
                # repro_path is <dir>/repro.py: record every file of its directory (inputs, backend copy...)
                run.record_tree(Path(result.repro_path).parent.relative_to(run.path).as_posix(), "repro",
                                f"accuracy_graph_{i:03d}")
            detail = "; ".join([result.summary(), *result.notes])  # notes: why a repro is missing/unverified
            return {"status": "ran", "graph": i, "repro": repro, "verified": result.verified,
                    "detail": detail, "signature": sig.describe()}
    except Exception as e:  # noqa: BLE001 - report, never mask the KernelDiff result
        return {"status": "failed", "detail": f"{type(e).__name__}: {e}"[:600]}
    return {"status": "not_reproduced",
            "detail": f"the failure did not reproduce on any of {len(test.timed.graphs)} compiled graph(s) in isolation"}
