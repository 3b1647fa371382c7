"""The spec's faces (``debug_framework.compat``), checked against the spec's own names:

* every class and method the API reference names is importable from the path it gives and takes the
  spec's parameters, in the spec's order (:data:`SPEC`, written from the API reference);
* every face's implementation lives in ``debug_framework.compat`` (:data:`FACES`), and nothing else
  in ``src/`` calls a face: the project's own code calls the direct API (stores, ``compare``,
  ``render_report``, ``execute_job``);
* the faces work, round-tripping through a real SQLite database.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from debug_framework import compat
from debug_framework.errors import ConfigurationError, ResourceExhaustedError, ValidationError

SRC = Path(__file__).resolve().parents[2] / "src"

#: The API reference's classes and functions: (module, class or None) -> {name: the spec's
#: parameters, in order}. A name must exist there and accept these parameters first, in this order
#: (extra parameters after them need defaults or are keyword-only); defaults are the project's.
SPEC: dict[tuple[str, str | None], dict[str, list[str]]] = {
    ("debug_framework", None): {
        "initialize_framework": ["config"],
        "get_framework_config": [],
        "detect_available_backends": [],
        "get_system_info": [],
        "create_validation_session": ["model_path", "reference_backend", "alternative_backend", "config"],
    },
    ("debug_framework.services.validation_engine", "ValidationEngine"): {
        "__init__": ["database_path"],
        "create_session": ["model_path", "config", "reference_backend", "alternative_backend"],
        "execute_validation": ["session_id"],
        "get_session_results": ["session_id"],
        "cleanup_session": ["session_id"],
        "get_performance_metrics": ["session_id"],  # the user guide's
    },
    ("debug_framework.services.database_manager", "DatabaseManager"): {
        "__init__": ["database_path"],
        "get_connection": [],
        "execute_query": ["query", "parameters"],
        "create_tables": [],
        "migrate_schema": [],
    },
    ("debug_framework.services.plugin_registry", "PluginRegistry"): {
        "register_plugin": ["plugin_definition"],
        "get_plugin": ["plugin_id"],
        "list_plugins": ["backend_type"],
        "compile_plugin": ["source_path", "backend_type", "output_path"],
    },
    ("debug_framework.services.compilation_engine", "CompilationEngine"): {
        "compile_metal_kernel": ["source_path", "output_path"],
        "compile_cuda_kernel": ["source_path", "output_path"],
        "validate_compilation": ["compiled_path", "backend_type"],
    },
    ("debug_framework.services.tensor_comparison_engine", "TensorComparisonEngine"): {
        "compare_tensors": ["reference_tensor", "alternative_tensor", "tolerance"],
        "analyze_differences": ["reference_tensor", "alternative_tensor"],
        "generate_comparison_report": ["comparison_results"],
    },
    ("debug_framework.models.debug_session", "DebugSession"): {
        "save": [],
        "load": ["session_id"],
        "update_status": ["status"],
        "add_checkpoint_result": ["checkpoint_name", "result"],
    },
    ("debug_framework.models.validation_checkpoint", "ValidationCheckpoint"): {},
    ("debug_framework.models.tensor_recording", "TensorRecording"): {},
    ("debug_framework.models.tensor_comparison", "TensorComparison"): {},
    ("debug_framework.models.validation_report", "ValidationReport"): {
        "generate_html_report": [],
        "export_to_json": [],
        "save_to_file": ["file_path", "format"],
    },
    ("debug_framework.models.batch_validation_job", "BatchValidationJob"): {
        "execute": [],
        "get_progress": [],
        "cancel": [],
    },
    ("debug_framework.integrations.metal_backend", "MetalBackend"): {
        "__init__": ["metal_path"],
        "initialize": [],
        "execute_model": ["model_path", "input_data"],
        "cleanup": [],
    },
    ("debug_framework.integrations.l4ma_integration", "L4MAIntegration"): {
        "create_validation_session": ["model_path", "pie_config_path"],
        "execute_validation": ["session_id"],
        "get_model_metadata": ["model_path"],
    },
}

#: The faces: spec names that only present the spec's shape over the direct API. Their
#: implementation is in debug_framework.compat, whatever path the spec imports them from.
FACES: dict[tuple[str, str], tuple[str, ...]] = {
    ("debug_framework.services.database_manager", "DatabaseManager"): (
        "create_session", "update_session", "update_session_status", "get_session", "list_sessions",
        "delete_session", "add_checkpoint_result", "add_checkpoint_results", "get_checkpoint_results",
        "add_tensor_recording", "get_tensor_recordings", "get_tensor_recording", "referenced_content_hashes",
        "add_tensor_comparison", "get_tensor_comparisons", "create_batch_job", "get_batch_job",
        "update_batch_job_status", "update_batch_item", "claim_batch_item"),
    ("debug_framework.services.tensor_comparison_engine", "TensorComparisonEngine"): (
        "compare_tensors", "analyze_differences", "generate_comparison_report"),
    ("debug_framework.models.debug_session", "DebugSession"): (
        "save", "load", "update_status", "add_checkpoint_result", "checkpoint_results"),
    ("debug_framework.models.validation_report", "ValidationReport"): (
        "generate_html_report", "export_to_json", "save_to_file"),
    ("debug_framework.models.batch_validation_job", "BatchValidationJob"): ("execute", "get_progress", "cancel"),
    ("debug_framework.services.validation_engine", "ValidationEngine"): ("execute_validation",),
    ("debug_framework.services.compilation_engine", "CompilationEngine"): (
        "compile_metal_kernel", "compile_cuda_kernel", "compile_cpp_kernel", "compile_triton_kernel",
        "validate_compilation"),
}

#: Names only faces have: a call of one of them in src/ is a call of a face.
FACE_ONLY_NAMES = frozenset(
    {n for (_, cls), names in FACES.items() for n in names if cls in ("DatabaseManager", "TensorComparisonEngine")}
    | {"generate_html_report", "export_to_json", "save_to_file", "get_progress", "checkpoint_results",
       "add_checkpoint_result", "compile_metal_kernel", "compile_cuda_kernel", "compile_cpp_kernel",
       "compile_triton_kernel", "validate_compilation", "execute_validation"}
) - {"create_session", "list_sessions", "referenced_content_hashes"}  # also the engine's and the stores' own names

#: Files allowed to call faces for now (none: every module calls the direct API).
PENDING: set[str] = set()

#: Where a face may be named: the faces themselves and the spec's import paths.
FACE_MODULES = {"debug_framework/compat.py", "debug_framework/services/database_manager.py",
                "debug_framework/services/tensor_comparison_engine.py"}


def _resolve(module: str, cls: str | None):
    mod = importlib.import_module(module)
    return mod if cls is None else getattr(mod, cls)


def _spec_params(fn) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    return params[1:] if params and params[0].name in ("self", "cls") else params


@pytest.mark.parametrize("where,name,spec_params", [
    pytest.param(where, name, params, id=f"{where[1] or where[0]}.{name}")
    for where, names in SPEC.items() for name, params in names.items()
] + [pytest.param(where, None, [], id=f"{where[1]}") for where, names in SPEC.items() if not names])
def test_every_spec_name_is_where_the_spec_says_with_its_parameters(where, name, spec_params):
    owner = _resolve(*where)
    if name is None:
        assert inspect.isclass(owner)
        return
    fn = getattr(owner, name)
    params = _spec_params(fn)
    got = [p.name for p in params[: len(spec_params)]]
    assert got == spec_params, f"{where}.{name}: the spec's parameters {spec_params}, here {got}"
    for p in params[len(spec_params):]:
        assert p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) or p.default is not p.empty, \
            f"{where}.{name}: extra parameter {p.name} without a default"
    assert (fn.__doc__ or "").strip() or name == "__init__", f"{where}.{name} has no docstring"


@pytest.mark.parametrize("where,names", list(FACES.items()), ids=[c for _, c in FACES])
def test_every_face_is_implemented_in_the_compat_module(where, names):
    owner = _resolve(*where)
    for name in names:
        fn = inspect.getattr_static(owner, name)
        fn = getattr(fn, "__func__", fn)  # classmethod
        assert fn.__module__ == "debug_framework.compat", f"{where[1]}.{name} is defined in {fn.__module__}"
    if where[1] in ("DatabaseManager", "TensorComparisonEngine"):
        assert owner is getattr(compat, where[1])  # the spec's path re-exports compat's class


def _face_calls(source: str, where: str) -> list[str]:
    """Calls of a face (and imports of a face class) in one source file (``where`` names it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, recv = node.func.attr, node.func.value
            db_receiver = (isinstance(recv, ast.Attribute) and recv.attr == "db") or (
                isinstance(recv, ast.Name) and recv.id == "db")
            store_receiver = (isinstance(recv, ast.Attribute) and recv.attr == "sessions") or (
                isinstance(recv, ast.Name) and recv.id == "sessions")
            if (attr in FACE_ONLY_NAMES or (attr in ("create_session", "list_sessions") and db_receiver)
                    or (attr == "update_status" and not store_receiver)):
                found.append(f"{where}:{node.lineno} {ast.unparse(node.func)}()")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names
                      if a.name in ("DatabaseManager", "TensorComparisonEngine")]
    return found


