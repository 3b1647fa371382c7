"""Issue 33, items 7 and 9: a malformed IPv6 server URL is DF003 (exit 2), not a crash; a DF003 raised
by the PostgreSQL driver carries a hint of its own, not SQLite's "check that the path is writable"."""

from __future__ import annotations

import pytest

from debug_framework.cli import session_report
from debug_framework.errors import DatabaseError
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.storage.postgres import redact_url

pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")

BAD_URLS = ["postgresql://bob:s3cret@[::1/debug", "postgresql://bob:s3cret@[not-an-address]:5432/debug",
            "postgres://bob:s3cret@[::1:5432/debug"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_ipv6_url_is_df003(url, tmp_path, capsys):
    with pytest.raises(DatabaseError, match="cannot be read") as info:
        DatabaseManager(url, artifact_root=str(tmp_path))
    assert "s3cret" not in str(info.value) and "s3cret" not in redact_url(url)
    assert session_report.main(["--list", "--database", url]) == 2
    err = capsys.readouterr().err
    assert "[DF003]" in err and "internal error" not in err and "s3cret" not in err


def test_a_dropped_connection_has_a_postgresql_hint(pg_url):
    import psycopg

    db = DatabaseManager(pg_url)
    sid = db.create_session("m", "python_reference", "pytorch")
    pid = db.execute_query("SELECT pg_backend_pid() AS p")[0]["p"]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(DatabaseError) as info:
        db.get_session(sid)
    assert "PostgreSQL server" in info.value.hint and "writable" not in info.value.hint
    db.close()
