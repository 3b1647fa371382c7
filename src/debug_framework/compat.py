"""The spec's faces, in one module: every spec-named class and method that only presents the spec's
name and shape over the project's direct API.

The API reference names them, so a user of it finds them; the project's own code calls the direct
API instead (``tests/core/test_compat.py`` checks both)::

    spec face                                              direct API
    DatabaseManager(path).get_session(sid) ...             Database(path).sessions.get(sid) ...
    TensorComparisonEngine().compare_tensors(a, b, tol)    comparison.compare(a, b, check_dtype=False, **tol)
    DebugSession.save / load / update_status /             db.sessions.create / update / get / update_status,
        add_checkpoint_result                                  db.checkpoints.add_many
    ValidationReport.generate_html_report / save_to_file   reports.render_report(report, fmt),
        / export_to_json                                       models._common.write_report_file
    BatchValidationJob.execute / get_progress / cancel     services.executors.execute_job(job),
                                                               db.batches.progress / cancel
    CompilationEngine.compile_*_kernel /                   engine.build_source(...),
        validate_compilation                                   engine.validation_report(...)["passed"]

The spec's import paths keep working: ``debug_framework.services.database_manager`` and
``debug_framework.services.tensor_comparison_engine`` re-export the two classes, and the record
classes (``DebugSession``, ``ValidationReport``, ``BatchValidationJob``) and ``CompilationEngine``
inherit their spec verbs from the ``*Faces`` mixins below.

Layer: models. The faces sit over the stores, the comparison core and the records' data; this module
imports no record module (the records import it). The two faces that need an upper layer, rendering a
report and executing a batch job, reach it through a process default the composition root
(``debug_framework/__init__.py``, through ``services.wiring``) installs: :data:`REPORT_RENDERER`
and :data:`BATCH_EXECUTOR`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Protocol, Self, Unpack

from .errors import ConfigurationError
from .jsonio import JsonObject, dumps_json
from .models._common import (BATCH_EXECUTOR_ROLE, REPORT_RENDERER_ROLE, Collaborator, format_time, parse_time,
                             write_report_file)
from .report_formats import REPORT_FORMATS  # the formats ReportFaces.save_to_file writes
from .storage.checkpoints import ResultKeys
from .storage.database import Database, DatabaseLike, open_database
from .storage.sessions import SessionFilter, SessionProvenance

if TYPE_CHECKING:
    from .storage.tensor_store import TensorStore

__all__ = [
    "DatabaseManager",
    "TensorComparisonEngine",
    "SessionFaces",
    "ReportFaces",
    "BatchJobFaces",
    "CompilationFaces",
    "EngineFaces",
    "ReportRenderer",
    "JobExecutor",
    "JobRunner",
    "REPORT_RENDERER",
    "BATCH_EXECUTOR",
    "REPORT_FORMATS",
]

# ============================================================== the upper layers the faces reach


class ReportRenderer(Protocol):
    """Renders a report as one document (``debug_framework.reports.render_report`` is one)."""

    def __call__(self, report: ReportFaces, fmt: str = "json", *, include_tensors: bool = False,
                 store: TensorStore | None = None) -> str: ...


class JobExecutor(Protocol):
    """An object that runs a batch job's unfinished items (``services.batch_executor.BatchExecutor``,
    ``services.ray_executor.RayExecutor``) and returns the job's results."""

    def execute(self, job: BatchJobFaces, *, progress: Callable[[JsonObject], None] | None = None,
                ) -> list[JsonObject]: ...


class JobRunner(Protocol):
    """Runs a batch job with the executor its configuration names (``services.executors.execute_job``)."""

    def __call__(self, job: BatchJobFaces, *, progress: Callable[[JsonObject], None] | None = None,
                 ) -> list[JsonObject]: ...


