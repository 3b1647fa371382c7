"""``RayExecutor``: runs a batch job's items as Ray tasks, across a cluster (issue 18).

Chosen by ``config={"executor": "ray", "ray_address": ...}`` (:class:`BatchExecutor` hands the job
over); local processes stay the default. The driver (this process) alone owns the database:

1. it claims an item under its own owner lease (:mod:`debug_framework.storage.leases`, renewed by
   its heartbeat while the task runs), settles it from an existing session when a previous run
   finished it, and otherwise submits one Ray task for it (one GPU requested when the device is
   CUDA), at most ``max_concurrent_jobs`` at a time;
2. the task (:func:`validate_item`, on a worker) runs a :class:`ValidationEngine` on a private
   temporary SQLite database with the item's deterministic session id (``uuid5(job_id, i)``) and
   returns the session's rows (:func:`~debug_framework.storage.session_rows.export_session`), its
   recorded tensors and its inputs file as bytes;
3. the driver writes the tensors into its content-addressed store, then the rows in one
   transaction, then links the item, while it still holds the item's lease.

So resume, no duplicate and no loss hold as with local processes. A worker that dies (its process
or its node) is retried by Ray up to ``max_retries`` times (default 2), then the item fails with
that reason; cancelling the job stops handing out items and cancels the running tasks (their items
become ``cancelled``, run again on the next execute). Progress is polled from the database while
the job runs, as with the local executor.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import ConfigurationError, FrameworkInitializationError, ValidationError
from ..jsonio import JsonObject
from ..models.batch_validation_job import BatchValidationJob, ProgressCallback, item_session_id
from ..storage.leases import holding
from ..storage.session_rows import export_session, import_session
from ..storage.tensor_store import TensorStore
from ..storage.values import session_file
from .batch_executor import BatchExecutor, job_lock, settle_existing

if TYPE_CHECKING:
    from ..models.session_config import SessionConfig

__all__ = ["RayExecutor", "validate_item", "check_reachable", "DEFAULT_MAX_RETRIES"]

#: How often Ray runs an item again after the worker running it died.
DEFAULT_MAX_RETRIES = 2
_POLL_S = 0.25
_INPUTS_SUFFIX = ".safetensors"


def _import_ray() -> ModuleType:
    if importlib.util.find_spec("ray") is None:
        raise FrameworkInitializationError("the Ray executor needs the 'ray' package", hint="pip install "
                                           "'multi-backend-debug-framework[ray]', or use executor 'local'")
    return importlib.import_module("ray")


def _max_retries(job: BatchValidationJob) -> int:
    raw = job.config.get("max_retries", DEFAULT_MAX_RETRIES)
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"max_retries must be an integer >= 0, got {raw!r}") from exc
    if value < 0:
        raise ConfigurationError(f"max_retries must be an integer >= 0, got {value}")
    return value


def validate_item(model_path: str, session_id: str, framework_config: JsonObject, session_config: SessionConfig,
                  reference: str, alternative: str) -> JsonObject:
    """One item, on a Ray worker: validate into a private temporary SQLite database and return the
    session's rows, its tensors (``{content hash: bytes}``), its inputs file's bytes and the error
    (None when the validation ran; a numerical failure is a ``failed`` session, not an error)."""
    from .validation_engine import ValidationEngine, failure_message

    with tempfile.TemporaryDirectory(prefix="pie-debug-ray-") as tmp:
        db_path = Path(tmp) / "item.db"
        config = {**framework_config, "database_path": str(db_path)}
        engine = ValidationEngine(db_path, config=config)
        error = None
        try:
            engine.create_session(model_path, session_config, reference, alternative, session_id=session_id)
            engine.run(session_id)
        except Exception as exc:  # noqa: BLE001 - the item's failure goes back to the driver, recorded
            error = failure_message(exc)
        rows = export_session(engine.db, session_id) if engine.db.sessions.get(session_id) else {}
        store = TensorStore.beside_database(engine.database_path, tensor_recording_limit=None)
        tensors = {r["content_hash"]: store.read_bytes(r["content_hash"])
                   for r in rows.get("tensor_recordings", ()) if r.get("content_hash")}
        ref = (rows.get("sessions") or [{}])[0].get("inputs_ref")
        inputs = Path(ref).read_bytes() if ref and Path(ref).is_file() else None
        engine.db.close()
    return {"rows": rows, "tensors": tensors, "inputs": inputs, "error": error,
            "worker": f"{socket.gethostname()}:{os.getpid()}"}


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) address accepts a TCP connection within
    ``timeout_s`` (Ray itself waits minutes on an unreachable one); ``auto``/``local`` are Ray's.

    Raises:
        FrameworkInitializationError (DF001): nothing answers there.
    """
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise FrameworkInitializationError(f"cannot reach the Ray cluster at {address}: {exc}",
                                           hint="check ray_address, or that 'ray start --head' runs there") from exc


@contextlib.contextmanager
def _connected(ray: ModuleType, address: str | None) -> Iterator[None]:
    """Use the Ray connection this process has, else connect to ``address`` (None: start a local
    one) for the job's duration."""
    if ray.is_initialized():
        yield
        return
    if address:
        check_reachable(address)
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "a new local Ray instance"
        raise FrameworkInitializationError(f"cannot connect to the Ray cluster at {where}: {exc}",
                                           hint="check ray_address (ray://host:10001 or host:6379), or that "
                                                "'ray start --head' runs there") from exc
    try:
        yield
    finally:
        ray.shutdown()