def test_the_project_calls_the_direct_api_not_the_faces():
    files = [p for p in SRC.rglob("*.py") if str(p.relative_to(SRC)) not in FACE_MODULES | PENDING]
    calls = [c for p in sorted(files) for c in _face_calls(p.read_text(), str(p.relative_to(SRC)))]
    assert not calls, "call the direct API (see debug_framework/compat.py's table) instead of:\n" + "\n".join(calls)


def test_the_scan_sees_face_calls():
    source = ("from debug_framework.services.database_manager import DatabaseManager\n"
              "engine.db.get_session(sid)\nreport.save_to_file(p)\nsession.update_status('running')\n"
              "db.sessions.update_status(sid, 'running')\nengine.create_session(m)\ndb.list_sessions()\n")
    got = [c.split(" ", 1)[1] for c in _face_calls(source, "example.py")]
    assert got == ["imports DatabaseManager", "engine.db.get_session()", "report.save_to_file()",
                   "session.update_status()", "db.list_sessions()"]


# ----------------------------------------------------------------------------- the faces work


@pytest.fixture
def db(tmp_path):
    from debug_framework.services.database_manager import DatabaseManager

    database = DatabaseManager(tmp_path / "debug.db")
    yield database
    database.close()


def _result(checkpoint, layer, passed, err):
    return {"checkpoint": checkpoint, "layer": layer, "passed": passed, "max_abs_error": err, "max_rel_error": err}