#: The process default renderer of ``ValidationReport``'s faces (``reports.render_report``).
REPORT_RENDERER: Collaborator[ReportRenderer] = Collaborator(
    REPORT_RENDERER_ROLE, "pass renderer=debug_framework.reports.render_report")
#: The process default runner of ``BatchValidationJob.execute`` (``services.executors.execute_job``).
BATCH_EXECUTOR: Collaborator[JobRunner] = Collaborator(
    BATCH_EXECUTOR_ROLE, "pass executor=debug_framework.services.batch_executor.BatchExecutor()")


# ============================================================== DatabaseManager


class DatabaseManager(Database):
    """The spec's database manager: a :class:`~debug_framework.storage.database.Database` (records,
    stores and engines accept it) with the spec's flat methods, each one call to a store.

    ``DatabaseManager(database_path, *, busy_timeout_s=10.0, max_retry_s=120.0, initialize=True)``;
    ``get_connection``, ``execute_query``, ``create_tables`` and ``migrate_schema`` are the
    database's own. The project itself opens a ``Database`` and calls its stores.
    """

    # ---------------------------------------------------------------- sessions (db.sessions)

    def create_session(self, model_path: str, reference_backend: str, alternative_backend: str,
                       **provenance: Unpack[SessionProvenance]) -> str:
        """``db.sessions.create``: insert a session in status ``created``; returns its id."""
        return self.sessions.create(model_path, reference_backend, alternative_backend, **provenance)

    def update_session(self, session_id: str, **fields: object) -> None:
        """``db.sessions.update``: provenance fields / ``results`` (not the status)."""
        self.sessions.update(session_id, **fields)

    def update_session_status(self, session_id: str, status: str, error_message: str | None = None) -> str:
        """``db.sessions.update_status``: a checked transition; returns the previous status."""
        return self.sessions.update_status(session_id, status, error_message)

    def get_session(self, session_id: str) -> JsonObject | None:
        """``db.sessions.get``: the session row (JSON columns decoded), or None."""
        return self.sessions.get(session_id)

    def list_sessions(self, **where: Unpack[SessionFilter]) -> list[JsonObject]:
        """``db.sessions.list``: sessions, newest first, optionally filtered."""
        return self.sessions.list(**where)

    def delete_session(self, session_id: str) -> bool:
        """``db.sessions.delete``: the session and (by cascade) its rows."""
        return self.sessions.delete(session_id)

    # ---------------------------------------------------------------- checkpoint results (db.checkpoints)

    def add_checkpoint_result(self, session_id: str, result: Mapping[str, object], **keys: Unpack[ResultKeys]) -> None:
        """``db.checkpoints.add_many`` of one result dict (replaces its ``(checkpoint, layer)`` row)."""
        self.checkpoints.add_many(session_id, [result], **keys)

    def add_checkpoint_results(self, session_id: str, results: Iterable[Mapping[str, object]],
                               **keys: Unpack[ResultKeys]) -> int:
        """``db.checkpoints.add_many``: many result dicts in one transaction; returns how many."""
        return self.checkpoints.add_many(session_id, results, **keys)

    def get_checkpoint_results(self, session_id: str) -> list[JsonObject]:
        """``db.checkpoints.for_session``: the session's result dicts in model order."""
        return self.checkpoints.for_session(session_id)

    # ---------------------------------------------------------------- recordings / comparisons (db.recordings)

    def add_tensor_recording(self, record: Mapping[str, object]) -> str:
        """``db.recordings.add``: a tensor_recordings row; returns its id."""
        return self.recordings.add(record)

    def get_tensor_recordings(self, session_id: str) -> list[JsonObject]:
        """``db.recordings.for_session``."""
        return self.recordings.for_session(session_id)

    def get_tensor_recording(self, recording_id: str) -> JsonObject | None:
        """``db.recordings.get``."""
        return self.recordings.get(recording_id)

    def referenced_content_hashes(self) -> set[str]:
        """``db.recordings.referenced_content_hashes``."""
        return self.recordings.referenced_content_hashes()

    def add_tensor_comparison(self, record: Mapping[str, object]) -> str:
        """``db.recordings.add_comparison``."""
        return self.recordings.add_comparison(record)

    def get_tensor_comparisons(self, session_id: str) -> list[JsonObject]:
        """``db.recordings.comparisons_for_session``."""
        return self.recordings.comparisons_for_session(session_id)

    # ---------------------------------------------------------------- batch jobs (db.batches)

    def create_batch_job(self, model_paths: Sequence[str], config: Mapping[str, object] | None = None,
                         *, job_id: str | None = None) -> str:
        """``db.batches.create``: one pending item per model path (an existing id is a no-op)."""
        return self.batches.create(model_paths, config, job_id=job_id)

    def get_batch_job(self, job_id: str) -> JsonObject | None:
        """``db.batches.get``."""
        return self.batches.get(job_id)

    def update_batch_job_status(self, job_id: str, status: str) -> None:
        """``db.batches.set_status``."""
        self.batches.set_status(job_id, status)

    def update_batch_item(self, job_id: str, item_index: int, *, status: str, session_id: str | None = None,
                          error_message: str | None = None) -> None:
        """``db.batches.update_item``."""
        self.batches.update_item(job_id, item_index, status=status, session_id=session_id,
                                 error_message=error_message)

    def claim_batch_item(self, job_id: str) -> JsonObject | None:
        """``db.batches.claim_item``: atomically take the next pending item; None when none is left."""
        return self.batches.claim_item(job_id)