def _write_once(path: Path, data: bytes) -> None:
    """Write ``data`` at ``path`` unless it is there (atomically: a temporary file renamed)."""
    if path.is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class RayExecutor:
    """Runs a job's unfinished items as Ray tasks; the driver ingests their results (see the module)."""

    def execute(self, job: BatchValidationJob, *, progress: ProgressCallback | None = None) -> list[JsonObject]:
        """Run every unfinished item of ``job`` on Ray and return ``job.results()``.

        Raises:
            ValidationError (DF005): another process is executing this job right now.
            FrameworkInitializationError (DF001): ray is not installed, or its cluster unreachable.
        """
        ray = _import_ray()
        retries = _max_retries(job)
        with job_lock(job), _connected(ray, job.config.get("ray_address")):
            BatchExecutor._reset_interrupted(job)
            job.db.batches.set_status(job.job_id, "running")
            done = threading.Event()
            follower = None
            if progress is not None or job.config.get("show_progress"):
                follower = threading.Thread(target=BatchExecutor._follow, daemon=True,
                                            args=(job, [], bool(job.config.get("show_progress")), progress, done))
                follower.start()
            try:
                _Drive(ray, job, retries).run()
            finally:
                done.set()
                if follower is not None:
                    follower.join()
            BatchExecutor._finish(job)
            return job.results()


class _Drive:
    """One pass of the driver over a job: claim, submit, ingest, until nothing is left or cancelled."""

    def __init__(self, ray: ModuleType, job: BatchValidationJob, retries: int) -> None:
        from .validation_engine import ValidationEngine

        self.ray, self.job, self.retries = ray, job, retries
        self.engine = ValidationEngine(str(job.db.target), config=job.framework_config)
        self.store = TensorStore.beside_database(self.engine.database_path, tensor_recording_limit=None)
        device = str(job.session_config.device or job.framework_config.get("device") or "cpu")
        self.task = ray.remote(validate_item).options(
            num_cpus=1, num_gpus=1 if device.startswith("cuda") else 0, max_retries=retries, retry_exceptions=False)
        self.in_flight: dict[object, int] = {}  # a Ray ObjectRef -> its item

    def run(self) -> None:
        job, db = self.job, self.engine.db
        with holding(db, self.engine.resources.heartbeat_interval):  # the leases of the items dispatched
            while True:
                if (db.batches.get(job.job_id) or {}).get("status") == "cancelled":
                    self._cancel_running()
                    return
                self._submit()
                if not self.in_flight:
                    return
                ready, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=_POLL_S)
                for ref in ready:
                    self._settle(ref, self.in_flight.pop(ref))

    def _submit(self) -> None:
        job, db = self.job, self.engine.db
        while len(self.in_flight) < job.max_concurrent_jobs:
            item = db.batches.claim_item(job.job_id)
            if item is None:
                return
            idx = int(item["item_index"])
            if settle_existing(self.engine, job.job_id, idx):
                continue
            ref = self.task.remote(item["model_path"], item_session_id(job.job_id, idx), job.framework_config,
                                   job.session_config, job.reference_backend, job.alternative_backend)
            self.in_flight[ref] = idx

    def _cancel_running(self) -> None:
        for ref, idx in self.in_flight.items():
            self.ray.cancel(ref, force=True)
            self.engine.db.batches.update_item(self.job.job_id, idx, status="cancelled", if_owned=True)
        self.in_flight.clear()

    def _settle(self, ref: object, idx: int) -> None:
        """Ingest a finished task's answer, or record why there is none."""
        batches = self.engine.db.batches
        try:
            answer = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            batches.update_item(self.job.job_id, idx, status="cancelled", if_owned=True)
            return
        except self.ray.exceptions.RayError as exc:
            lost = isinstance(exc, (self.ray.exceptions.WorkerCrashedError, self.ray.exceptions.NodeDiedError))
            why = (f"the Ray worker running it died {self.retries + 1} time(s)" if lost
                   else f"the Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            batches.update_item(self.job.job_id, idx, status="failed", error_message=why, if_owned=True)
            return
        self._ingest(idx, answer)

    def _ingest(self, idx: int, answer: JsonObject) -> None:
        sid = item_session_id(self.job.job_id, idx)
        rows = answer.get("rows") or {}
        session = (rows.get("sessions") or [None])[0]
        if session is not None:
            for content_hash, data in (answer.get("tensors") or {}).items():
                if hashlib.sha256(data).hexdigest() != content_hash:  # never store a file under a wrong name
                    raise ValidationError(f"a Ray worker returned a damaged tensor for session {sid}")
                _write_once(self.store.path_for(content_hash), data)
            if answer.get("inputs") is not None:
                path = session_file(self.engine.inputs_dir, sid, _INPUTS_SUFFIX)
                _write_once(path, answer["inputs"])
                session["inputs_ref"] = str(path)
            import_session(self.engine.db, sid, rows)
        error = answer.get("error") or (session["error_message"] if session and session["status"] == "error" else None)
        self.engine.db.batches.update_item(self.job.job_id, idx, status="failed" if error else "done",
                                           session_id=sid if session is not None else None,
                                           error_message=error, if_owned=True)