def test_database_manager_round_trips_through_sqlite(db):
    from debug_framework.storage.database import Database

    assert isinstance(db, Database) and db.create_tables() and db.migrate_schema()
    assert db.get_connection() is not None
    sid = db.create_session("/m", "python_reference", "pytorch", config={"isolate": False})
    assert db.get_session(sid)["status"] == "created"
    assert db.update_session_status(sid, "running") == "created"
    db.update_session(sid, results={"verdict": "passed"})
    assert db.add_checkpoint_results(sid, [_result("post_embedding", None, True, 0.0),
                                           _result("post_mlp", 0, True, 1e-7)]) == 2
    db.add_checkpoint_result(sid, _result("post_mlp", 0, False, 0.5))  # same (checkpoint, layer): replaced
    rows = db.get_checkpoint_results(sid)
    assert [(r["checkpoint"], r["layer"], r["passed"]) for r in rows] == [("post_embedding", None, True),
                                                                          ("post_mlp", 0, False)]
    assert [s["session_id"] for s in db.list_sessions(status="running")] == [sid]
    assert db.execute_query("SELECT status FROM sessions WHERE session_id = ?", (sid,))[0]["status"] == "running"
    jid = db.create_batch_job(["/a", "/b"], {"x": 1}, job_id="job")
    assert db.claim_batch_item(jid)["item_index"] == 0
    db.update_batch_item(jid, 0, status="done", session_id=sid)
    db.update_batch_job_status(jid, "running")
    job = db.get_batch_job(jid)
    assert job["status"] == "running" and [i["status"] for i in job["items"]] == ["done", "pending"]
    assert db.get_tensor_recordings(sid) == [] and db.get_tensor_comparisons(sid) == []
    assert db.delete_session(sid) and db.get_session(sid) is None


def test_debug_session_verbs_round_trip(db, tmp_path):
    from debug_framework.models.debug_session import DebugSession

    s = DebugSession(model_path="/m", reference_backend="python_reference", alternative_backend="pytorch",
                     config={"seed": 1}, db=db)
    assert s.save() and s.status == "created" and s.updated_at is not None
    assert s.update_status("running") and s.status == "running" and s.started_at is not None
    assert s.add_checkpoint_result("post_mlp", _result("post_mlp", 2, True, 1e-6))
    s.results = {"verdict": "passed"}
    s.status = "passed"
    assert s.save() and s.finished_at is not None
    again = DebugSession.load(s.session_id, db=tmp_path / "debug.db")  # a path works too
    assert again is not None and again.status == "passed" and again.results == {"verdict": "passed"}
    assert [(r["checkpoint"], r["layer"]) for r in again.checkpoint_results()] == [("post_mlp", 2)]
    assert DebugSession.load("nope", db=db) is None
    with pytest.raises(ValidationError, match="cannot go from 'passed' to 'running'"):
        again.update_status("running")


@pytest.fixture
def report(db):
    from debug_framework.models.validation_report import ValidationReport

    sid = db.sessions.create("/m", "python_reference", "pytorch")
    db.checkpoints.add_many(sid, [_result("post_embedding", None, True, 0.0), _result("post_mlp", 0, False, 0.25)])
    return ValidationReport.from_session(sid, db)