# ============================================================== TensorComparisonEngine


class TensorComparisonEngine:
    """The spec's dict-speaking comparison engine over :func:`debug_framework.comparison.compare`
    (every number comes from it; nothing is computed twice)."""

    def __init__(self, default_tolerance_config: Mapping[str, object] | None = None, *, top_k: int = 5) -> None:
        self.default_tolerance_config = dict(default_tolerance_config or {})
        self.top_k = top_k

    def compare_tensors(self, reference_tensor: object, alternative_tensor: object,
                        tolerance: Mapping[str, object] | None = None) -> JsonObject:
        """``compare(reference, alternative, check_dtype=False, **tolerance)`` as a dict: every metric
        plus ``match_status``, ``max_absolute_error``, ``max_relative_error`` and ``tolerance_config``.
        ``tolerance`` holds ``rtol``/``atol`` (and optionally the other ``Tolerance`` fields) over
        the engine's defaults and the dtype's; other keys are ignored."""
        from dataclasses import fields

        from .comparison import Tolerance, compare

        merged = {**self.default_tolerance_config, **(tolerance or {})}
        known = {f.name for f in fields(Tolerance)}
        res = compare(reference_tensor, alternative_tensor, check_dtype=False, top_k=self.top_k,
                      **{k: v for k, v in merged.items() if k in known})
        out = res.to_dict(json_compatible=True)
        out.update(match_status=res.passed, max_absolute_error=out["max_abs_error"],
                   max_relative_error=out["max_rel_error"], tolerance_config=res.tolerance.to_dict())
        return out

    def analyze_differences(self, reference_tensor: object, alternative_tensor: object) -> JsonObject:
        """The error distribution, worst elements, non-finite values and the tightest (atol, rtol)
        each pair would pass with, grouped from one ``compare``."""
        from .comparison import compare

        res = compare(reference_tensor, alternative_tensor, check_dtype=False, top_k=max(self.top_k, 10))
        d = res.to_dict(json_compatible=True)
        pick = lambda *keys: {k: d[k] for k in keys}  # noqa: E731
        return {
            "distribution": pick("max_abs_error", "mean_abs_error", "median_abs_error", "p99_abs_error", "rmse"),
            "relative": pick("max_rel_error", "mean_rel_error", "rel_l2_error"),
            "similarity": pick("cosine_similarity", "sqnr_db", "max_ulp_error", "ulp_dtype"),
            "non_finite": pick("nan_count_ref", "nan_count_alt", "inf_count_ref", "inf_count_alt",
                               "first_nonfinite_index", "nonfinite_mismatch_count"),
            "worst_elements": d["worst"],
            "needed_atol_at_rtol_0": d["max_abs_error"],
            "needed_rtol_at_atol_0": d["max_rel_error"],
            "shape": d["reference_shape"],
            "dtypes": [d["reference_dtype"], d["alternative_dtype"]],
        }

    def generate_comparison_report(self, comparison_results: Sequence[Mapping[str, object]]) -> JsonObject:
        """Summarise many ``compare_tensors`` results: counts, pass rate, the worst entry."""
        results = list(comparison_results)
        passed = [r for r in results if r.get("match_status", r.get("passed"))]
        numeric = [r for r in results if isinstance(r.get("max_abs_error"), int | float)]
        worst = max(numeric, key=lambda r: r["max_abs_error"], default=None)
        return {
            "total": len(results),
            "passed": len(passed),
            "failed": len(results) - len(passed),
            "pass_rate": (len(passed) / len(results)) if results else None,
            "worst": None if worst is None else {"name": worst.get("name", ""), "max_abs_error": worst["max_abs_error"]},
            "failed_names": [r.get("name", "") for r in results if r not in passed],
        }


