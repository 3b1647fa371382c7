"""JSON report: the stored session as strict JSON (non-finite numbers as "NaN"/"Infinity" strings).

The document is ``ValidationReport.to_dict()`` (``report_id``, ``session_id``, ``overall_status``,
``summary_statistics``, ``checkpoint_results``, ``performance_metrics``, ``session``,
``tensor_recordings``, ``created_at``) plus ``verdict``, ``first_divergence`` and
``reproduce_command``. Each entry of ``checkpoint_results`` and ``first_divergence`` carries the
checkpoint's canonical ``id`` (``post_attention:1``, ``post_embedding``) beside its ``checkpoint``
and ``layer``; with ``include_tensors`` a ``tensors`` list with each recorded tensor's
statistics and its first ``max_tensor_values`` values.
"""

from __future__ import annotations

from ..jsonio import JsonObject, dumps_json
from ..storage.tensor_store import TensorStore
from ._common import first_divergence_entry, reproduce_command
from ._tensors import open_store, tensor_summary
from .documents import DiffSource, ReportSource, stored


__all__ = ["report_document", "render_json", "render_diff_json"]


def report_document(report: ReportSource, *, include_tensors: bool = False, store: TensorStore | None = None,
                    max_tensor_values: int = 4096) -> JsonObject:
    """The JSON report's document (see the module's docstring)."""
    view = stored(report)
    doc = report.to_dict()
    # the id first; it replaces the store's row number, which names nothing outside the database
    doc["checkpoint_results"] = [{"id": typed.id, **{k: v for k, v in r.items() if k != "id"}}
                                 for typed, r in zip(view.rows, report.checkpoint_results)]
    doc["verdict"] = view.verdict
    doc["first_divergence"] = first_divergence_entry(view.first_divergence)
    cmd, exact = reproduce_command(view.record, view.result)
    doc["reproduce_command"] = {"command": cmd, "exact": exact}
    if include_tensors:
        st = open_store(store, report.tensor_store_root) if report.tensor_recordings else None
        doc["tensors"] = [tensor_summary(r, st, max_values=max_tensor_values) for r in report.tensor_recordings]
    return doc


def render_json(report: ReportSource, *, include_tensors: bool = False, store: TensorStore | None = None,
                max_tensor_values: int = 4096, indent: int | None = 2) -> str:
    doc = report_document(report, include_tensors=include_tensors, store=store, max_tensor_values=max_tensor_values)
    return dumps_json(doc, indent=indent)


def render_diff_json(diff: DiffSource, *, indent: int | None = 2) -> str:
    return dumps_json(diff.to_dict(), indent=indent)
