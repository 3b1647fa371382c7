"""The validation engine: run two backends on the same saved inputs, compare every checkpoint,
name the first divergence, isolate the layer that introduces error, and store it all.

    engine = ValidationEngine("/tmp/debug.db")
    sid = engine.create_session("path/to/model", {"isolate": True}, "python_reference", "pytorch")
    result = engine.execute_validation(sid)          # JSON-ready dict (ValidationResult.to_dict())
    result["verdict"], result["first_divergence"]

A validation is a list of stages (:mod:`debug_framework.services.validation.stages`: load,
prepare, reference, alternative, compare, isolation, oracle, noise floor, record, store) over one
:class:`~debug_framework.services.validation.stages.RunContext`. :meth:`ValidationEngine.run` is
the only loop: it reports progress and times each stage; each checkpoint row is written once, by
the store stage, or, where a stage fails part-way, judged on the evidence so far before the
session is set to ``error`` with its message.

The session's configuration is one :class:`~debug_framework.models.session_config.SessionConfig`,
validated where it enters (``create_session``); the plan is resolved once, and the model, the
inputs and the backends ``create_session`` built are handed to the run in the same process (a run
elsewhere loads the model and reads the saved inputs back).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from ..backends.artifacts import artifact_root
from ..backends.base import Backend
from ..backends.capabilities import backend_versions, capabilities, declared_dtype, emulated_precision, \
    produced_checkpoints
from ..comparison import OracleJudgement
from ..compat import EngineFaces
from ..config import database_settings, default_database_path, merge_config, resource_settings
from ..errors import (
    BackendInitializationError,
    ConfigurationError,
    DatabaseError,
    DebugFrameworkError,
    ValidationError,
    no_space_error,
)
from ..jsonio import JsonObject, JsonValue, json_safe
from ..measure import Timer
from ..models.debug_session import DebugSession, capture_environment
from ..models.validation_report import summarize_checkpoints
from ..storage.leases import holding
from ..storage.sessions import TERMINAL_STATUSES, SessionFilter, model_path_key
from ..storage.values import check_session_id, session_file
from ..storage.database import Database
from ..storage.tensor_store import TensorStore
from ..capture.spill import CaptureSink, capture_sink
from .maintenance import (
    AutoMaintenance,
    MaintenanceReport,
    artifacts_dir_of,
    auto_maintenance,
    inputs_dir_of,
    run_maintenance,
)
from .validation.deadline import check_deadline, session_deadline
from .validation.plan import (
    MODEL_TOLERANCES,
    SESSION_DEFAULTS,
    ValidationPlan,
    model_checkpoints,
    resolve_alternative_backend,
    resolve_tolerance,
)
from .validation.calibration import calibration_backend
from .validation.memory import RssWatch, capture_budget, check_memory, give_back_freed, session_estimate
from .validation.results import CheckpointResult, LayerResult, ValidationResult
from .validation.context import Prebuilt
from .validation.served_stage import served_alternative
from ..models.session_config import SessionConfig
from .validation.stages import DEFAULT_STAGES, RunContext, Stage

if TYPE_CHECKING:
    from ..modelio import LoadedModel, ModelInputs

__all__ = [
    "ValidationEngine",
    "SessionConfig",
    "ValidationResult",
    "CheckpointResult",
    "LayerResult",
    "OracleJudgement",
    "SESSION_DEFAULTS",
    "MODEL_TOLERANCES",
    "resolve_tolerance",
    "resolve_alternative_backend",
    "Progress",
    "LayerProgress",
]

#: ``progress(stage, done, total)``: called as each stage finishes.
Progress = Callable[[str, int, int], None]
#: ``layer_progress(stage, layers done, layers)``: called as a stage's forward pass (reference,
#: alternative, calibration) or its replays (isolation) get through the model's layers.
LayerProgress = Callable[[str, int, int], None]


def _backend_info(backend: Backend, dtype: str, device: str, extra: Mapping[str, JsonValue] | None = None) -> JsonObject:
    info: JsonObject = {"name": backend.name, "class": type(backend).__qualname__,
                            "module": type(backend).__module__, "dtype": dtype, "device": device}
    import numpy

    from ..backends.base import installed_version

    torch = installed_version("torch")  # not imported for it: an ONNX file's run never imports torch
    if torch is not None:
        info["torch"] = torch
    info["numpy"] = numpy.__version__
    info.update(_versions(backend))
    info.update(extra or {})
    return info


def _versions(backend: Backend) -> JsonObject:
    """``{"versions": backend.version_info()}``, ``{"versions_error": why}`` where that raised,
    ``{}`` for a backend without one."""
    try:
        more = backend_versions(backend)
    except Exception as exc:  # noqa: BLE001 - informational only
        return {"versions_error": str(exc)}
    return {"versions": {str(k): v for k, v in more.items()}} if isinstance(more, Mapping) else {}


def failure_message(exc: BaseException) -> str:
    """What a session (or a batch item) records of the exception that stopped it: a framework error
    as it reads, an interruption as such, anything else as the bug of ours it is. An exception that
    carries its own ``failure_message`` text (a cancel from the dashboard) records that."""
    own = getattr(exc, "failure_message", None)
    if isinstance(own, str):
        return own
    if isinstance(exc, DebugFrameworkError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by the user (Ctrl-C)"
    if not isinstance(exc, Exception):  # SystemExit, GeneratorExit
        return f"interrupted: {type(exc).__name__}"
    return f"internal error (a bug of the framework): {type(exc).__name__}: {exc}"


def _alternative_dtype(alt: Backend, model: LoadedModel, asked: str | None) -> tuple[str, str | None]:
    """The alternative's compute dtype: the one asked for; for ``"auto"`` the precision the backend
    declares for this model (an ONNX file's weight type, an engine's precision hint) and why, else its
    default dtype."""
    if asked and asked != "auto":
        return str(asked), None
    if asked == "auto":
        declared = declared_dtype(alt, model)
        if declared is not None:
            return declared[0], f"dtype auto: {declared[1]}"
        return capabilities(alt).default_dtype, f"dtype auto: {alt.name} declares no precision; its default"
    return capabilities(alt).default_dtype, None


def _quantized_modules(alt: Backend, cfg: SessionConfig) -> JsonObject:
    """``{"quantized_modules": [...]}`` for a session judged at the alternative's emulated precision
    whose module holds torchao-quantized weights (each module, scheme, group size, tensor class: what
    the precision diagnosis lists too), else ``{}``."""
    if cfg.emulated_precision is None:
        return {}
    from ..backends.quantized import quantized_modules

    found = quantized_modules(alt)
    return {"quantized_modules": found} if found else {}


def _reference_dtype(ref: Backend, cfg: SessionConfig, alt_dtype: str) -> str:
    if cfg.reference_dtype:
        return cfg.reference_dtype
    caps = capabilities(ref)
    if cfg.oracle and alt_dtype in caps.dtypes:
        return alt_dtype  # the ratio rule compares implementations at the same precision
    return caps.default_dtype


def _session_inputs(model: LoadedModel, cfg: SessionConfig) -> ModelInputs:
    """The session's inputs: the tokenized ``input_text``, else seeded random ids of ``input_shape``."""
    from ..modelio import ModelInputs

    side = cfg.padding_side
    if cfg.inputs_file is not None:
        inputs = ModelInputs.from_file(cfg.inputs_file)
    elif cfg.input_text is not None:
        text = cfg.input_text if isinstance(cfg.input_text, str) else list(cfg.input_text)
        inputs = ModelInputs.from_text(model.tokenizer, text, max_length=cfg.max_length, padding_side=side)
    else:
        batch, length = cfg.input_shape
        pads: Sequence[int] | None = cfg.pad_lengths
        if pads is None:
            pads = [0] + [length // 4] * (batch - 1) if batch > 1 else [0]
        if model.architecture == "generic":  # pixels, or an encoder's and a decoder's ids
            from ..modelio.generic import random_inputs

            inputs = random_inputs(model.config, batch, length, seed=cfg.seed, pad_lengths=list(pads),  # type: ignore[arg-type]
                                   padding_side=side)
        else:
            inputs = ModelInputs.random(model.config.vocab_size, batch, length, seed=cfg.seed,
                                        pad_lengths=list(pads), padding_side=side)
    reads_tokens = getattr(model.config, "input_kind", "tokens") == "tokens" and inputs.input_ids.shape[1] > 0
    if reads_tokens and "position_ids" not in inputs.extra:  # each token at its place in its own row
        inputs = inputs.with_positions(cfg.position_offset)
    return inputs


def _record_prepared_backends(ctx: RunContext, session: DebugSession) -> bool:
    """Once the backends are prepared: their ``version_info()`` as prepared (exported files,
    providers really used) replaces, under ``versions``, what was taken when the session was created."""
    for side in ("reference", "alternative"):
        backend = getattr(ctx, side, None)  # set by the prepare stage
        got = _versions(backend) if backend is not None else {}
        if "versions" in got:
            field_name = f"{side}_backend_info"
            setattr(session, field_name, {**(getattr(session, field_name) or {}), "versions": json_safe(got["versions"])})
    ctx.db.sessions.update(session.session_id, reference_backend_info=session.reference_backend_info,
                           alternative_backend_info=session.alternative_backend_info)
    return True


class ValidationEngine(EngineFaces):
    """Creates, runs and reads validation sessions stored in one SQLite database.

    Args:
        database_path: the database file; default ``config["database_path"]``
            (``~/.pie/debug/debug_framework.db``).
        config: the framework configuration (``DEFAULT_CONFIG`` keys); environment overrides are
            applied by the caller (``debug_framework.get_framework_config()``), never read here.
        stages: the stages of a validation, in order (default
            :data:`~debug_framework.services.validation.stages.DEFAULT_STAGES`); the last one that
            runs must store the result (``StoreStage``).

    With ``config["auto_cleanup"]`` (default) the engine's start releases sessions and batch items
    whose owner process is gone and optimises the database at most once per
    ``maintenance_interval`` (:func:`~debug_framework.services.maintenance.auto_maintenance`; what it
    did is :attr:`maintenance`). A validation runs under ``max_session_duration``.
    """

    def __init__(self, database_path: str | os.PathLike[str] | None = None, *,
                 config: Mapping[str, object] | None = None, stages: Sequence[Stage] = DEFAULT_STAGES) -> None:
        self.config = merge_config(config)
        self.stages: tuple[Stage, ...] = tuple(stages)
        path = database_path if database_path is not None else default_database_path(self.config)
        self.db = Database(path, **database_settings(self.config))
        self.database_path = self.db.database_path
        self.inputs_dir = inputs_dir_of(self.database_path)
        self.resources = resource_settings(self.config)
        self.maintenance: AutoMaintenance | None = None
        if self.resources.auto_cleanup:
            self.maintenance = auto_maintenance(self.db, self.resources)
        #: what the last create_session built (model, inputs, plan, backends), for its run in this process
        self._prebuilt: Prebuilt | None = None
        #: the sessions' artifact directories (exported graphs and their logs): ``<db dir>/<db name>_artifacts/``
        self.artifacts_dir = artifacts_dir_of(self.database_path)

    def __repr__(self) -> str:
        return f"ValidationEngine({self.db.location!r})"

    # ---------------------------------------------------------------- sessions

    def create_session(
        self,
        model_path: str | os.PathLike[str],
        config: SessionConfig | Mapping[str, object] | None = None,
        reference_backend: str = "auto",
        alternative_backend: str = "auto",
        *,
        session_id: str | None = None,
        command: str | None = None,
    ) -> str:
        """Create a session (status ``created``): the configuration is validated (a
        :class:`SessionConfig` as it is, a mapping of its keys checked), the model is loaded and its
        digest recorded, both backends are checked to be available, the plan is resolved, the
        inputs are built and saved beside the database. What was built is handed to the session's
        :meth:`run` in this process, not loaded, read back or resolved again.
        ``command`` is the shell command that reproduces the run (a CLI's own, recorded in the
        session's ``environment["command"]``; reports print it as the reproduce command).

        Raises:
            ModelLoadingError (DF004), BackendInitializationError (DF002), ValidationError (DF005)
            for a bad configuration, DatabaseError (DF003).
        """
        from ..modelio import load_model

        cfg = SessionConfig.coerce(config)  # validated once, here where it enters
        if not self.resources.performance_monitoring:  # the framework-wide switch: no profiling at all
            cfg = cfg.replace(performance_profiling_enabled=False)
        model = load_model(model_path, tier=cfg.model_tier)
        start_digest = getattr(model.weights, "start_digest", None)
        if callable(start_digest):  # hashed beside the backends' imports and the checks below
            start_digest()
        try:
            return self._create_session(model, cfg, reference_backend, alternative_backend, session_id, command)
        except BaseException:
            cancel = getattr(model.weights, "cancel_digest", None)
            if callable(cancel):  # no thread left hashing the files of a session never created
                cancel()
            raise

    def _create_session(self, model: LoadedModel, cfg: SessionConfig, reference_backend: str, alternative_backend: str,
                        session_id: str | None, command: str | None) -> str:
        """:meth:`create_session` once the model is loaded (its digest may be in progress)."""
        from ..backends import get_backend
        from ..backends.reference_choice import reference_for
        from ..backends.registry import default_engine_for

        reference_backend, ref_why = reference_for(reference_backend, model)
        # an ONNX file: the engine the registry names for the format runs it (no probe of every
        # backend's availability: that imports torch, transformers and Inductor)
        runner = default_engine_for(model.format) if alternative_backend == "auto" and model.format in ("onnx", "gguf") \
            else None
        if cfg.alternative_endpoint is not None:  # a served model: the registry's engine for it, whatever the file
            alt_name, why = served_alternative(alternative_backend), "alternative_endpoint: a served model"
        elif runner is not None:
            alt_name, why = runner.name, f"an {model.format.upper()} file: {runner.name} runs the file itself"
        else:
            alt_name, why = resolve_alternative_backend(alternative_backend, reference_backend)
        ref = get_backend(reference_backend, **cfg.reference_options)
        alt = get_backend(alt_name, **cfg.alternative_keywords())
        alt_dtype, dtype_why = _alternative_dtype(alt, model, cfg.dtype)
        ref_dtype = _reference_dtype(ref, cfg, alt_dtype)
        for b, dt in ((ref, ref_dtype), (alt, alt_dtype)):
            supported = capabilities(b).dtypes
            if dt not in supported and not (b is alt and dtype_why):
                raise BackendInitializationError(f"dtype {dt!r} is not supported",
                                                 hint=f"use one of {', '.join(supported)}", backend=b.name)
        emulated = emulated_precision(alt, model) if cfg.dtype == "auto" else None
        cfg = dataclasses.replace(cfg, dtype=alt_dtype, reference_dtype=ref_dtype,
                                  emulated_precision=None if emulated is None else emulated.name)
        produced = produced_checkpoints(alt, model) if cfg.enabled_checkpoints is None else None
        if produced is not None:  # an alternative with some checkpoints only: those are compared (and recorded)
            cfg = dataclasses.replace(cfg, enabled_checkpoints=tuple(produced))
        plan = ValidationPlan.resolve(cfg, model.num_layers, model.router_layers, model_checkpoints(model))  # once
        calibrator = None
        if cfg.calibrate or cfg.oracle:  # refuse a calibration that cannot run now, not mid-run (DF005)
            calibrator = calibration_backend(plan, alt_name, model, alt)

        inputs = _session_inputs(model, cfg)
        estimate = session_estimate(model, plan, ref, alt, calibrator, inputs, capture_budget(self.config))  # DF007 before anything is built
        if estimate is not None:
            check_memory(estimate, self.config, reference_dtype=ref_dtype, alternative_dtype=alt_dtype)
        sid = check_session_id(session_id) if session_id is not None else uuid.uuid4().hex
        from .validation.decode_stage import check_decode_plan

        check_decode_plan(cfg, inputs, model)  # a bad decode setting is refused before anything runs
        inputs_path = self._save_inputs(inputs, sid)

        tolerances = {
            "governing_dtype": plan.governing_dtype,
            "precision_thresholds": dict(cfg.precision_thresholds),
            "per_checkpoint": {str(k): plan.tolerance(k).to_dict() for k in plan.keys},
        }
        self.db.sessions.create(
            model_path_key(str(model.path)), reference_backend, alt_name, config=cfg.to_json(), session_id=sid,
            weights_digest=model.digest, tolerances=tolerances, seed=cfg.seed, inputs_ref=str(inputs_path),
            environment={**capture_environment(cfg.device),
                         **({"command": str(command)} if command else {})},
            reference_backend_info=_backend_info(ref, ref_dtype, cfg.reference_device, {"selected_because": ref_why}),
            alternative_backend_info=_backend_info(alt, alt_dtype, cfg.device,
                                                   {"requested": alternative_backend, "selected_because": why,
                                                    "options": json_safe(dict(cfg.alternative_options)),
                                                    **({"dtype_because": dtype_why} if dtype_why else {}),
                                                    **_quantized_modules(alt, cfg)}),
        )
        # what was built here is handed to run() in this process: one load, one plan, the inputs in
        # memory (the saved file is the session's record, read back only by a run elsewhere)
        self._prebuilt = Prebuilt(sid, model, inputs, plan, ref, alt, calibrator)
        return sid

    def _save_inputs(self, inputs: ModelInputs, session_id: str) -> Path:
        """Write the session's inputs beside the database; a full disk is DF007, nothing half-written is left."""
        path = session_file(self.inputs_dir, session_id, ".safetensors")
        try:
            self.inputs_dir.mkdir(parents=True, exist_ok=True)
            return inputs.save(path)
        except OSError as exc:
            path.unlink(missing_ok=True)
            full = no_space_error(exc, "save the session inputs", file=str(path))
            if full is not None:
                raise full from exc
            raise DatabaseError(f"cannot save the session inputs: {exc}", database=self.db.location) from exc

    def _session(self, session_id: str) -> JsonObject:
        row = self.db.sessions.get(session_id)
        if row is None:
            raise DatabaseError(f"no session {session_id!r} in {self.database_path}", session=session_id,
                                  hint="create it with create_session() or list sessions with session_report --list")
        return row

    def run(self, session_id: str, *, progress: Progress | None = None,
            layer_progress: LayerProgress | None = None) -> ValidationResult:
        """Run the session (status created -> running -> passed|failed, or error) and return the
        typed :class:`ValidationResult`. ``progress(stage, done, total)`` is called as stages finish,
        ``layer_progress(stage, layers done, layers)`` as a stage gets through the layers.

        Raises:
            The framework error that stopped it (a backend failing mid-run is BackendRuntimeError, DF005,
            naming the backend); any other exception is a bug of ours and propagates as it is. Either
            way the session is set to ``error`` with the message and keeps every row already written.
        """
        row = self._session(session_id)
        if row["status"] != "created":
            raise ValidationError(
                f"session {session_id} is {row['status']!r}; only a 'created' session can be executed",
                session=session_id, hint="create a new session to run the validation again",
            )
        session = DebugSession.from_dict(row)  # the session's fields, read by the stages
        built, self._prebuilt = self._prebuilt, None  # used once: a re-run (batch, resume) loads and builds anew
        if built is not None and built.session_id != session_id:
            built = None
        self.db.sessions.update_status(session_id, "running")
        try:
            # the configuration as create_session validated it in this process, else read back (once)
            config = built.plan.config if built is not None else SessionConfig.from_json(session.config)
            with artifact_root(self.session_artifact_dir(session_id)):
                return self._execute_bounded(session, config, built, progress or (lambda *_: None), layer_progress)
        except BaseException as exc:
            try:
                self.db.sessions.update_status(session_id, "error", failure_message(exc))
            except DebugFrameworkError:  # pragma: no cover - the database itself failed
                pass
            raise

    def _execute_bounded(self, session: DebugSession, config: SessionConfig, built: Prebuilt | None,
                         progress: Progress, layer_progress: LayerProgress | None = None) -> ValidationResult:
        """:meth:`_execute` under the resource settings: the session's owner lease kept alive by
        the heartbeat, ``max_session_duration``, and ``performance_monitoring``."""
        if not self.resources.performance_monitoring and config.performance_profiling_enabled:
            config = dataclasses.replace(config, performance_profiling_enabled=False)
            if built is not None:
                built = dataclasses.replace(built, plan=dataclasses.replace(built.plan, config=config))
        with holding(self.db, self.resources.heartbeat_interval), \
                session_deadline(self.resources.max_session_duration, session.session_id):
            return self._execute(session, config, built, progress, layer_progress)

    def _execute(self, session: DebugSession, config: SessionConfig, built: Prebuilt | None, progress: Progress,
                 layer_progress: LayerProgress | None = None) -> ValidationResult:
        """The loop over the stages: progress, timing and persisting rows live here alone. The
        stages that capture checkpoints run with the run's :class:`CaptureSink`: beyond
        ``capture_memory_budget`` bytes in memory, what they capture goes to a folder beside the
        tensor store as it is produced (removed when the run ends)."""
        ctx = RunContext(session=session, db=self.db, database_path=self.database_path, framework_config=self.config,
                         config=config, prebuilt=built)
        budget = capture_budget(self.config)
        sink = None if budget is None else CaptureSink(
            TensorStore.root_beside(self.database_path) / "spill" / f"{session.session_id}-{os.getpid()}", budget)
        try:
            return self._stages(ctx, session, progress, layer_progress, sink)
        finally:
            if sink is not None:
                ctx.captures.clear()  # the mapped files go before their folder
                sink.close()

    def _stages(self, ctx: RunContext, session: DebugSession, progress: Progress,
                layer_progress: LayerProgress | None, sink: CaptureSink | None) -> ValidationResult:
        stages = [stage for stage in self.stages if stage.runs_in(ctx.config)]
        prepared_recorded = False
        # each stage's seconds and peak resident memory, recorded with the session (the store stage
        # writes what the stages before it measured)
        stage_s: dict[str, float] = {}
        stage_peaks: dict[str, int] = {}
        memory: JsonObject = {"method": RssWatch.method, "stage_peak_rss_bytes": stage_peaks}
        ctx.performance.update(stage_s=stage_s, memory=memory)
        with RssWatch() as watch, ctx.rows_kept_on_failure():
            for done, stage in enumerate(stages, 1):
                check_deadline()  # max_session_duration: stop at a stage boundary
                if not stage.ready(ctx):
                    progress(stage.name, done, len(stages))
                    continue
                memory["peak_rss_bytes"] = watch.peak
                ctx.layer_progress = None if layer_progress is None else \
                    (lambda n, total, name=stage.name: layer_progress(name, n, total))
                with Timer() as t, capture_sink(sink if stage.captures else None):
                    if sink is not None:
                        sink.on_layer = ctx.layers_done if stage.captures else None
                    stage.run(ctx)
                if sink is not None and stage.captures:  # the captured checkpoints: in memory, on disk
                    memory["capture_bytes"] = {"in_memory": sink.resident, "on_disk": sink.spilled_bytes,
                                               "budget": sink.budget}
                stage_s[stage.name] = t.seconds
                give_back_freed()  # what the stage released: out of the resident set before the next
                stage_peaks[stage.name] = watch.take()
                if not prepared_recorded and getattr(ctx, "alternative", None) is not None:
                    prepared_recorded = _record_prepared_backends(ctx, session)
                if stage.timing_key:
                    ctx.performance[stage.timing_key] = t.seconds
                progress(stage.name, done, len(stages))
        if ctx.result is None:
            raise ConfigurationError("the validation's stages produced no result (no store stage ran)",
                                  session=session.session_id, hint="end custom stage lists with StoreStage()")
        return ctx.result

    def session_artifact_dir(self, session_id: str) -> Path | None:
        """Where a session's backends keep the files they produce (an ONNX engine's export and its
        log): ``<db dir>/<db name>_artifacts/<session id>/``, created by the first backend that
        writes there; ``None`` for an id that is not a plain name (such a session's backends use
        temporary directories they remove)."""
        try:
            return self.artifacts_dir / check_session_id(session_id)
        except ValidationError:
            return None

    # ---------------------------------------------------------------- reading back

    def get_session_results(self, session_id: str) -> JsonObject:
        """The stored session (status, provenance, summary) with every checkpoint row in model order."""
        row = self._session(session_id)
        rows = self.db.checkpoints.for_session(session_id)
        results = row.get("results") or {}
        return json_safe({
            "session_id": session_id,
            "status": row["status"],
            "error_message": row.get("error_message"),
            "verdict": results.get("verdict"),
            "first_divergence": results.get("first_divergence"),
            "summary": summarize_checkpoints(rows),
            "results": results,
            "checkpoints": rows,
            "session": row,
        })

    def get_performance_metrics(self, session_id: str) -> JsonObject:
        """Wall time per backend (and per layer where measured), peak memory when profiled."""
        row = self._session(session_id)
        results = row.get("results") or {}
        if row["status"] not in TERMINAL_STATUSES or "performance" not in results:
            raise ValidationError(f"session {session_id} has no performance metrics (status {row['status']!r})",
                                  session=session_id, hint="execute the session first")
        return dict(results["performance"])

    def list_sessions(self, **filters: Unpack[SessionFilter]) -> list[JsonObject]:
        """Stored sessions, newest first (filters as :meth:`~debug_framework.storage.sessions.SessionStore.list`)."""
        return self.db.sessions.list(**filters)

    def run_maintenance(self, *, dry_run: bool = False, older_than_days: float | None = None,
                        compact: bool = True) -> MaintenanceReport:
        """Sweep abandoned sessions, apply the retention policy, remove orphaned inputs and tensor
        files, and optimise the database (:func:`~debug_framework.services.maintenance.run_maintenance`
        with this engine's configuration)."""
        return run_maintenance(self.db, dry_run=dry_run, older_than_days=older_than_days, config=self.config,
                               compact=compact)

    def cleanup_session(self, session_id: str, *, delete_records: bool = False, force: bool = False) -> bool:
        """Release a finished session's resources: its saved inputs file is kept unless
        ``delete_records``, which also deletes the session's rows (results, recordings) from the
        database. A running session is refused unless ``force`` (one whose process was killed is
        set to ``error`` by the stale sweep: the next engine start with ``auto_cleanup``, or
        :meth:`run_maintenance`). Returns False when there is no such session."""
        row = self.db.sessions.get(session_id)
        if row is None:
            return False
        if row["status"] == "running" and not force:
            raise ValidationError(f"session {session_id} is running", session=session_id,
                                  hint="wait for it to finish")
        if delete_records:
            inputs_ref = row.get("inputs_ref")
            self.db.sessions.delete(session_id)
            if inputs_ref:  # only a file of ours: a plain name directly inside the inputs directory
                p = Path(inputs_ref)
                if p.parent == self.inputs_dir and p.suffix == ".safetensors" and not p.is_symlink() and p.is_file():
                    p.unlink()
            artifacts = self.session_artifact_dir(session_id)
            if artifacts is not None and artifacts.is_dir():
                shutil.rmtree(artifacts, ignore_errors=True)
        return True