# ============================================================== DebugSession's verbs

#: The session fields :meth:`SessionFaces.save` writes after creation (everything but the status).
_PROVENANCE = (
    "model_path", "weights_digest", "reference_backend", "reference_backend_info", "alternative_backend",
    "alternative_backend_info", "config", "tolerances", "seed", "inputs_ref", "environment", "results",
)


class SessionFaces:
    """``DebugSession``'s spec verbs over the session and checkpoint stores of the record's database
    (``db=`` on the record, or given to each call: a ``Database`` or a path)."""

    # the record fields these verbs use (DebugSession declares them)
    session_id: str
    model_path: str
    reference_backend: str
    alternative_backend: str
    config: JsonObject
    created_at: datetime
    status: str
    results: JsonObject | None
    weights_digest: str | None
    reference_backend_info: JsonObject | None
    alternative_backend_info: JsonObject | None
    tolerances: JsonObject | None
    seed: int | None
    inputs_ref: str | None
    environment: JsonObject | None
    error_message: str | None
    db: DatabaseLike | None

    if TYPE_CHECKING:
        @classmethod
        def from_dict(cls, data: JsonObject, *, db: DatabaseLike | None = None) -> Self: ...

    def _database(self, db: DatabaseLike | None = None) -> Database:
        """The database to use: ``db`` if given (and remembered), else the one the record holds."""
        if db is not None or not isinstance(self.db, Database):
            self.db = open_database(db if db is not None else self.db)
        return self.db

    def save(self, db: DatabaseLike | None = None) -> bool:
        """Insert the session (status ``created``) or update its provenance and ``results``; a changed
        ``status`` goes through the checked transition. One transaction."""
        sessions = self._database(db).sessions
        with sessions.core.transaction():
            row = sessions.get(self.session_id)
            if row is None:
                sessions.create(
                    self.model_path, self.reference_backend, self.alternative_backend,
                    config=self.config, session_id=self.session_id, weights_digest=self.weights_digest,
                    reference_backend_info=self.reference_backend_info,
                    alternative_backend_info=self.alternative_backend_info, tolerances=self.tolerances,
                    seed=self.seed, inputs_ref=self.inputs_ref, environment=self.environment,
                    created_at=format_time(self.created_at),
                )
                if self.results is not None:
                    sessions.update(self.session_id, results=self.results)
                row = sessions.get(self.session_id)
            else:
                changed = {k: getattr(self, k) for k in _PROVENANCE if getattr(self, k) != row.get(k)}
                if changed:
                    sessions.update(self.session_id, **changed)
            assert row is not None
            if self.status != row["status"]:
                sessions.update_status(self.session_id, self.status, self.error_message)
        self._refresh()
        return True

    @classmethod
    def load(cls, session_id: str, db: DatabaseLike | None = None) -> Self | None:
        """The stored session, or None (``db``: a Database or a database path, required)."""
        database = open_database(db)
        row = database.sessions.get(session_id)
        return None if row is None else cls.from_dict(row, db=database)

    def _refresh(self) -> None:
        """Take the stored status and timestamps back into the record."""
        row = self._database().sessions.get(self.session_id)
        if row is None:  # pragma: no cover - deleted concurrently
            return
        self.status, self.error_message = row["status"], row.get("error_message")
        for key in ("created_at", "updated_at", "started_at", "finished_at"):
            value = parse_time(row.get(key))
            if value is not None or key != "created_at":
                setattr(self, key, value)

    def update_status(self, status: str, error_message: str | None = None, *, db: DatabaseLike | None = None) -> bool:
        """``db.sessions.update_status``: created->running|error, running->passed|failed|error
        (ValidationError, DF005, for another transition)."""
        self._database(db).sessions.update_status(self.session_id, status, error_message)
        self._refresh()
        return True

    def add_checkpoint_result(self, checkpoint_name: str, result: JsonObject, *,
                              layer: int | None | EllipsisType = ..., db: DatabaseLike | None = None) -> bool:
        """``db.checkpoints.add_many`` of one result under ``checkpoint_name`` (layer from the dict
        unless given; the same (checkpoint, layer) again replaces the row)."""
        keys: ResultKeys = {"checkpoint": checkpoint_name}
        if not isinstance(layer, EllipsisType):
            keys["layer"] = layer
        self._database(db).checkpoints.add_many(self.session_id, [result], **keys)
        return True

    def checkpoint_results(self, db: DatabaseLike | None = None) -> list[JsonObject]:
        """``db.checkpoints.for_session``: the stored result dicts, in the order first written."""
        return self._database(db).checkpoints.for_session(self.session_id)


