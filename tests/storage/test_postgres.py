"""PostgreSQL as the session database (docs/storage.md, "PostgreSQL"), against the throwaway server
of ``tests/conftest.py``: URLs through every entry point, the batch queue under concurrent
claimers, maintenance, read-only opens, the files under the artifact root, and the errors a user
can cause (unreachable server, wrong password, no artifact root): DF003 naming the host, never the
password, within a bounded time. The tests shared with SQLite are parametrised over ``any_db_path``
(test_concurrency, test_maintenance, test_session_diff, tests/engine/test_concurrency)."""

from __future__ import annotations

import pickle
import socket
import threading
import time

import pytest

from debug_framework.cli import session_report
from debug_framework.config import default_database_path, from_environment
from debug_framework.errors import DatabaseError
from debug_framework.models.batch_validation_job import BatchValidationJob
from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager
from debug_framework.services.maintenance import run_maintenance
from debug_framework.storage.postgres import redact_url

pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket closes


def test_an_unreachable_server_is_df003_naming_the_host_not_the_password(tmp_path):
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(DatabaseError) as info:
        DatabaseManager(f"postgresql://alice:s3cret-pw@127.0.0.1:{port}/sessions", artifact_root=tmp_path,
                        connect_timeout_s=2)
    assert time.monotonic() - t0 < 10
    err = info.value
    assert err.code == "DF003"
    assert f"127.0.0.1:{port}" in str(err) and "s3cret-pw" not in str(err) + repr(err.context)
    assert err.context["database"] == f"postgresql://alice@127.0.0.1:{port}/sessions"


def test_wrong_credentials_are_df003_without_the_password(pg_url, pg_server):
    bad = pg_url.replace(pg_server.password, "not-the-pw-42")
    with pytest.raises(DatabaseError) as info:
        DatabaseManager(bad)
    text = str(info.value) + repr(info.value.context) + (info.value.hint or "")
    assert info.value.code == "DF003" and f"127.0.0.1:{pg_server.port}" in text
    assert "password authentication failed" in text
    assert "not-the-pw-42" not in text and pg_server.password not in text


def test_a_server_database_needs_an_artifact_root(pg_url, monkeypatch):
    monkeypatch.delenv("PIE_DEBUG_ARTIFACT_ROOT")
    with pytest.raises(DatabaseError, match="artifact_root") as info:
        DatabaseManager(pg_url)
    assert "pie-test-secret" not in str(info.value) + repr(info.value.context)


def test_urls_pass_through_config_and_redaction():
    url = "postgresql://bob:pw@db.example:5433/team"
    assert default_database_path({"database_path": url}) == url  # not mangled into a Path
    assert from_environment({"PIE_DEBUG_DATABASE": url, "PIE_DEBUG_ARTIFACT_ROOT": "/mnt/shared"}) == {
        "database_path": url, "artifact_root": "/mnt/shared"}
    assert redact_url(url) == "postgresql://bob@db.example:5433/team"
    assert redact_url("postgres://h/x?password=pw") == "postgres://h/x"
    import debug_framework

    assert debug_framework._shown_database({"database_path": url}) == "postgresql://bob@db.example:5433/team"


def test_a_url_with_an_unreadable_port_is_df003_not_a_crash(tmp_path):
    from debug_framework.errors import DatabaseError
    from debug_framework.services.database_manager import DatabaseManager

    for url in ("postgresql://bob:s3cret@dbhost:54x2/debug", "postgresql://h1:5432,h2:5433/debug"):
        with pytest.raises(DatabaseError, match="host:port cannot be read") as info:
            DatabaseManager(url, artifact_root=str(tmp_path))
        assert "s3cret" not in str(info.value)
        assert "s3cret" not in redact_url(url)