def test_validation_report_verbs_render_and_write(report, tmp_path):
    from debug_framework.reports import render_report

    doc = json.loads(report.export_to_json())
    assert doc["session_id"] == report.session_id and doc["summary_statistics"]["failed"] == 1
    html = report.generate_html_report()
    assert html == render_report(report, "html") and report.session_id in html
    for fmt in ("json", "html", "csv", "junit"):
        out = tmp_path / "out" / f"r.{fmt}"
        assert report.save_to_file(out, fmt)
        assert out.read_text() == render_report(report, fmt)
    seen = []
    report.save_to_file(tmp_path / "x.json", renderer=lambda r, fmt, **kw: seen.append(fmt) or "{}")
    assert seen == ["json"] and (tmp_path / "x.json").read_text() == "{}"
    with pytest.raises(ConfigurationError, match="unknown report format 'pdf'"):
        report.save_to_file(tmp_path / "r.pdf", "pdf")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigurationError, match="cannot write the report") as e:  # the path is unusable
        report.save_to_file(blocker / "r.json")
    assert e.value.code == "DF005" and e.value.context["file"] == str(blocker / "r.json")


def test_report_write_with_no_room_is_df007(report, tmp_path, monkeypatch):
    import errno
    import os

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(ResourceExhaustedError, match="no space left"):
        report.save_to_file(tmp_path / "r.json")


def test_batch_job_verbs_over_the_batch_store(tmp_path):
    from debug_framework.models.batch_validation_job import BatchValidationJob
    from debug_framework.services.executors import execute_job

    job = BatchValidationJob("j1", ["/a", "/b", "/c"], {"database_path": str(tmp_path / "b.db")})
    try:
        item = job.db.batches.claim_item("j1")
        job.db.batches.update_item("j1", item["item_index"], status="done")
        prog = job.get_progress()
        assert prog == job.db.batches.progress("j1")
        assert (prog["total"], prog["done"], prog["pending"], prog["finished"]) == (3, 1, 2, 1)
        assert prog["percent"] == pytest.approx(100 / 3)
        assert job.cancel()
        assert [i["status"] for i in job.items()] == ["done", "cancelled", "cancelled"]
        assert job.get_progress()["status"] == "cancelled"

        class Recording:
            def execute(self, j, *, progress=None):
                return [{"ran": j.job_id}]

        assert job.execute(executor=Recording()) == [{"ran": "j1"}]
        runner = compat.BATCH_EXECUTOR.get()
        assert runner is execute_job  # the composition root's default: the job's configured executor
    finally:
        job.db.close()


def test_tensor_comparison_engine_speaks_dicts_over_compare():
    from debug_framework.comparison import compare

    engine = compat.TensorComparisonEngine()
    a = np.linspace(-1, 1, 64, dtype=np.float32)
    close = engine.compare_tensors(a, a + 1e-7, {"rtol": 1e-4, "atol": 1e-5, "unknown": 3})
    far = engine.compare_tensors(a, a + 0.5, {"rtol": 1e-4, "atol": 1e-5})
    assert close["match_status"] is True and far["match_status"] is False
    assert far["max_absolute_error"] == pytest.approx(compare(a, a + 0.5).max_abs_error)
    assert far["tolerance_config"]["atol"] == 1e-5
    analysis = engine.analyze_differences(a, a + 0.5)
    assert analysis["distribution"]["max_abs_error"] == pytest.approx(0.5) and analysis["worst_elements"]
    summary = engine.generate_comparison_report([{**close, "name": "x"}, {**far, "name": "y"}])
    assert (summary["total"], summary["passed"], summary["failed_names"]) == (2, 1, ["y"])


def test_compilation_faces_call_build_source_and_validation_report(tmp_path):
    from debug_framework.services.compilation_engine import CompilationEngine

    calls = []

    class Probe(CompilationEngine):
        def build_source(self, source_path, backend_type, output_path=None):
            calls.append((str(source_path), backend_type, str(output_path)))

        def validation_report(self, compiled_path, backend_type):
            return {"passed": backend_type == "cpp"}

    engine = Probe(cache_dir=tmp_path)
    assert engine.compile_cuda_kernel("k.cu", "k.so") and engine.compile_metal_kernel("g.metal", "g.metallib")
    assert calls == [("k.cu", "cuda", "k.so"), ("g.metal", "metal", "g.metallib")]
    assert engine.validate_compilation("k.so", "cpp") is True and engine.validate_compilation("k.so", "cuda") is False