# ============================================================== ValidationReport's verbs


class ReportFaces:
    """``ValidationReport``'s spec verbs: a renderer (``renderer=``, else :data:`REPORT_RENDERER`)
    and an atomic file write."""

    if TYPE_CHECKING:
        def to_dict(self) -> JsonObject: ...

    def export_to_json(self, *, indent: int | None = 2) -> str:
        """The record's ``to_dict()`` as strict JSON (non-finite numbers as "NaN", "Infinity", "-Infinity")."""
        return dumps_json(self.to_dict(), indent=indent)

    def generate_html_report(self, *, include_tensors: bool = False, store: TensorStore | None = None,
                             renderer: ReportRenderer | None = None) -> str:
        """``render_report(report, "html")``: one self-contained page, every value escaped."""
        render = renderer or REPORT_RENDERER.get()
        return render(self, "html", include_tensors=include_tensors, store=store)

    def save_to_file(self, file_path: str | os.PathLike[str], format: str = "json", *,
                     include_tensors: bool = False, renderer: ReportRenderer | None = None) -> bool:
        """Write ``render_report(report, format)`` (``json``, ``html``, ``csv`` or ``junit``)
        atomically. ConfigurationError (DF005) for another format or an unwritable path,
        ResourceExhaustedError (DF007) when there is no room to write."""
        fmt = format.lower()
        if fmt not in REPORT_FORMATS:
            raise ConfigurationError(f"unknown report format {format!r}", hint=f"use one of {', '.join(REPORT_FORMATS)}")
        render = renderer or REPORT_RENDERER.get()
        write_report_file(Path(file_path).expanduser(), render(self, fmt, include_tensors=include_tensors))
        return True


# ============================================================== BatchValidationJob's verbs