def test_statements_are_translated_outside_quoted_text():
    from debug_framework.storage.postgres import _translate

    sql = "SELECT * FROM t WHERE a = ? AND b LIKE 'x%?' AND c IS ? AND d IS NOT ? AND e = 'it''s ?'"
    # psycopg reads every '%' of a statement, quoted or not: a LIKE pattern's '%' is doubled too
    assert _translate(sql) == ("SELECT * FROM t WHERE a = %s AND b LIKE 'x%%?' AND c IS NOT DISTINCT FROM %s"
                               " AND d IS DISTINCT FROM %s AND e = 'it''s ?'")
    assert _translate("CREATE TABLE t (n INTEGER, x REAL, s TEXT)") == \
        "CREATE TABLE t (n BIGINT, x DOUBLE PRECISION, s TEXT)"
    assert _translate("SELECT 5 % 2") == "SELECT 5 %% 2"


def test_a_new_server_database_is_created_at_the_current_version(pg_url, tmp_path):
    db = DatabaseManager(pg_url)
    assert db.schema_version() == SCHEMA_VERSION
    versions = [r["version"] for r in db.execute_query("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    types = {r["column_name"]: r["data_type"] for r in db.execute_query(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'sessions'")}
    assert types["heartbeat_at"] == "double precision" and types["seed"] == "bigint"  # as wide as SQLite's
    assert db.database_path == (tmp_path / "artifacts" / pg_url.rsplit("/", 1)[1]).resolve()
    assert "pie-test-secret" not in repr(db) and db.location in repr(db)
    assert DatabaseManager(pg_url).migrate_schema()  # a second open finds it current
    db.close()


def test_the_batch_queue_hands_each_item_to_exactly_one_claimer(any_db):
    any_db.create_batch_job([f"m{i}" for i in range(60)], job_id="q")
    got: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def claimer() -> None:
        start.wait()
        while (item := any_db.claim_batch_item("q")) is not None:
            assert item["status"] == "running"
            with lock:
                got.append(item["item_index"])

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(60))
    assert {i["status"] for i in any_db.get_batch_job("q")["items"]} == {"running"}


def test_a_batch_job_stores_no_password(pg_url):
    job = BatchValidationJob("j1", ["a", "b"], {"database_path": pg_url, "parallel_execution": False})
    stored = job.db.batches.get("j1")
    assert stored["config"]["database_path"] == redact_url(pg_url)
    assert "pie-test-secret" not in str(stored)
    assert str(job.db.target) == pg_url  # the workers still reach the server
    job.db.close()


def test_the_database_travels_to_another_process_by_its_settings(pg_url):
    db = DatabaseManager(pg_url)
    copy = pickle.loads(pickle.dumps(db))
    sid = copy.create_session("m", "python_reference", "pytorch")
    assert db.get_session(sid)["model_path"] == "m" and copy.database_path == db.database_path
    copy.close()
    db.close()


def test_read_only_opens_refuse_writes_and_reports_read_through_the_url(pg_url, capsys):
    db = DatabaseManager(pg_url)
    sid = db.create_session("/models/x", "python_reference", "pytorch")
    db.close()
    ro = DatabaseManager.open_read_only(pg_url)
    assert ro.get_session(sid)["model_path"] == "/models/x"
    with pytest.raises(DatabaseError, match="read-only"):
        ro.create_session("m", "python_reference", "pytorch")
    ro.close()
    assert session_report.main(["--database", pg_url, "--list", "--json"]) == 0
    assert sid in capsys.readouterr().out


def test_maintenance_analyzes_and_vacuums_the_server(pg_url):
    db = DatabaseManager(pg_url)
    for i in range(5):
        db.create_session(f"m{i}", "python_reference", "pytorch")
    assert run_maintenance(db, dry_run=True).statements == ["ANALYZE", "VACUUM"]
    report = run_maintenance(db)
    assert report.statements == ["ANALYZE", "VACUUM"] and report.database == db.location
    assert db.execute_query("SELECT COUNT(*) AS n FROM pg_stat_user_tables WHERE relname = 'sessions'"
                            " AND last_vacuum IS NOT NULL AND last_analyze IS NOT NULL")[0]["n"] == 1
    db.close()


def _hold_write_lock(url: str, seconds: float) -> threading.Thread:
    """Another client holds the writers' lock for ``seconds`` (as a long write transaction would)."""
    import psycopg

    from debug_framework.storage.postgres import WRITE_LOCK_KEY

    held = threading.Event()

    def hold() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
            held.set()
            time.sleep(seconds)
            conn.execute("COMMIT")

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    return t


def test_a_busy_server_is_waited_for_then_reported_clearly(pg_url):
    DatabaseManager(pg_url).close()  # the schema exists
    holder = _hold_write_lock(pg_url, 0.6)
    db = DatabaseManager(pg_url, busy_timeout_s=0.1, max_retry_s=20)
    sid = db.create_session("m", "python_reference", "pytorch")  # waits past several lock timeouts
    assert db.get_session(sid)["status"] == "created"
    holder.join()
    holder = _hold_write_lock(pg_url, 0.9)
    impatient = DatabaseManager(pg_url, busy_timeout_s=0.1, max_retry_s=0.4)
    with pytest.raises(DatabaseError, match="stayed locked") as info:
        impatient.create_session("m", "python_reference", "pytorch")
    assert info.value.code == "DF003"
    holder.join()
    impatient.close()
    db.close()


def test_a_cli_given_an_unreachable_server_exits_2_naming_the_host(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIE_DEBUG_ARTIFACT_ROOT", str(tmp_path))
    port = _closed_port()
    code = session_report.main(["--database", f"postgresql://u:hidden-pw@127.0.0.1:{port}/x", "--list"])
    err = capsys.readouterr().err
    assert code == 2 and "DF003" in err and f"127.0.0.1:{port}" in err and "hidden-pw" not in err


def test_plugin_compile_lists_the_registry_of_a_server_database(pg_url, capsys):
    from debug_framework.cli import plugin_compile

    assert plugin_compile.main(["--list", "--json", "--database", pg_url]) == 0
    capsys.readouterr()
    db = DatabaseManager(pg_url)
    assert db.schema_version() == SCHEMA_VERSION and db.execute_query("SELECT COUNT(*) AS n FROM plugins")
    db.close()


def test_a_connection_the_server_dropped_is_replaced(pg_url):
    db = DatabaseManager(pg_url)
    sid = db.create_session("m", "python_reference", "pytorch")
    pid = db.execute_query("SELECT pg_backend_pid() AS p")[0]["p"]
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(DatabaseError):  # the statement in flight fails, as DF003
        db.get_session(sid)
    assert db.get_session(sid)["model_path"] == "m"  # the next one reconnects
    db.close()


def test_leases_on_a_server_follow_the_servers_clock_not_the_sweepers(pg_url, monkeypatch):
    """A sweeper whose clock runs far ahead must not take a live lease of another host."""
    import time as _time

    from debug_framework.services.database_manager import DatabaseManager
    from debug_framework.storage import leases

    db = DatabaseManager(pg_url)
    db.create_session("m", "python_reference", "pytorch", session_id="elsewhere")
    db.update_session_status("elsewhere", "running")  # the lease: the server's now + 4 heartbeats
    db.execute_query("UPDATE sessions SET owner_host = ? WHERE session_id = ?", ("another-host", "elsewhere"))
    ahead = _time.time() + 86400.0
    monkeypatch.setattr(leases.time, "time", lambda: ahead)
    assert leases.sweep(db).sessions == []
    assert db.get_session("elsewhere")["status"] == "running"
    db.execute_query("UPDATE sessions SET lease_expires_at = lease_expires_at - 3600 WHERE session_id = ?",
                     ("elsewhere",))
    assert leases.sweep(db).sessions == ["elsewhere"]  # an expired lease by the server's clock still goes
    db.close()