class BatchJobFaces:
    """``BatchValidationJob``'s spec verbs: the batch queue store of the job's database, and the
    executor its configuration names (``executor=``, else :data:`BATCH_EXECUTOR`)."""

    job_id: str
    db: Database

    def execute(self, *, progress: Callable[[JsonObject], None] | None = None,
                executor: JobExecutor | None = None) -> list[JsonObject]:
        """Run every unfinished item (resuming an interrupted or cancelled job); one dict per item:
        ``model_path``, ``status`` (done/failed/cancelled), ``session_id``, ``verdict``, ``error``.
        ValidationError (DF005) while another process executes the job."""
        if executor is not None:
            return executor.execute(self, progress=progress)
        return BATCH_EXECUTOR.get()(self, progress=progress)

    def get_progress(self) -> JsonObject:
        """``db.batches.progress``: counts by item status, ``finished``, ``percent``, the job status."""
        return self.db.batches.progress(self.job_id)

    def cancel(self) -> bool:
        """``db.batches.cancel``: no more items are handed out (running ones finish); the pending
        ones are cancelled. Executing the job again resumes it."""
        self.db.batches.cancel(self.job_id)
        return True


# ============================================================== CompilationEngine's verbs


class CompilationFaces:
    """``CompilationEngine``'s spec verbs over its ``build_source`` and ``validation_report``."""

    if TYPE_CHECKING:
        def build_source(self, source_path: str | os.PathLike[str], backend_type: str,
                         output_path: str | os.PathLike[str] | None = None) -> object: ...

        def validation_report(self, compiled_path: str | os.PathLike[str], backend_type: str) -> JsonObject: ...

    def compile_cuda_kernel(self, source_path: str | os.PathLike[str], output_path: str | os.PathLike[str]) -> bool:
        """Compile a CUDA source (or a cuda plugin's manifest) to a shared library with nvcc. DF008 on failure."""
        self.build_source(source_path, "cuda", output_path)
        return True

    def compile_metal_kernel(self, source_path: str | os.PathLike[str], output_path: str | os.PathLike[str]) -> bool:
        """Compile a Metal source to a ``.metallib`` (xcrun metal + metallib, macOS only). DF008 elsewhere, saying why."""
        self.build_source(source_path, "metal", output_path)
        return True

    def compile_cpp_kernel(self, source_path: str | os.PathLike[str], output_path: str | os.PathLike[str]) -> bool:
        """Compile a C++ source (or a cpp plugin's manifest) against torch to a shared library. DF008 on failure."""
        self.build_source(source_path, "cpp", output_path)
        return True

    def compile_triton_kernel(self, source_path: str | os.PathLike[str], output_path: str | os.PathLike[str]) -> bool:
        """Check a Triton source (it is JIT-compiled when first run) and store it. DF008 on a syntax error."""
        self.build_source(source_path, "triton", output_path)
        return True

    def validate_compilation(self, compiled_path: str | os.PathLike[str], backend_type: str) -> bool:
        """``validation_report(...)["passed"]``: the artifact loads, its ops are there, opcheck passes."""
        return bool(self.validation_report(compiled_path, backend_type)["passed"])


# ============================================================== ValidationEngine's verbs

#: ``progress(stage, done, total)``: called as each stage of a validation finishes.
Progress = Callable[[str, int, int], None]


class _ResultRecord(Protocol):
    """What a typed validation result gives the face: its JSON document."""

    def to_dict(self) -> JsonObject: ...



class EngineFaces:
    """``ValidationEngine``'s spec verb over its typed ``run``."""

    if TYPE_CHECKING:
        def run(self, session_id: str, *, progress: Progress | None = None) -> _ResultRecord: ...

    def execute_validation(self, session_id: str, *, progress: Progress | None = None) -> JsonObject:
        """Run the session's validation; returns ``run(session_id).to_dict()`` (the result's JSON)."""
        return self.run(session_id, progress=progress).to_dict()
